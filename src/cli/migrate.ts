import { loadConfig } from '../config/config.js';
import { openDatabase } from '../db/database.js';
import { migrate } from '../db/migrate.js';
import { createLogger } from '../logger.js';

/** `npm run migrate`: applies pending migrations to DATABASE_URL (or the embedded database). */
async function main(): Promise<void> {
  const config = loadConfig();
  const logger = createLogger(config.logLevel);
  const database = await openDatabase({
    databaseUrl: config.databaseUrl,
    dataDir: config.dataDir,
    poolSize: 2,
    logger,
  });
  try {
    const { applied } = await migrate(database.control);
    process.stdout.write(applied.length ? `applied: ${applied.join(', ')}\n` : 'up to date\n');
  } finally {
    await database.close();
  }
}

main().catch((error: unknown) => {
  process.stderr.write(`migrate: ${error instanceof Error ? error.message : String(error)}\n`);
  process.exit(1);
});
