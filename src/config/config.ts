import { createPrivateKey, createPublicKey, type KeyObject } from 'node:crypto';
import ipaddr from 'ipaddr.js';
import { z } from 'zod';
import { telemetryEnvironment, telemetrySettingsOf, type TelemetrySettings } from './telemetry-config.js';

export type { TelemetrySettings } from './telemetry-config.js';

/** Everything toolgate reads from its environment, parsed once at start-up. */
export interface Config {
  port: number;
  host: string;
  databaseUrl: string | undefined;
  dataDir: string;
  production: boolean;
  jwt: {
    secret: string | undefined;
    publicKey: string | undefined;
    jwksFile: string | undefined;
    issuer: string | undefined;
    audience: string | undefined;
    /** The longest a token may live: `exp` minus `iat`, or minus now without one (`TOOLGATE_JWT_MAX_TTL_SECONDS`). */
    maxTtlSeconds: number;
  };
  egressAllowCidrs: string[];
  logLevel: string;
  bodyLimitBytes: number;
  maxPlanSteps: number;
  databasePoolSize: number;
  shutdownTimeoutMs: number;
  /** How often each replica checks the registry revision besides LISTEN/NOTIFY (`TOOLGATE_REGISTRY_REFRESH_MS`). */
  registryRefreshMs: number;
  /** The `TOOLGATE_SECRET_*` variables, snapshot at start-up: the only ones backend headers may name. Never log. */
  secrets: Readonly<Record<string, string>>;
  /** An open budget reservation older than this is presumed abandoned and released. */
  budgetReservationTtlSeconds: number;
  killSwitches: {
    /** How often each replica compares its snapshot's version with the database. */
    pollIntervalMs: number;
    /** A snapshot not confirmed for this long fails closed (at most 5 s: docs/design/replica-snapshots.md). */
    maxStalenessMs: number;
  };
  grants: {
    /** How often the expiry sweeper looks for grants that lapsed. */
    expirySweepIntervalMs: number;
  };
  /**
   * How long a replica's lease holds without a renewal (`TOOLGATE_REPLICA_LEASE_MS`): renewed
   * every third of it; a replica silent for longer is presumed dead and its busy runs are ended.
   */
  replicaLeaseMs: number;
  /** How long a proposed action may wait for, and an approval wait to be used (`TOOLGATE_APPROVAL_TTL_SECONDS`). */
  approvalTtlSeconds: number;
  retention: {
    /**
     * Finished run trees, and the rows kept only for them, are deleted this many days after they
     * last changed (`TOOLGATE_RETENTION_DAYS`). The audit log is never deleted.
     */
    days: number;
    /** How often each replica looks for what is due (`TOOLGATE_RETENTION_SWEEP_MS`). */
    sweepIntervalMs: number;
  };
  handoffs: {
    /** A hand-off is refused once its parent's trace (root … parent) is this long (`TOOLGATE_HANDOFF_MAX_DEPTH`). */
    maxDepth: number;
    /** How many sub-runs a root run may hand off to (`TOOLGATE_HANDOFF_MAX_FANOUT`); sub-runs get theirs from the hand-off. */
    rootMaxFanout: number;
  };
  auditCheckpoints: {
    /** PEM Ed25519 private key signing checkpoints (`TOOLGATE_AUDIT_SIGNING_KEY`); unset, they are unsigned. */
    signingKey: string | undefined;
    /** PEM public keys of earlier signing keys whose checkpoints stay trusted (`TOOLGATE_AUDIT_VERIFY_KEYS`). */
    verifyKeys: string[];
    /** How often a checkpoint of a chain that moved is recorded; 0 never (`TOOLGATE_AUDIT_CHECKPOINT_INTERVAL_SECONDS`). */
    intervalSeconds: number;
  };
  /** The verifiable log: its Merkle tree, sequencer and signed checkpoints (SPEC §8.1). */
  auditLog: {
    /** The checkpoints' origin line and signing key name (`TOOLGATE_AUDIT_LOG_ORIGIN`). */
    origin: string;
    /** How often the sequencer extends the tree and publishes a checkpoint (`TOOLGATE_AUDIT_SEQUENCE_INTERVAL_MS`). */
    sequenceIntervalMs: number;
  };
  /** The MCP front door, `POST /mcp` (docs/mcp.md). */
  mcp: {
    /** Whether `/mcp` and its metadata route are served (`TOOLGATE_MCP_ENABLED`, default true). */
    enabled: boolean;
    /** The resource tokens must name in `aud` for `/mcp` (`TOOLGATE_MCP_RESOURCE`); unset, `aud` is not checked there. */
    resource: string | undefined;
    /** Where clients get tokens, as the RFC 9728 metadata names them (`TOOLGATE_MCP_AUTHORIZATION_SERVERS`). */
    authorizationServers: string[];
    /** Browser origins allowed to call `/mcp` (`TOOLGATE_MCP_ALLOWED_ORIGINS`); any other `Origin` is refused. */
    allowedOrigins: string[];
    /**
     * Whether URLs may be built from the request's `Host` when no resource is configured: not in production, where a
     * forged `Host` would be reflected to clients (`NODE_ENV=production`).
     */
    hostUrls: boolean;
    /** Open `subscriptions/listen` streams per agent on this process (`TOOLGATE_MCP_MAX_LISTEN_STREAMS_PER_AGENT`). */
    maxListenStreamsPerAgent: number;
    /** Open `subscriptions/listen` streams on this process (`TOOLGATE_MCP_MAX_LISTEN_STREAMS`). */
    maxListenStreams: number;
  };
  /** OpenTelemetry traces from the standard `OTEL_*` variables; undefined when off (SPEC §15). */
  telemetry: TelemetrySettings | undefined;
}

