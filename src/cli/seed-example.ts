import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { signDevelopmentToken } from '../auth/dev-token.js';
import { developmentSecret } from '../auth/jwt-keys.js';
import { loadClientTarget } from '../config/config.js';
import { command, type Command } from './command.js';
import { runToolgate } from './toolgate/run.js';

const defaultFile = fileURLToPath(new URL('../../examples/scf-catalog.json', import.meta.url));

const usage = `usage: npm run seed:example -- [options]
  --url URL            the gateway (default TOOLGATE_URL, else http://HOST:PORT of the local config)
  --token JWT          a platform-operator token (default TOOLGATE_TOKEN, else a development token
                       signed with TOOLGATE_JWT_SECRET or the secret \`npm start\` keeps in TOOLGATE_DATA_DIR)
  --file PATH          the catalog (default examples/scf-catalog.json)
  --backend-base URL   give tools without a backend <URL>/<tool id> as their backend
Registers every tool through POST /tools (\`toolgate tools register\` with these defaults); running it
again changes nothing.`;

const cli = command('seed:example', usage);
// Annotated, so that TypeScript narrows after a call that never returns.
const fail: Command['fail'] = cli.fail;

async function main(): Promise<void> {
  const config = cli.config();
  const { values } = parseArgs({
    options: {
      url: { type: 'string' },
      token: { type: 'string' },
      file: { type: 'string', default: defaultFile },
      'backend-base': { type: 'string' },
      help: { type: 'boolean' },
    },
    strict: true,
  });
  if (values.help) {
    process.stdout.write(`${usage}\n`);
    return;
  }
  const target = loadClientTarget();
  const host = config.host.includes(':') ? `[${config.host}]` : config.host;
  const baseUrl = (values.url ?? target.url ?? `http://${host}:${config.port}`).replace(/\/+$/, '');
  let token = values.token ?? target.token;
  if (!token) {
    const secret = config.jwt.secret ?? (await developmentSecret(config.dataDir, false));
    if (!secret || config.jwt.publicKey || config.jwt.jwksFile)
      fail('no token: pass --token or set TOOLGATE_TOKEN to a platform-operator token');
    token = signDevelopmentToken(secret, {
      kind: 'operator',
      role: 'platform-operator',
      sub: 'seed.example',
      tenantId: 'platform',
      ttlSeconds: 300,
      ...(config.jwt.issuer ? { issuer: config.jwt.issuer } : {}),
      ...(config.jwt.audience ? { audience: config.jwt.audience } : {}),
    });
  }
  // The registering itself is `toolgate tools register`; this only picks the defaults for a local try.
  const argv = ['node', 'toolgate', 'tools', 'register', values.file, '--url', baseUrl, '--token', token];
  if (values['backend-base']) argv.push('--backend-base', values['backend-base']);
  process.exitCode = await runToolgate(argv);
}

main().catch((error: unknown) => {
  process.stderr.write(`seed:example: ${error instanceof Error ? error.message : String(error)}\n`);
  process.exit(1);
});
