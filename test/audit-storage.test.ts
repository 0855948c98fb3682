import { randomUUID } from 'node:crypto';
import { copyFileSync } from 'node:fs';
import { join } from 'node:path';
import { sql, type Kysely } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AuditRecord } from '../src/audit/audit-event.js';
import { chainOf, NO_OPTIONAL_FIELDS } from './helpers/audit.js';
import { HASH_SCHEME, payloadHash, sealLinked, sealRecord } from '../src/audit/audit-hash.js';
import { readChainHead } from '../src/audit/audit-repository.js';
import { verifyAuditChain } from '../src/audit/chain-verification.js';
import { openDatabase, type Database } from '../src/db/database.js';
import { migrate, migrationsDir } from '../src/db/migrate.js';
import type { DB } from '../src/db/schema.js';
import { createEmptyDatabaseUrl, hasPostgresServer, migrationsUpTo } from './helpers/database.js';
import { AppClient, startHarness, type Harness } from './helpers/harness.js';
import { monthStart } from './helpers/months.js';
import { tokens } from './helpers/tokens.js';
import { until } from './helpers/waits.js';

const platform = tokens.platform();
const logger = pino({ level: 'silent' });

/**
 * Appends records as gateways did before migration 0022, hashes stored as hex text, after the head it
 * locks: alternately hashed whole (scheme 1) and linked (2), each with the SHA-256s of a call.
 */
async function appendAsBefore0022(database: Database, dates: Date[]): Promise<AuditRecord[]> {
  return database.control.transaction().execute(async (trx) => {
    let { seq, hash } = await readChainHead(trx);
    const records: AuditRecord[] = [];
    for (const at of dates) {
      seq += 1;
      const unhashed = {
        ...NO_OPTIONAL_FIELDS,
        seq,
        event_id: randomUUID(),
        occurred_at: at.toISOString(),
        actor: `agent:agent.${seq}`,
        event_type: 'storage.test',
        tenant_id: 'tenant-a',
        run_id: `run-${seq}`,
        input_sha256: payloadHash({ seq }),
        output_sha256: seq % 3 === 0 ? null : payloadHash({ out: seq }),
        details: { seq },
        prev_hash: hash,
      };
      const scheme = seq % 2 === 1 ? HASH_SCHEME.record : HASH_SCHEME.linked;
      const sealed = scheme === HASH_SCHEME.record ? sealRecord(unhashed) : sealLinked(unhashed);
      const record: AuditRecord = { ...unhashed, hash: sealed.hash, hash_scheme: scheme };
      await sql`insert into audit_events
        select * from jsonb_populate_record(null::audit_events, ${JSON.stringify(record)}::jsonb)`.execute(trx);
      records.push(record);
      hash = sealed.hash;
    }
    await trx.updateTable('audit_chain_head').set({ seq, hash }).where('id', '=', 1).execute();
    return records;
  });
}

/** A database migrated up to 0021, then given `0022_audit_hashes_bytea` and the rest. */
async function withLogBefore0022(test: (database: Database, migrateRest: () => Promise<void>) => Promise<void>) {
  const empty = await createEmptyDatabaseUrl();
  const database = await openDatabase({ databaseUrl: empty.url, dataDir: '', poolSize: 3, logger });
  try {
    const dir = migrationsUpTo('0021_grant_uses_by_run.sql');
    await migrate(database.control, dir);
    await test(database, async () => {
      copyFileSync(join(migrationsDir, '0022_audit_hashes_bytea.sql'), join(dir, '0022_audit_hashes_bytea.sql'));
      expect((await migrate(database.control, dir)).applied).toEqual(['0022_audit_hashes_bytea']);
      await migrate(database.control);
    });
  } finally {
    await database.close();
    await empty.drop();
  }
}

/** The stored size of each hash column of every row, in seq order (null for a null). */
async function storedSizes(db: Kysely<DB>) {
  const { rows } = await sql<{ prev: number; hash: number; input: number | null; output: number | null }>`
    select octet_length(prev_hash) as prev, octet_length(hash) as hash,
      octet_length(input_sha256) as input, octet_length(output_sha256) as output
    from audit_events order by seq`.execute(db);
  return rows;
}

