import { randomBytes } from 'node:crypto';
import { copyFileSync, mkdtempSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { pino } from 'pino';
import { inject } from 'vitest';
import type { Kysely } from 'kysely';
import { openDatabase, type Database } from '../../src/db/database.js';
import type { DB } from '../../src/db/schema.js';
import { migrate, migrationsDir } from '../../src/db/migrate.js';

/** True when tests run against a real PostgreSQL server (several connections, LISTEN/NOTIFY across processes). */
export const hasPostgresServer = inject('testDatabaseUrl') !== '';

export interface TestDatabase {
  /** The connection string of this test's own database; undefined on embedded PGlite. */
  url: string | undefined;
  database: Database;
  drop(): Promise<void>;
}

/**
 * How a test database's audit log starts: closed at its genesis, records leaves only (as a new log is), or
 * its linear chain open (as a log written before the chain closed). `TOOLGATE_TEST_AUDIT_CHAIN=open` opens
 * it for every test that does not say.
 */
export type ChainState = 'open' | 'closed';
const defaultChain: ChainState = process.env.TOOLGATE_TEST_AUDIT_CHAIN === 'open' ? 'open' : 'closed';

/** Creates a fresh, migrated database for one test file, so that runs never collide. */
export async function createTestDatabase(options: { chain?: ChainState } = {}): Promise<TestDatabase> {
  const made = await createMigrated();
  if ((options.chain ?? defaultChain) === 'open') await openEmptyChain(made.database.control);
  return made;
}

/** A migrated log with no record opened as a log from before the chain closed was (what no gateway does). */
async function openEmptyChain(db: Kysely<DB>): Promise<void> {
  const { numUpdatedRows } = await db
    .updateTable('audit_chain_head')
    .set({ closed: false })
    .where('id', '=', 1)
    .where('seq', '=', '0' as never)
    .executeTakeFirst();
  if (numUpdatedRows !== 1n) throw new Error('the test database has records: its chain cannot be opened');
}

async function createMigrated(): Promise<TestDatabase> {
  const logger = pino({ level: 'silent' });
  const serverUrl = inject('testDatabaseUrl');
  if (!serverUrl) {
    const database = await openDatabase({ databaseUrl: undefined, dataDir: 'memory://', poolSize: 1, logger });
    await migrate(database.control);
    return { url: undefined, database, drop: () => database.close() };
  }
  const name = `toolgate_test_${randomBytes(6).toString('hex')}`;
  await withAdmin(serverUrl, (client) => client.query(`CREATE DATABASE ${name}`));
  const url = new URL(serverUrl);
  url.pathname = `/${name}`;
  const database = await openDatabase({ databaseUrl: url.toString(), dataDir: '', poolSize: 10, logger });
  await migrate(database.control);
  let dropped = false;
  return {
    url: url.toString(),
    database,
    drop: async () => {
      if (dropped) return;
      dropped = true;
      await database.close();
      await withAdmin(serverUrl, (client) => client.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`));
    },
  };
}

/** Another pool of `poolSize` connections on the database at `url`, as another replica opens it. */
export function openPool(url: string | undefined, poolSize: number): Promise<Database> {
  return openDatabase({ databaseUrl: url, dataDir: '', poolSize, logger: pino({ level: 'silent' }) });
}

/** A new, empty, unmigrated database on the test server (for migration tests). */
export async function createEmptyDatabaseUrl(): Promise<{ url: string; drop(): Promise<void> }> {
  const serverUrl = inject('testDatabaseUrl');
  const name = `toolgate_test_${randomBytes(6).toString('hex')}`;
  await withAdmin(serverUrl, (client) => client.query(`CREATE DATABASE ${name}`));
  const url = new URL(serverUrl);
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
    drop: () =>
      withAdmin(serverUrl, (client) => client.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)).then(
        () => undefined,
      ),
  };
}

/** The migrations up to `last` (a file name), in a folder of their own: a database as an older release left it. */
export function migrationsUpTo(last: string): string {
  const dir = mkdtempSync(join(tmpdir(), 'toolgate-migrations-'));
  for (const file of readdirSync(migrationsDir))
    if (file <= last) copyFileSync(join(migrationsDir, file), join(dir, file));
  return dir;
}

async function withAdmin<T>(serverUrl: string, fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: serverUrl });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}
