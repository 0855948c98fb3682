import { parseArgs } from 'node:util';
import { developmentSecret } from '../auth/jwt-keys.js';
import { signDevelopmentToken } from '../auth/dev-token.js';
import { OPERATOR_ROLES, type OperatorRole } from '../auth/principal.js';
import { command, type Command } from './command.js';

const usage = `usage: npm run token -- --kind agent|operator --tenant TENANT [options]
  --sub ID          principal id (default: dev.operator / dev.agent)
  --role ROLE       operators: platform-operator | tenant-operator (default tenant-operator)
  --family NAME     agents: agent family
  --scope "A B"     space-separated scopes
  --ttl SECONDS     lifetime (default 3600)
Signs with TOOLGATE_JWT_SECRET, or the development secret that \`npm start\` keeps in TOOLGATE_DATA_DIR.`;

const cli = command('token', usage);
// Annotated, so that TypeScript narrows after a call that never returns.
const fail: Command['fail'] = cli.fail;

async function main(): Promise<void> {
  const config = cli.config();
  let parsed;
  try {
    parsed = parseArgs({
      options: {
        kind: { type: 'string' },
        tenant: { type: 'string' },
        sub: { type: 'string' },
        role: { type: 'string' },
        family: { type: 'string' },
        scope: { type: 'string' },
        ttl: { type: 'string', default: '3600' },
        help: { type: 'boolean' },
      },
      strict: true,
    });
  } catch (error) {
    fail(`${(error as Error).message}\n${usage}`);
  }
  const { values } = parsed;
  if (values.help) {
    process.stdout.write(`${usage}\n`);
    return;
  }
  if (values.kind !== 'agent' && values.kind !== 'operator') fail('--kind must be agent or operator');
  if (!values.tenant) fail('--tenant is required');
  if (values.kind === 'agent' && values.role !== undefined) fail('--role is for operator tokens');
  if (values.kind === 'operator' && values.family !== undefined) fail('--family is for agent tokens');
  if (values.role !== undefined && !OPERATOR_ROLES.includes(values.role as OperatorRole)) {
    fail(`--role must be one of ${OPERATOR_ROLES.join(', ')}`);
  }
  const ttlSeconds = Number(values.ttl);
  if (!Number.isInteger(ttlSeconds) || ttlSeconds <= 0) fail('--ttl must be a positive number of seconds');
  if (config.jwt.publicKey || config.jwt.jwksFile) {
    fail('the gateway verifies with a public key; tokens come from your identity provider, not this tool');
  }
  const secret = config.jwt.secret ?? (await developmentSecret(config.dataDir, false));
  if (!secret) {
    fail(`no development secret: set TOOLGATE_JWT_SECRET, or run \`npm start\` once to create one in ${config.dataDir}`);
  }
  const token = signDevelopmentToken(secret, {
    kind: values.kind,
    sub: values.sub ?? (values.kind === 'agent' ? 'dev.agent' : 'dev.operator'),
    tenantId: values.tenant,
    ttlSeconds,
    ...(values.role ? { role: values.role as OperatorRole } : {}),
    ...(values.family ? { family: values.family } : {}),
    ...(values.scope ? { scope: values.scope } : {}),
    ...(config.jwt.issuer ? { issuer: config.jwt.issuer } : {}),
    ...(config.jwt.audience ? { audience: config.jwt.audience } : {}),
  });
  process.stdout.write(`${token}\n`);
}

void main();