/** Names of the variables tool backends may read secrets from. */
export const SECRET_ENV_PATTERN = /^TOOLGATE_SECRET_[A-Z0-9_]+$/;

const emptyAsUndefined = (value: unknown) => (value === '' ? undefined : value);
const optionalString = z.preprocess(emptyAsUndefined, z.string().optional());
const intInRange = (min: number, max: number, fallback: number) =>
  z.preprocess(emptyAsUndefined, z.coerce.number().int().min(min).max(max).default(fallback));

const PEM_BLOCK = /-----BEGIN [A-Z ]+-----[\s\S]+?-----END [A-Z ]+-----/g;
const pemKey = (parse: (pem: string) => KeyObject, message: string) =>
  z.preprocess(
    emptyAsUndefined,
    z
      .string()
      .transform((value) => value.replace(/\\n/g, '\n'))
      .refine((pem) => {
        try {
          return parse(pem).asymmetricKeyType === 'ed25519';
        } catch {
          return false;
        }
      }, message)
      .optional(),
  );

const httpUrl = (value: string) => {
  try {
    const url = new URL(value);
    return (
      (url.protocol === 'https:' || url.protocol === 'http:') &&
      url.hash === '' &&
      url.username === '' &&
      url.password === ''
    );
  } catch {
    return false;
  }
};
/** A comma-separated list, each entry passing `valid`. */
const listOf = (valid: (entry: string) => boolean, message: string) =>
  z.preprocess(
    emptyAsUndefined,
    z
      .string()
      .default('')
      .transform((value) =>
        value
          .split(',')
          .map((entry) => entry.trim())
          .filter((entry) => entry.length > 0),
      )
      .refine((entries) => entries.every(valid), { message }),
  );
/** A browser origin exactly as browsers send it: scheme, host and port only. */
const isOrigin = (value: string) => httpUrl(value) && new URL(value).origin === value;