describe.skipIf(!hasPostgresServer)('migration 0022 on a populated log', () => {
  it('stores the hashes of records written before it as bytes: the chain verifies, the API answers the same hex', () =>
    withLogBefore0022(async (database, migrateRest) => {
      const db = database.control;
      // Rows in three partitions: the first (this month), a month of its own, and the default.
      const dates = [new Date(), new Date(monthStart(2).getTime() + 86_400_000), new Date('2099-01-15T00:00:00Z')];
      const before = await appendAsBefore0022(database, [...dates, ...dates]);
      expect(await verifyAuditChain(db)).toMatchObject({ ok: true, checked: 6 });
      const head = await readChainHead(db);

      await migrateRest();
      const { rows: types } = await sql<{ column_name: string; data_type: string }>`
        select column_name, data_type from information_schema.columns
        where table_name = 'audit_events' and column_name in ('prev_hash', 'hash', 'input_sha256', 'output_sha256')
        order by column_name`.execute(db);
      expect(types.map((t) => t.data_type)).toEqual(['bytea', 'bytea', 'bytea', 'bytea']);
      expect(await storedSizes(db)).toEqual(
        before.map((r) => ({ prev: 32, hash: 32, input: 32, output: r.output_sha256 === null ? null : 32 })),
      );
      const { rows: indexes } = await sql<{ indexname: string }>`
        select indexname from pg_indexes where tablename = 'audit_events' and indexname like 'audit_events_run%'`.execute(
        db,
      );
      expect(indexes.map((i) => i.indexname)).toEqual(['audit_events_run']);

      const client = await AppClient.start(database);
      try {
        const listed = await client.get('/audit', { token: platform });
        expect(listed.body.items).toEqual([...before].reverse());
        const byRun = await client.get('/audit', { token: platform, query: { run_id: before[4]!.run_id! } });
        expect(byRun.body.items).toEqual([before[4]]);
        // The head an operator anchored before the upgrade still holds.
        const anchored = await client.get('/audit/verify', {
          token: platform,
          query: { anchor_seq: head.seq, anchor_hash: head.hash },
        });
        expect(chainOf(anchored.body)).toEqual({
          ok: true,
          checked: 6,
          first_bad_seq: null,
          head,
          anchor: { seq: head.seq, ok: true, reason: null },
        });

        // Appends go on after them as leaf records: the upgrade closed the chain at its head.
        const after = await client.app.services.audit.appendMany([
          { event_type: 'storage.test', actor: 'agent:agent.7', input_sha256: payloadHash({ seq: 7 }) },
          {
            event_type: 'storage.test',
            actor: 'agent:agent.8',
            input_sha256: payloadHash({ seq: 8 }),
            output_sha256: payloadHash({ out: 8 }),
          },
        ]);
        expect(after.map((r) => [r.hash_scheme, r.prev_hash, r.seq > head.seq])).toEqual([
          [3, null, true],
          [3, null, true],
        ]);
        expect((await client.get('/audit/verify', { token: platform })).body).toMatchObject({
          ok: true,
          checked: 6,
          head,
        });
        const latest = await client.get('/audit', { token: platform, query: { limit: 2 } });
        expect(latest.body.items).toEqual([...after].reverse());
      } finally {
        await client.close();
      }
    }));

  it('keeps an edit made before it evident at the same row, even one that is not hex', () =>
    withLogBefore0022(async (database, migrateRest) => {
      const db = database.control;
      const records = await appendAsBefore0022(database, [new Date(), new Date(), new Date(), new Date()]);
      await sql`alter table audit_events disable trigger audit_events_no_update_delete`.execute(db);
      await sql`update audit_events set input_sha256 = 'not a hash' where seq = 2`.execute(db);
      await sql`update audit_events set output_sha256 = upper(output_sha256) where seq = 4`.execute(db);
      await sql`alter table audit_events enable trigger audit_events_no_update_delete`.execute(db);
      expect(await verifyAuditChain(db)).toMatchObject({ ok: false, checked: 1, first_bad_seq: 2 });

      await migrateRest();
      expect(await verifyAuditChain(db)).toMatchObject({ ok: false, checked: 1, first_bad_seq: 2 });
      // Nothing of the edit was lost: the text that was there is its bytes.
      const { rows } = await sql<{ input: string; output: string }>`
        select (select convert_from(input_sha256, 'UTF8') from audit_events where seq = 2) as input,
          (select convert_from(output_sha256, 'UTF8') from audit_events where seq = 4) as output`.execute(db);
      expect(rows[0]).toEqual({ input: 'not a hash', output: records[3]!.output_sha256!.toUpperCase() });
    }));
});

