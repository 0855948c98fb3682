import closeWithGrace from 'close-with-grace';
import { buildApp } from './app.js';
import { developmentToken } from './auth/dev-token.js';
import { loadVerificationKeys } from './auth/jwt-keys.js';
import { ConfigError, loadConfig } from './config/config.js';
import { openDatabase } from './db/database.js';
import { migrate } from './db/migrate.js';
import { waitAtMost } from './db/wait-at-most.js';
import { createLogger } from './logger.js';

/** How long a shutdown waits for the last spans to be exported. */
const TELEMETRY_FLUSH_MS = 2_000;

/** The signals that ask for a graceful shutdown. */
const SHUTDOWN_SIGNALS = ['SIGTERM', 'SIGINT'] as const;

/** How soon the same signal again is taken as the first one delivered twice, not as "exit now". */
const REPEATED_SIGNAL_MS = 1_000;

/** The process: configuration, database, migrations, the app, signals. */
async function main(): Promise<void> {
  let config;
  try {
    config = loadConfig();
  } catch (error) {
    if (error instanceof ConfigError) {
      process.stderr.write(`toolgate: ${error.message}\n`);
      process.exit(2);
    }
    throw error;
  }
  const logger = createLogger(config.logLevel, { traced: config.telemetry !== undefined });
  // Only when the OTEL_* variables ask for traces: otherwise the SDK is not even loaded.
  const telemetry =
    config.telemetry && (await import('./telemetry/telemetry.js')).startTelemetry(config.telemetry, logger);
  // Before the database: a misconfigured key stops the replica before it migrates anything.
  const keys = await loadVerificationKeys(config);
  const database = await openDatabase({
    databaseUrl: config.databaseUrl,
    dataDir: config.dataDir,
    poolSize: config.databasePoolSize,
    logger,
  });
  const { applied } = await migrate(database.control);
  logger.info({ applied, database: database.kind }, 'migrations applied');
  const app = await buildApp({ config, database, keys, logger });

  // SIGTERM and SIGINT are taken here rather than by close-with-grace, which takes any second
  // signal as "exit now": `npm start` forwards to node the signal its process group has already
  // delivered to node (Ctrl-C in a terminal, `kill -- -PGID`, systemd stopping the service), and
  // exiting on that copy cut the calls in flight. The same signal again within a second is that
  // one request; a later or different one still forces the exit.
  let shutdown: { signal: NodeJS.Signals; atMs: number } | undefined;
  let erroredOut = false;
  const grace = closeWithGrace(
    { delay: config.shutdownTimeoutMs, logger, skip: [...SHUTDOWN_SIGNALS] },
    async ({ err }) => {
      if (err) {
        erroredOut = true;
        logger.error({ err }, 'shutting down after an error');
      }
      await app.close();
      await database.close();
      // The spans still buffered, sent if the collector answers soon: it must not hold the exit.
      await waitAtMost(telemetry?.shutdown(), TELEMETRY_FLUSH_MS);
    },
  );
  for (const signal of SHUTDOWN_SIGNALS) {
    process.on(signal, () => {
      if (shutdown === undefined && !erroredOut) {
        shutdown = { signal, atMs: Date.now() };
        logger.info({ signal }, 'shutting down');
        grace.close();
      } else if (shutdown?.signal === signal && Date.now() - shutdown.atMs < REPEATED_SIGNAL_MS) {
        logger.info(
          { signal },
          'the same signal again at once (delivered to the process group, then forwarded): still shutting down',
        );
      } else {
        logger.error({ signal }, 'another signal while shutting down: exiting now');
        process.exit(1);
      }
    });
  }

  await app.listen({ port: config.port, host: config.host });
  if (keys.kind === 'secret' && keys.development) {
    // Printed to the terminal, never logged: logs must not carry tokens.
    const token = developmentToken(keys.secret, config);
    // The port actually bound (PORT=0 asks for any free one).
    const bound = app.server.address();
    const port = typeof bound === 'object' && bound ? bound.port : config.port;
    const address = `http://${config.host.includes(':') ? `[${config.host}]` : config.host}:${port}`;
    process.stderr.write(
      [
        '',
        'toolgate is running in development mode (no TOOLGATE_JWT_* key configured).',
        `Development platform-operator token (valid 12 h, tenant "dev"):`,
        '',
        `  export TOOLGATE_TOKEN=${token}`,
        `  curl -s -H "authorization: Bearer $TOOLGATE_TOKEN" ${address}/whoami`,
        '',
        'Mint more with: npm run token -- --kind agent --sub my.agent --tenant dev',
        '',
      ].join('\n'),
    );
  }
}

main().catch((error: unknown) => {
  process.stderr.write(`toolgate: failed to start: ${error instanceof Error ? error.message : String(error)}\n`);
  process.exit(1);
});