const environmentSchema = z
  .object({
    PORT: intInRange(0, 65535, 8080),
    HOST: z.preprocess(emptyAsUndefined, z.string().min(1).default('127.0.0.1')),
    DATABASE_URL: z.preprocess(
      emptyAsUndefined,
      z
        .string()
        .regex(/^postgres(ql)?:\/\//, 'must be a postgres:// or postgresql:// URL')
        .optional(),
    ),
    TOOLGATE_DATA_DIR: z.preprocess(emptyAsUndefined, z.string().min(1).default('./data')),
    NODE_ENV: optionalString,
    TOOLGATE_JWT_SECRET: z.preprocess(
      emptyAsUndefined,
      z.string().min(32, 'must be at least 32 characters').optional(),
    ),
    TOOLGATE_JWT_PUBLIC_KEY: z.preprocess(
      emptyAsUndefined,
      z.string().includes('-----BEGIN', { message: 'must be a PEM public key' }).optional(),
    ),
    TOOLGATE_JWT_JWKS_FILE: optionalString,
    TOOLGATE_JWT_ISSUER: optionalString,
    TOOLGATE_JWT_AUDIENCE: optionalString,
    TOOLGATE_JWT_MAX_TTL_SECONDS: intInRange(60, 31 * 86_400, 86_400),
    TOOLGATE_EGRESS_ALLOW_CIDRS: z.preprocess(
      emptyAsUndefined,
      z
        .string()
        .default('')
        .transform((value) =>
          value
            .split(',')
            .map((cidr) => cidr.trim())
            .filter((cidr) => cidr.length > 0),
        )
        .refine((cidrs) => cidrs.every(isCidr), {
          message: 'must be a comma-separated list of CIDRs such as 10.1.0.0/16',
        }),
    ),
    LOG_LEVEL: z.preprocess(
      emptyAsUndefined,
      z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
    ),
    TOOLGATE_BODY_LIMIT_BYTES: intInRange(1024, 64 * 1024 * 1024, 1024 * 1024),
    MAX_PLAN_STEPS: intInRange(1, 1000, 32),
    TOOLGATE_DB_POOL_SIZE: intInRange(1, 200, 20),
    TOOLGATE_SHUTDOWN_TIMEOUT_MS: intInRange(100, 600_000, 10_000),
    TOOLGATE_REGISTRY_REFRESH_MS: intInRange(50, 1_000, 250),
    // Longer than any call may take (a backend's timeout is at most 5 minutes), twice over: a
    // reservation must never be released as abandoned while its call is still in flight, or the
    // call would settle against nothing and its units be spent twice.
    TOOLGATE_BUDGET_RESERVATION_TTL_SECONDS: intInRange(600, 86_400, 900),
    TOOLGATE_KILL_SWITCH_POLL_MS: intInRange(50, 60_000, 1_000),
    // A switch takes effect on every replica within 5 s at the latest: docs/design/replica-snapshots.md#kill-switches.
    TOOLGATE_KILL_SWITCH_MAX_STALENESS_MS: intInRange(500, 5_000, 5_000),
    TOOLGATE_GRANT_EXPIRY_SWEEP_MS: intInRange(50, 60_000, 1_000),
    TOOLGATE_REPLICA_LEASE_MS: intInRange(300, 600_000, 30_000),
    TOOLGATE_APPROVAL_TTL_SECONDS: intInRange(1, 30 * 86_400, 86_400),
    // At least 31: a run's reservations go with it, and a budget created mid-month starts from
    // the month's reservations, so none of a month that is not over yet may go. 90 by default:
    // a quarter of history in GET /runs, and a replay window no client retry comes near.
    TOOLGATE_RETENTION_DAYS: intInRange(31, 36_500, 90),
    TOOLGATE_RETENTION_SWEEP_MS: intInRange(1_000, 86_400_000, 600_000),
    TOOLGATE_HANDOFF_MAX_DEPTH: intInRange(1, 50, 5),
    TOOLGATE_HANDOFF_MAX_FANOUT: intInRange(0, 1000, 8),
    TOOLGATE_AUDIT_SIGNING_KEY: pemKey(createPrivateKey, 'must be a PEM Ed25519 private key'),
    TOOLGATE_AUDIT_VERIFY_KEYS: z.preprocess(
      emptyAsUndefined,
      z
        .string()
        .default('')
        .transform((value) => value.replace(/\\n/g, '\n'))
        .refine(
          (value) =>
            value.replace(PEM_BLOCK, '').trim() === '' && (value.match(PEM_BLOCK) ?? []).every(isEd25519PublicKey),
          'must hold PEM Ed25519 public keys (BEGIN PUBLIC KEY) and nothing else',
        )
        .transform((value) => value.match(PEM_BLOCK) ?? []),
    ),
    TOOLGATE_AUDIT_CHECKPOINT_INTERVAL_SECONDS: z.preprocess(
      emptyAsUndefined,
      z.coerce
        .number()
        .int()
        .refine((value) => value === 0 || (value >= 10 && value <= 86_400), 'must be 0 (never) or 10 to 86400')
        .default(3600),
    ),
    TOOLGATE_AUDIT_LOG_ORIGIN: z.preprocess(
      emptyAsUndefined,
      z
        .string()
        .max(200)
        .regex(
          /^[^\s+\p{Cc}]+$/u,
          'must be a name without spaces, "+" or control characters, such as example.com/audit',
        )
        .default('toolgate.local/audit'),
    ),
    TOOLGATE_AUDIT_SEQUENCE_INTERVAL_MS: z.preprocess(
      emptyAsUndefined,
      z.coerce.number().int().min(50, 'must be 50 to 1000').max(1000, 'must be 50 to 1000').default(200),
    ),
    TOOLGATE_MCP_ENABLED: z.preprocess(
      emptyAsUndefined,
      z.enum(['true', 'false'], { message: 'must be true or false' }).default('true'),
    ),
    TOOLGATE_MCP_RESOURCE: z.preprocess(
      emptyAsUndefined,
      z
        .string()
        .refine(httpUrl, 'must be an absolute http(s) URL without a fragment, such as https://gateway.example.com/mcp')
        .optional(),
    ),
    TOOLGATE_MCP_AUTHORIZATION_SERVERS: listOf(
      httpUrl,
      'must be a comma-separated list of http(s) URLs (authorization server issuers)',
    ),
    TOOLGATE_MCP_ALLOWED_ORIGINS: listOf(
      isOrigin,
      'must be a comma-separated list of origins such as https://app.example.com (scheme, host and port only)',
    ),
    ...telemetryEnvironment.shape,
    TOOLGATE_MCP_MAX_LISTEN_STREAMS_PER_AGENT: intInRange(1, 10_000, 8),
    TOOLGATE_MCP_MAX_LISTEN_STREAMS: intInRange(1, 1_000_000, 1024),
  })
  .superRefine((env, ctx) => {
    const keys = [env.TOOLGATE_JWT_SECRET, env.TOOLGATE_JWT_PUBLIC_KEY, env.TOOLGATE_JWT_JWKS_FILE];
    if (keys.filter((key) => key !== undefined).length > 1) {
      ctx.addIssue({
        code: 'custom',
        path: ['TOOLGATE_JWT_SECRET'],
        message: 'set only one of TOOLGATE_JWT_SECRET, TOOLGATE_JWT_PUBLIC_KEY and TOOLGATE_JWT_JWKS_FILE',
      });
    }
    if (env.NODE_ENV === 'production' && keys.every((key) => key === undefined)) {
      ctx.addIssue({
        code: 'custom',
        path: ['TOOLGATE_JWT_PUBLIC_KEY'],
        message: 'production needs TOOLGATE_JWT_PUBLIC_KEY, TOOLGATE_JWT_JWKS_FILE or TOOLGATE_JWT_SECRET',
      });
    }
    if (env.NODE_ENV === 'production' && env.TOOLGATE_AUDIT_SIGNING_KEY === undefined) {
      ctx.addIssue({
        code: 'custom',
        path: ['TOOLGATE_AUDIT_SIGNING_KEY'],
        message: 'production needs TOOLGATE_AUDIT_SIGNING_KEY (a PEM Ed25519 private key) to sign the log',
      });
    }
    if (env.TOOLGATE_KILL_SWITCH_POLL_MS >= env.TOOLGATE_KILL_SWITCH_MAX_STALENESS_MS) {
      ctx.addIssue({
        code: 'custom',
        path: ['TOOLGATE_KILL_SWITCH_POLL_MS'],
        message:
          'must be shorter than TOOLGATE_KILL_SWITCH_MAX_STALENESS_MS, or every snapshot goes stale between checks',
      });
    }
  });

function isEd25519PublicKey(pem: string): boolean {
  // A private key would parse too (its public half is derived), but has no place in this list.
  if (!pem.startsWith('-----BEGIN PUBLIC KEY-----')) return false;
  try {
    return createPublicKey(pem).asymmetricKeyType === 'ed25519';
  } catch {
    return false;
  }
}

function isCidr(value: string): boolean {
  try {
    ipaddr.parseCIDR(value);
    return true;
  } catch {
    return false;
  }
}

/** Thrown when the environment is invalid; its message names every offending variable. */
export class ConfigError extends Error {
  override name = 'ConfigError';
}

/** Parses the environment once. Nothing else in toolgate reads `process.env`. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): Config {
  const parsed = environmentSchema.safeParse(env);
  if (!parsed.success) {
    const lines = parsed.error.issues.map((issue) => `  ${issue.path.join('.') || '(environment)'}: ${issue.message}`);
    throw new ConfigError(`invalid configuration:\n${lines.join('\n')}`);
  }
  const e = parsed.data;
  return {
    port: e.PORT,
    host: e.HOST,
    databaseUrl: e.DATABASE_URL,
    dataDir: e.TOOLGATE_DATA_DIR,
    production: e.NODE_ENV === 'production',
    jwt: {
      secret: e.TOOLGATE_JWT_SECRET,
      publicKey: e.TOOLGATE_JWT_PUBLIC_KEY,
      jwksFile: e.TOOLGATE_JWT_JWKS_FILE,
      issuer: e.TOOLGATE_JWT_ISSUER,
      audience: e.TOOLGATE_JWT_AUDIENCE,
      maxTtlSeconds: e.TOOLGATE_JWT_MAX_TTL_SECONDS,
    },
    egressAllowCidrs: e.TOOLGATE_EGRESS_ALLOW_CIDRS,
    logLevel: e.LOG_LEVEL,
    bodyLimitBytes: e.TOOLGATE_BODY_LIMIT_BYTES,
    maxPlanSteps: e.MAX_PLAN_STEPS,
    databasePoolSize: e.TOOLGATE_DB_POOL_SIZE,
    shutdownTimeoutMs: e.TOOLGATE_SHUTDOWN_TIMEOUT_MS,
    registryRefreshMs: e.TOOLGATE_REGISTRY_REFRESH_MS,
    secrets: Object.freeze(
      Object.fromEntries(
        Object.entries(env).filter(
          (entry): entry is [string, string] => SECRET_ENV_PATTERN.test(entry[0]) && typeof entry[1] === 'string',
        ),
      ),
    ),
    budgetReservationTtlSeconds: e.TOOLGATE_BUDGET_RESERVATION_TTL_SECONDS,
    killSwitches: {
      pollIntervalMs: e.TOOLGATE_KILL_SWITCH_POLL_MS,
      maxStalenessMs: e.TOOLGATE_KILL_SWITCH_MAX_STALENESS_MS,
    },
    grants: { expirySweepIntervalMs: e.TOOLGATE_GRANT_EXPIRY_SWEEP_MS },
    replicaLeaseMs: e.TOOLGATE_REPLICA_LEASE_MS,
    approvalTtlSeconds: e.TOOLGATE_APPROVAL_TTL_SECONDS,
    retention: { days: e.TOOLGATE_RETENTION_DAYS, sweepIntervalMs: e.TOOLGATE_RETENTION_SWEEP_MS },
    handoffs: { maxDepth: e.TOOLGATE_HANDOFF_MAX_DEPTH, rootMaxFanout: e.TOOLGATE_HANDOFF_MAX_FANOUT },
    auditCheckpoints: {
      signingKey: e.TOOLGATE_AUDIT_SIGNING_KEY,
      verifyKeys: e.TOOLGATE_AUDIT_VERIFY_KEYS,
      intervalSeconds: e.TOOLGATE_AUDIT_CHECKPOINT_INTERVAL_SECONDS,
    },
    auditLog: {
      origin: e.TOOLGATE_AUDIT_LOG_ORIGIN,
      sequenceIntervalMs: e.TOOLGATE_AUDIT_SEQUENCE_INTERVAL_MS,
    },
    mcp: {
      enabled: e.TOOLGATE_MCP_ENABLED === 'true',
      resource: e.TOOLGATE_MCP_RESOURCE,
      authorizationServers: e.TOOLGATE_MCP_AUTHORIZATION_SERVERS,
      allowedOrigins: e.TOOLGATE_MCP_ALLOWED_ORIGINS,
      hostUrls: e.NODE_ENV !== 'production',
      maxListenStreamsPerAgent: e.TOOLGATE_MCP_MAX_LISTEN_STREAMS_PER_AGENT,
      maxListenStreams: e.TOOLGATE_MCP_MAX_LISTEN_STREAMS,
    },
    telemetry: telemetrySettingsOf(e),
  };
}

/** Where command-line clients (`npm run seed:example`) send requests: `TOOLGATE_URL`, `TOOLGATE_TOKEN`. */
export function loadClientTarget(env: NodeJS.ProcessEnv = process.env): {
  url: string | undefined;
  token: string | undefined;
} {
  return { url: env.TOOLGATE_URL || undefined, token: env.TOOLGATE_TOKEN || undefined };
}