describe('SHA-256s stored as bytes', () => {
  let h: Harness;
  let records: AuditRecord[];
  beforeAll(async () => {
    h = await startHarness({}, { chain: 'open' });
    records = await h.client.app.services.audit.appendMany(
      [1, 2, 3].map((n) => ({
        event_type: 'storage.test',
        actor: `agent:agent.${n}`,
        run_id: `run-${n}`,
        input_sha256: payloadHash({ n }),
        output_sha256: n === 2 ? null : payloadHash({ out: n }),
      })),
    );
    // Sequenced before any is edited: a leaf made of an edited record would stay wrong once the edit is undone.
    await until('the records to be leaves', async () => {
      const { rows } = await sql<{ n: number }>`select count(*)::int as n from audit_leaves`.execute(
        h.db.database.control,
      );
      return rows[0]!.n >= 3;
    });
  });
  afterAll(() => h.close());

  const verify = async () => chainOf((await h.client.get('/audit/verify', { token: platform })).body);

  /** Changes a row's stored bytes with the append-only trigger off, as a superuser could; `undo` puts them back. */
  async function tamper(seq: number, column: string, change: string, undo: string): Promise<() => Promise<void>> {
    const db = h.db.database.control;
    const set = async (expression: string) => {
      await sql`alter table audit_events disable trigger audit_events_no_update_delete`.execute(db);
      try {
        await sql`update audit_events set ${sql.ref(column)} = ${sql.raw(expression)} where seq = ${seq}`.execute(db);
      } finally {
        await sql`alter table audit_events enable trigger audit_events_no_update_delete`.execute(db);
      }
    };
    await set(change);
    return () => set(undo);
  }

  it('holds each hash as its 32 bytes, and answers the hex it was appended with', async () => {
    const rows = await storedSizes(h.db.database.control);
    expect(rows).toEqual([
      { prev: 32, hash: 32, input: 32, output: 32 },
      { prev: 32, hash: 32, input: 32, output: null },
      { prev: 32, hash: 32, input: 32, output: 32 },
    ]);
    const listed = await h.client.get('/audit', { token: platform });
    expect(listed.body.items).toEqual([...records].reverse());
    expect(await verify()).toMatchObject({ ok: true, checked: 3 });
  });

  it('reports a bit flipped in any hash column as the row holding it', async () => {
    const second = records[1]!.seq;
    for (const column of ['input_sha256', 'prev_hash', 'hash']) {
      const flip = `set_byte(${column}, 31, get_byte(${column}, 31) # 1)`;
      const undo = await tamper(second, column, flip, flip);
      expect(await verify(), column).toMatchObject({ ok: false, first_bad_seq: second });
      await undo();
      expect(await verify(), column).toMatchObject({ ok: true, checked: 3 });
    }
    // A hash cut short, and one given to a row that had none.
    const third = records[2]!.seq;
    const cut = await tamper(
      third,
      'output_sha256',
      'substring(output_sha256 from 1 for 31)',
      `decode('${records[2]!.output_sha256}', 'hex')`,
    );
    expect(await verify()).toMatchObject({ ok: false, first_bad_seq: third });
    await cut();
    const given = await tamper(second, 'output_sha256', 'input_sha256', 'null');
    expect(await verify()).toMatchObject({ ok: false, first_bad_seq: second });
    await given();
    expect(await verify()).toMatchObject({ ok: true, checked: 3 });
  });

  it('refuses to append a SHA-256 that is not 64 lowercase hex digits, which would not read back as hashed', async () => {
    const head = await readChainHead(h.db.database.control);
    for (const input_sha256 of [payloadHash({ n: 1 }).toUpperCase(), 'abc', `${payloadHash({ n: 1 })}00`]) {
      await expect(
        h.client.app.services.audit.append({ event_type: 'storage.test', actor: 'agent:agent.x', input_sha256 }),
      ).rejects.toThrow(/input_sha256 is not a SHA-256 in lowercase hex/);
    }
    expect(await readChainHead(h.db.database.control)).toEqual(head);
    // Refused before it joins a batch: an event appended at the same moment is not failed with it.
    const [bad, good] = await Promise.allSettled([
      h.client.app.services.audit.append({ event_type: 'storage.test', actor: 'agent:agent.x', input_sha256: 'abc' }),
      h.client.app.services.audit.append({
        event_type: 'storage.test',
        actor: 'agent:agent.x',
        input_sha256: payloadHash({ n: 2 }),
      }),
    ]);
    expect(bad.status).toBe('rejected');
    expect(good.status).toBe('fulfilled');
    expect((await readChainHead(h.db.database.control)).seq).toBe(head.seq + 1);
  });
});
