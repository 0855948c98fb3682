import { sql } from 'kysely';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { openDatabase } from '../src/db/database.js';
import { createEmptyDatabaseUrl, hasPostgresServer } from './helpers/database.js';

// src/db/database.ts: the pg pool sends parameterised statements as named prepared statements.
describe.skipIf(!hasPostgresServer)('prepared statements (needs a PostgreSQL server)', () => {
  it('prepares a repeated statement once per connection and plans it with each call’s values', async () => {
    const empty = await createEmptyDatabaseUrl();
    const database = await openDatabase({ databaseUrl: empty.url, dataDir: '', poolSize: 1, logger: pino({ level: 'silent' }) });
    try {
      await sql`create table things (id int primary key, label text)`.execute(database.db);
      await sql`insert into things select g, 'n' || g from generate_series(1, 50) g`.execute(database.db);
      for (const id of [3, 7, 3]) {
        const { rows } = await sql<{ label: string }>`select label from things where id = ${id}`.execute(database.db);
        expect(rows).toEqual([{ label: `n${id}` }]);
      }
      const prepared = await sql<{ n: number }>`select count(*)::int as n from pg_prepared_statements where statement like ${'%from things where id =%'}`.execute(database.db);
      expect(prepared.rows[0]!.n).toBe(1);
      const mode = await sql<{ plan_cache_mode: string }>`show plan_cache_mode`.execute(database.db);
      expect(mode.rows[0]!.plan_cache_mode).toBe('force_custom_plan');
    } finally {
      await database.close();
      await empty.drop();
    }
  });

  it('recovers a statement whose result columns a migration changed: it fails once, then works unprepared', async () => {
    const empty = await createEmptyDatabaseUrl();
    const database = await openDatabase({ databaseUrl: empty.url, dataDir: '', poolSize: 1, logger: pino({ level: 'silent' }) });
    try {
      await sql`create table widgets (id int primary key)`.execute(database.db);
      await sql`insert into widgets values (1)`.execute(database.db);
      const read = () => sql<Record<string, unknown>>`select * from widgets where id = ${1}`.execute(database.db);
      expect((await read()).rows).toEqual([{ id: 1 }]);
      await sql`alter table widgets add column colour text default 'red'`.execute(database.db);
      await expect(read()).rejects.toMatchObject({ code: '0A000' });
      expect((await read()).rows).toEqual([{ id: 1, colour: 'red' }]);
      expect((await read()).rows).toEqual([{ id: 1, colour: 'red' }]);
    } finally {
      await database.close();
      await empty.drop();
    }
  });
});
