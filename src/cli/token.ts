import { parseArgs } from 'node:util';
import { command, type Command } from './command.js';
import { UsageError } from './toolgate/session.js';
import { mintDevelopmentToken } from './toolgate/token.js';

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
  try {
    const token = await mintDevelopmentToken({ ...values, ttlSeconds: Number(values.ttl) }, config);
    process.stdout.write(`${token}\n`);
  } catch (error) {
    if (error instanceof UsageError) fail(error.message);
    throw error;
  }
}

void main();
