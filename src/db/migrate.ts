import { readdir, readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { sql, type Kysely } from 'kysely';
import type { DB } from './schema.js';

/** The migrations folder at the project root, from src/ or from dist/. */
export const migrationsDir = fileURLToPath(new URL('../../migrations/', import.meta.url));

// Any constant works; it only has to be the same in every replica.
const MIGRATION_LOCK_KEY = 7_406_331_205;

export interface MigrationResult {
  applied: string[];
}

/**
 * Applies the numbered SQL files of `migrations/` that have not run yet, in order, in one
 * transaction holding an advisory lock: replicas starting together apply each file once.
 */
export async function migrate(db: Kysely<DB>, dir = migrationsDir): Promise<MigrationResult> {
  const files = (await readdir(dir)).filter((name) => /^\d{4}_[a-z0-9_]+\.sql$/.test(name)).sort();
  return db.transaction().execute(async (trx) => {
    await sql`select pg_advisory_xact_lock(${MIGRATION_LOCK_KEY})`.execute(trx);
    await sql`create table if not exists schema_migrations (
      version text primary key,
      applied_at timestamptz not null default now()
    )`.execute(trx);
    const done = new Set(
      (await trx.selectFrom('schema_migrations').select('version').execute()).map((row) => row.version),
    );
    const applied: string[] = [];
    for (const file of files) {
      const version = file.replace(/\.sql$/, '');
      if (done.has(version)) continue;
      const text = await readFile(`${dir}/${file}`, 'utf8');
      await sql.raw(text).execute(trx);
      await trx.insertInto('schema_migrations').values({ version }).execute();
      applied.push(version);
    }
    return { applied };
  });
}
