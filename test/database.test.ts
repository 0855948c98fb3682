import { sql } from 'kysely';
import { pino } from 'pino';
import { describe, expect, inject, it } from 'vitest';
import { openDatabase } from '../src/db/database.js';
import { createEmptyDatabaseUrl, hasPostgresServer, openPool } from './helpers/database.js';
import { TcpProxy } from './helpers/tcp-proxy.js';
import { until } from './helpers/waits.js';

// src/db/database.ts: the pg pool sends parameterised statements as named prepared statements.
describe.skipIf(!hasPostgresServer)('prepared statements (needs a PostgreSQL server)', () => {
  it('prepares a repeated statement once per connection and plans it with each call’s values', async () => {
    const empty = await createEmptyDatabaseUrl();
    const database = await openPool(empty.url, 1);
    try {
      await sql`create table things (id int primary key, label text)`.execute(database.control);
      await sql`insert into things select g, 'n' || g from generate_series(1, 50) g`.execute(database.control);
      for (const id of [3, 7, 3]) {
        const { rows } = await sql<{ label: string }>`select label from things where id = ${id}`.execute(
          database.control,
        );
        expect(rows).toEqual([{ label: `n${id}` }]);
      }
      const prepared = await sql<{
        n: number;
      }>`select count(*)::int as n from pg_prepared_statements where statement like ${'%from things where id =%'}`.execute(
        database.control,
      );
      expect(prepared.rows[0]!.n).toBe(1);
      const mode = await sql<{ plan_cache_mode: string }>`show plan_cache_mode`.execute(database.control);
      expect(mode.rows[0]!.plan_cache_mode).toBe('force_custom_plan');
    } finally {
      await database.close();
      await empty.drop();
    }
  });

  it('plans a hot statement once per connection, as index lookups that stay right after the table grew', async () => {
    const empty = await createEmptyDatabaseUrl();
    const database = await openPool(empty.url, 1);
    try {
      await sql`create table things (tenant text, id text, created_at timestamptz not null default now(), label text, primary key (tenant, id))`.execute(
        database.control,
      );
      await sql`create index things_tenant_created on things (tenant, created_at desc)`.execute(database.control);
      // The shapes of the per-call statements: a batch of rows joined to a table by its key, and key lists.
      const joined = (keys: Array<{ tenant: string; id: string }>) =>
        sql<{
          label: string;
        }>`select t.label from jsonb_to_recordset(${JSON.stringify(keys)}::jsonb) as v(tenant text, id text) join things t on t.tenant = v.tenant and t.id = v.id`.execute(
          database.hot,
        );
      const listed = (tenants: string[], ids: string[]) =>
        sql<{
          label: string;
        }>`select t.label from things t where t.tenant = any(${tenants}::text[]) and t.id = any(${ids}::text[])`.execute(
          database.hot,
        );
      // Planned (generic) and kept while the table is empty...
      expect((await joined([{ tenant: 'a', id: '1' }])).rows).toEqual([]);
      expect((await listed(['a'], ['1'])).rows).toEqual([]);
      // ...then the table grows (before any ANALYZE would make the server plan them again).
      await sql`insert into things (tenant, id, label) select 'a', g::text, 'n' || g from generate_series(1, 20000) g`.execute(
        database.control,
      );
      expect((await joined([{ tenant: 'a', id: '7' }])).rows).toEqual([{ label: 'n7' }]);
      expect((await listed(['a'], ['8'])).rows).toEqual([{ label: 'n8' }]);
      // The kept plans probe the primary key: neither reads the grown table, or the tenant's rows, whole.
      const named = await sql<{
        name: string;
        statement: string;
      }>`select name, statement from pg_prepared_statements where statement like ${'%from%things t%'}`.execute(
        database.hot,
      );
      expect(named.rows).toHaveLength(2);
      for (const { name, statement } of named.rows) {
        const args = statement.includes('jsonb_to_recordset') ? `'[{"tenant":"a","id":"5"}]'` : `'{a}', '{5}'`;
        const plan = await sql<{ 'QUERY PLAN': string }>`explain execute ${sql.raw(name)}(${sql.raw(args)})`.execute(
          database.hot,
        );
        const text = plan.rows.map((row) => row['QUERY PLAN']).join('\n');
        expect(text).toMatch(/Index (Only )?Scan using things_pkey/);
        expect(text).not.toMatch(/Seq Scan|Hash Join|Bitmap|things_tenant_created/);
      }
      const settings = await sql<{
        mode: string;
        seqscan: string;
      }>`select current_setting('plan_cache_mode') as mode, current_setting('enable_seqscan') as seqscan`.execute(
        database.hot,
      );
      expect(settings.rows[0]).toEqual({ mode: 'force_generic_plan', seqscan: 'off' });
      // The other pool plans each execution with its values (operator queries).
      const general = await sql<{ mode: string }>`select current_setting('plan_cache_mode') as mode`.execute(
        database.control,
      );
      expect(general.rows[0]!.mode).toBe('force_custom_plan');
      // Only the pool for statements a later synchronous commit makes durable skips the wait for the disk.
      const durability = async (db: typeof database.control) =>
        (
          await sql<{
            sync: string;
            mode: string;
          }>`select current_setting('synchronous_commit') as sync, current_setting('plan_cache_mode') as mode`.execute(
            db,
          )
        ).rows[0];
      expect(await durability(database.hotDeferred)).toEqual({ sync: 'off', mode: 'force_generic_plan' });
      expect(await durability(database.hot)).toEqual({ sync: 'on', mode: 'force_generic_plan' });
      expect((await durability(database.control))!.sync).toBe('on');
    } finally {
      await database.close();
      await empty.drop();
    }
  });

  it('compiles no hot statement just in time, not even one left with a ruled-out scan', async () => {
    const empty = await createEmptyDatabaseUrl();
    const database = await openPool(empty.url, 1);
    try {
      await sql`create table things (id int primary key, label text)`.execute(database.control);
      // No index on label: the generic plan scans, priced past jit_above_cost by enable_seqscan=off.
      for (const db of [database.hot, database.hotDeferred]) {
        const { rows } = await sql<{
          'QUERY PLAN': Array<Record<string, unknown>>;
        }>`explain (analyze, format json) select count(*) from things where label = ${'x'}`.execute(db);
        const [plan] = rows[0]!['QUERY PLAN'];
        expect(JSON.stringify(plan)).toMatch(/Seq Scan/);
        expect(plan).not.toHaveProperty('JIT');
      }
    } finally {
      await database.close();
      await empty.drop();
    }
  });

  it('recovers a statement whose result columns a migration changed: it fails once, then works unprepared', async () => {
    const empty = await createEmptyDatabaseUrl();
    const database = await openPool(empty.url, 1);
    try {
      await sql`create table widgets (id int primary key)`.execute(database.control);
      await sql`insert into widgets values (1)`.execute(database.control);
      const read = () => sql<Record<string, unknown>>`select * from widgets where id = ${1}`.execute(database.control);
      expect((await read()).rows).toEqual([{ id: 1 }]);
      await sql`alter table widgets add column colour text default 'red'`.execute(database.control);
      await expect(read()).rejects.toMatchObject({ code: '0A000' });
      expect((await read()).rows).toEqual([{ id: 1, colour: 'red' }]);
      expect((await read()).rows).toEqual([{ id: 1, colour: 'red' }]);
    } finally {
      await database.close();
      await empty.drop();
    }
  });
});

