import { Option } from 'commander';
import { signDevelopmentToken } from '../../auth/dev-token.js';
import { developmentSecret } from '../../auth/jwt-keys.js';
import { OPERATOR_ROLES, type OperatorRole } from '../../auth/principal.js';
import { ConfigError, loadConfig, type Config } from '../../config/config.js';
import { parseSecondsOrDuration } from './format.js';
import { command } from './help.js';
import { UsageError } from './session.js';

export interface TokenRequest {
  kind?: string | undefined;
  tenant?: string | undefined;
  sub?: string | undefined;
  role?: string | undefined;
  family?: string | undefined;
  scope?: string | undefined;
  ttlSeconds: number;
}

/**
 * A development token signed with TOOLGATE_JWT_SECRET, or the secret `npm start` keeps in
 * TOOLGATE_DATA_DIR. What is wrong with the request is thrown as a `UsageError`.
 */
export async function mintDevelopmentToken(request: TokenRequest, config: Config): Promise<string> {
  if (request.kind !== 'agent' && request.kind !== 'operator') throw new UsageError('--kind must be agent or operator');
  if (!request.tenant) throw new UsageError('--tenant is required');
  if (request.kind === 'agent' && request.role !== undefined) throw new UsageError('--role is for operator tokens');
  if (request.kind === 'operator' && request.family !== undefined) throw new UsageError('--family is for agent tokens');
  if (request.role !== undefined && !OPERATOR_ROLES.includes(request.role as OperatorRole))
    throw new UsageError(`--role must be one of ${OPERATOR_ROLES.join(', ')}`);
  if (!Number.isInteger(request.ttlSeconds) || request.ttlSeconds <= 0)
    throw new UsageError('--ttl must be a positive number of seconds');
  if (config.jwt.publicKey || config.jwt.jwksFile) {
    throw new UsageError(
      'the gateway verifies with a public key; tokens come from your identity provider, not this tool',
    );
  }
  const secret = config.jwt.secret ?? (await developmentSecret(config.dataDir, false));
  if (!secret)
    throw new UsageError(
      `no development secret: set TOOLGATE_JWT_SECRET, or run \`npm start\` once to create one in ${config.dataDir}`,
    );
  return signDevelopmentToken(secret, {
    kind: request.kind,
    sub: request.sub ?? (request.kind === 'agent' ? 'dev.agent' : 'dev.operator'),
    tenantId: request.tenant,
    ttlSeconds: request.ttlSeconds,
    ...(request.role ? { role: request.role as OperatorRole } : {}),
    ...(request.family ? { family: request.family } : {}),
    ...(request.scope ? { scope: request.scope } : {}),
    ...(config.jwt.issuer ? { issuer: config.jwt.issuer } : {}),
    ...(config.jwt.audience ? { audience: config.jwt.audience } : {}),
  });
}

export function tokenCommand() {
  return command(
    'token',
    'sign a development token (TOOLGATE_JWT_SECRET, or the secret `npm start` keeps in TOOLGATE_DATA_DIR)',
    'export TOOLGATE_TOKEN=$(toolgate token --kind operator --role platform-operator --tenant t1)',
    'toolgate token --kind agent --sub a1 --tenant t1 --ttl 12h',
  )
    .addOption(new Option('--kind <kind>').choices(['agent', 'operator']).makeOptionMandatory())
    .requiredOption('--tenant <id>')
    .option('--sub <id>', 'principal id (default: dev.operator / dev.agent)')
    .addOption(new Option('--role <role>', 'operators (default tenant-operator)').choices([...OPERATOR_ROLES]))
    .option('--family <name>', 'agents: agent family')
    .option('--scope <scopes>', 'space-separated scopes')
    .addOption(
      new Option('--ttl <duration>', 'lifetime: seconds, or a duration such as 15m, 12h, 7d')
        .argParser(parseSecondsOrDuration)
        .default(3600, '1h'),
    )
    .action(async (options: Omit<TokenRequest, 'ttlSeconds'> & { ttl: number }) => {
      let config: Config;
      try {
        config = loadConfig();
      } catch (error) {
        if (error instanceof ConfigError) throw new UsageError(error.message);
        throw error;
      }
      const { ttl, ...rest } = options;
      process.stdout.write(`${await mintDevelopmentToken({ ...rest, ttlSeconds: ttl }, config)}\n`);
    });
}
