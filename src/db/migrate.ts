import { createHash } from 'node:crypto';
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

/** Thrown when a migration already applied no longer reads as it did: migrations are never edited. */
export class MigrationChangedError extends Error {
  override name = 'MigrationChangedError';
}

/**
 * Applies the pending numbered files of `migrations/` in order, in one transaction under an advisory lock. An applied
 * file whose SHA-256 changed stops start-up: the change would never reach a database that already ran it.
 */
export async function migrate(db: Kysely<DB>, dir = migrationsDir): Promise<MigrationResult> {
  const files = (await readdir(dir)).filter((name) => /^\d{4}_[a-z0-9_]+\.sql$/.test(name)).sort();
  return db.transaction().execute(async (trx) => {
    await sql`select pg_advisory_xact_lock(${MIGRATION_LOCK_KEY})`.execute(trx);
    await sql`create table if not exists schema_migrations (
      version text primary key,
      applied_at timestamptz not null default now()
    )`.execute(trx);
    await sql`alter table schema_migrations add column if not exists checksum text`.execute(trx);
    const done = new Map(
      (await trx.selectFrom('schema_migrations').select(['version', 'checksum']).execute()).map((row) => [
        row.version,
        row.checksum,
      ]),
    );
    const applied: string[] = [];
    for (const file of files) {
      const version = file.replace(/\.sql$/, '');
      const text = await readFile(`${dir}/${file}`, 'utf8');
      const checksum = createHash('sha256').update(text).digest('hex');
      if (done.has(version)) {
        const recorded = done.get(version);
        if (recorded === null || recorded === undefined) {
          await trx.updateTable('schema_migrations').set({ checksum }).where('version', '=', version).execute();
        } else if (recorded !== checksum) {
          throw new MigrationChangedError(
            `migration ${file} was changed after it was applied to this database (sha256 ${recorded.slice(0, 12)}… then, ${checksum.slice(0, 12)}… now): restore it, and put the change in a new migration`,
          );
        }
        continue;
      }
      await sql.raw(text).execute(trx);
      await trx.insertInto('schema_migrations').values({ version, checksum }).execute();
      applied.push(version);
    }
    return { applied };
  });
}