// src/db/database.ts: closing must not wait for ever on a connection that never got going.
describe.skipIf(!hasPostgresServer)('closing (needs a PostgreSQL server)', () => {
  it('closes while its notification listener is still connecting, as after an outage, instead of waiting for ever', async () => {
    const server = new URL(inject('testDatabaseUrl'));
    const proxy = await new TcpProxy(server.hostname, Number(server.port || 5432)).start();
    try {
      // The server takes the connection and never answers: the listener stays in its handshake.
      proxy.freeze();
      const database = await openDatabase({
        databaseUrl: proxy.urlFor(inject('testDatabaseUrl')),
        dataDir: '',
        poolSize: 1,
        logger: pino({ level: 'silent' }),
      });
      const subscribed = database.listener.subscribe('toolgate_test_channel', () => undefined);
      await until('the listener to connect', () => proxy.accepted > 0);
      // A close that hangs is told apart from one that ends; 10 s is far beyond any bounded step.
      const hung = new Promise<'hung'>((resolve) => setTimeout(() => resolve('hung'), 10_000).unref());
      expect(await Promise.race([database.close().then(() => 'closed'), hung])).toBe('closed');
      expect(await Promise.race([subscribed.then(() => 'settled'), hung])).toBe('settled');
      expect(database.listener.connected).toBe(false);
    } finally {
      await proxy.close();
    }
  }, 20_000);
});
