import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { signDevelopmentToken } from '../auth/dev-token.js';
import { developmentSecret } from '../auth/jwt-keys.js';
import { loadClientTarget } from '../config/config.js';
import { command, type Command } from './command.js';
import { readCatalogFile, seedCatalog } from './seed-catalog.js';

const defaultFile = fileURLToPath(new URL('../../examples/scf-catalog.json', import.meta.url));

const usage = `usage: npm run seed:example -- [options]
  --url URL            the gateway (default TOOLGATE_URL, else http://HOST:PORT of the local config)
  --token JWT          a platform-operator token (default TOOLGATE_TOKEN, else a development token
                       signed with TOOLGATE_JWT_SECRET or the secret \`npm start\` keeps in TOOLGATE_DATA_DIR)
  --file PATH          the catalog (default examples/scf-catalog.json)
  --backend-base URL   give tools without a backend <URL>/<tool id> as their backend
Registers every tool through POST /tools; running it again changes nothing.`;

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
    if (!secret || config.jwt.publicKey || config.jwt.jwksFile) fail('no token: pass --token or set TOOLGATE_TOKEN to a platform-operator token');
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
  const catalog = await readCatalogFile(values.file);
  const outcomes = await seedCatalog(
    catalog,
    async (body) => {
      const response = await fetch(`${baseUrl}/tools`, {
        method: 'POST',
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        body: JSON.stringify(body),
      }).catch((error: unknown) => {
        throw new Error(`the gateway at ${baseUrl} did not answer (${reasonOf(error)}): start it with \`npm start\`, or pass --url or set TOOLGATE_URL`);
      });
      return { status: response.status, body: await response.json().catch(() => undefined) };
    },
    values['backend-base'] ? { backendBase: values['backend-base'] } : {},
  );
  for (const outcome of outcomes) {
    const line = `${outcome.result.padEnd(10)} ${outcome.id}@${outcome.version}`;
    process.stdout.write(outcome.result === 'failed' ? `${line}  HTTP ${outcome.status} ${JSON.stringify(outcome.error)}\n` : `${line}\n`);
  }
  const failed = outcomes.filter((o) => o.result === 'failed').length;
  process.stdout.write(`${outcomes.length - failed} of ${outcomes.length} tools in place at ${baseUrl}\n`);
  if (failed > 0) process.exit(1);
}

/** fetch rejects with "fetch failed" and puts what happened (ECONNREFUSED, ENOTFOUND…) in `cause`. */
function reasonOf(error: unknown): string {
  const cause = error instanceof Error ? error.cause : undefined;
  if (cause instanceof Error) return cause.message;
  return error instanceof Error ? error.message : String(error);
}

main().catch((error: unknown) => {
  process.stderr.write(`seed:example: ${error instanceof Error ? error.message : String(error)}\n`);
  process.exit(1);
});
