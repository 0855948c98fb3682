import { randomUUID } from 'node:crypto';
import { sql, type Kysely } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AuditRecord } from '../src/audit/audit-event.js';
import { GENESIS_HASH, HASH_SCHEME, sealLinked } from '../src/audit/audit-hash.js';
import { AuditLog } from '../src/audit/audit-log.js';
import { insertSealedRecords, readChainHead } from '../src/audit/audit-repository.js';
import { verifyAuditChain } from '../src/audit/chain-verification.js';

import type { DB } from '../src/db/schema.js';
import { chainOf, chainRecord, withTriggerOff, type ChainRecord } from './helpers/audit.js';
import { hasPostgresServer, openPool } from './helpers/database.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';

let h: Harness;
const platform = tokens.platform();

beforeAll(async () => {
  h = await startHarness({}, { chain: 'open' });
  const audit = h.client.app.services.audit;
  await audit.appendMany([
    { event_type: 'tool.registered', actor: 'operator:ops', tenant_id: null, tool_id: 'web.fetch' },
    {
      event_type: 'grant.created',
      actor: 'operator:ops.a',
      tenant_id: 'tenant-a',
      agent_id: 'a.one',
      tool_id: 'web.fetch',
    },
    {
      event_type: 'run.step.dispatched',
      actor: 'agent:a.one',
      tenant_id: 'tenant-a',
      agent_id: 'a.one',
      run_id: 'run-1',
      tool_id: 'web.fetch',
      cost_units: 1.5,
      duration_ms: 12.25,
      details: { nested: { b: 2, a: 1 } },
    },
    {
      event_type: 'run.step.dispatched',
      actor: 'agent:b.one',
      tenant_id: 'tenant-b',
      agent_id: 'b.one',
      run_id: 'run-2',
      tool_id: 'web.fetch',
    },
  ]);
});
afterAll(() => h.close());

describe('GET /audit', () => {
  it('lists events newest first with every field of SPEC §8', async () => {
    const res = await h.client.get('/audit', { token: platform });
    expect(res.status).toBe(200);
    const seqs = res.body.items.map((e: { seq: number }) => e.seq);
    expect(seqs).toEqual([...seqs].sort((a: number, b: number) => b - a));
    const dispatched = res.body.items.find((e: { run_id: string }) => e.run_id === 'run-1');
    expect(dispatched).toMatchObject({
      cost_units: 1.5,
      duration_ms: 12.25,
      details: { nested: { a: 1, b: 2 } },
      tenant_id: 'tenant-a',
    });
    expect(dispatched.hash).toMatch(/^[0-9a-f]{64}$/);
  });

  it('filters by run, tool, agent, event type and time', async () => {
    const byRun = await h.client.get('/audit', { token: platform, query: { run_id: 'run-2' } });
    expect(byRun.body.items.map((e: { agent_id: string }) => e.agent_id)).toEqual(['b.one']);
    const byAgent = await h.client.get('/audit', { token: platform, query: { agent_id: 'a.one' } });
    expect(byAgent.body.items).toHaveLength(2);
    const byType = await h.client.get('/audit', { token: platform, query: { event_type: 'tool.registered' } });
    expect(byType.body.items).toHaveLength(1);
    const byTool = await h.client.get('/audit', {
      token: platform,
      query: { tool_id: 'web.fetch', tenant_id: 'tenant-b' },
    });
    expect(byTool.body.items).toHaveLength(1);
    const future = await h.client.get('/audit', {
      token: platform,
      query: { since: new Date(Date.now() + 60_000).toISOString() },
    });
    expect(future.body.items).toEqual([]);
    const past = await h.client.get('/audit', {
      token: platform,
      query: { until: new Date(Date.now() + 60_000).toISOString(), event_type: 'grant.created' },
    });
    expect(past.body.items).toHaveLength(1);
  });

  it('pages with an opaque cursor without repeating or skipping', async () => {
    const seen: number[] = [];
    let cursor: string | undefined;
    for (let page = 0; page < 10; page += 1) {
      const res = await h.client.get('/audit', { token: platform, query: { limit: 1, cursor } });
      seen.push(...res.body.items.map((e: { seq: number }) => e.seq));
      cursor = res.body.next_cursor ?? undefined;
      if (!cursor) break;
    }
    const all = await h.client.get('/audit', { token: platform, query: { limit: 500 } });
    expect(seen).toEqual(all.body.items.map((e: { seq: number }) => e.seq));
  });

  it('rejects bad filters with 400 invalid_request naming the field', async () => {
    const bad = await h.client.get('/audit', { token: platform, query: { limit: 0 } });
    expect(bad.status).toBe(400);
    expect(bad.body.error).toMatchObject({ code: 'invalid_request', message: expect.stringContaining('query.limit') });
    expect((await h.client.get('/audit', { token: platform, query: { cursor: '!!nope' } })).body.error.code).toBe(
      'invalid_request',
    );
    expect((await h.client.get('/audit', { token: platform, query: { since: 'yesterday' } })).status).toBe(400);
    expect((await h.client.get('/audit', { token: platform, query: { colour: 'blue' } })).status).toBe(400);
  });

  it('confines a tenant-operator to its own tenant', async () => {
    const own = await h.client.get('/audit', { token: tokens.tenantOperator('tenant-a') });
    expect(own.status).toBe(200);
    expect(own.body.items.length).toBeGreaterThan(0);
    expect(new Set(own.body.items.map((e: { tenant_id: string }) => e.tenant_id))).toEqual(new Set(['tenant-a']));
  });

  it('answers 404 to a tenant-operator naming another tenant, and records the attempt', async () => {
    const res = await h.client.get('/audit', {
      token: tokens.tenantOperator('tenant-a', 'mallory'),
      query: { tenant_id: 'tenant-b' },
    });
    expect(res.status).toBe(404);
    expect(res.body.error.code).toBe('not_found');
    expect(res.text).not.toContain('b.one');
    const events = await h.client.get('/audit', {
      token: platform,
      query: { event_type: 'security.cross_tenant_attempt' },
    });
    expect(events.body.items[0]).toMatchObject({
      actor: 'operator:mallory',
      tenant_id: 'tenant-a',
      details: { requested_tenant_id: 'tenant-b' },
    });
  });
});

describe("another tenant's object ids", () => {
  it('look to a tenant-operator exactly like invented ones, its own audit view included; platform-operators see the attempt', async () => {
    const owner = tokens.tenantOperator('tenant-owner', 'olive');
    const eve = tokens.tenantOperator('tenant-probe', 'eve');
    const ks = await h.client.post('/kill-switches', {
      token: owner,
      body: { scope: 'agent', target: 'owner.agent', reason: 'incident', user_visible_status_copy: 'Paused' },
    });
    const budget = await h.client.post('/budgets', {
      token: owner,
      body: { scope: 'tenant', period: 'day', limit_units: 10 },
    });
    expect([ks.status, budget.status]).toEqual([201, 201]);
    // Something of its own on record, so that an event added to its view would show.
    await h.client.post('/kill-switches', {
      token: eve,
      body: { scope: 'agent', target: 'probe.agent', reason: 'own', user_visible_status_copy: 'Paused' },
    });
    const ownView = async () => (await h.client.get('/audit', { token: eve, query: { limit: 500 } })).body;
    const before = await ownView();
    expect(before.items.length).toBeGreaterThan(0);

    const probes: Array<[string, string, Record<string, unknown> | undefined]> = [
      [`/kill-switches/${ks.body.id}`, '/kill-switches/ks_invented', undefined],
      [`/kill-switches/${ks.body.id}/disarm`, '/kill-switches/ks_invented/disarm', { reason: 'mine now' }],
      [`/budgets/${budget.body.id}`, '/budgets/bud_invented', undefined],
    ];
    for (const [real, invented, body] of probes) {
      const send = (url: string) =>
        body ? h.client.post(url, { token: eve, body }) : h.client.get(url, { token: eve });
      const a = await send(real);
      const b = await send(invented);
      expect([a.status, b.status]).toEqual([404, 404]);
      expect(a.body.error.message.replace(/\S+(?= not found)/, 'ID')).toBe(
        b.body.error.message.replace(/\S+(?= not found)/, 'ID'),
      );
      expect(await ownView()).toEqual(before);
    }

    const attempts = await h.client.get('/audit', {
      token: platform,
      query: { event_type: 'security.cross_tenant_attempt', limit: 500 },
    });
    const eves = attempts.body.items.filter((e: AuditRecord) => e.actor === 'operator:eve');
    expect(eves).toHaveLength(3);
    for (const event of eves) {
      expect(event).toMatchObject({
        tenant_id: null,
        status: 'denied',
        reason_code: 'not_found',
        details: { caller_tenant_id: 'tenant-probe' },
      });
    }
    expect(eves.map((e: AuditRecord) => e.details.route).sort()).toEqual([
      'GET /budgets/{id}',
      'GET /kill-switches/{id}',
      'POST /kill-switches/{id}/disarm',
    ]);
  });
});

describe('the append-only, hash-chained log', () => {
  it('verifies an intact chain', async () => {
    const res = await h.client.get('/audit/verify', { token: platform });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ ok: true, first_bad_seq: null });
    expect(res.body.checked).toBeGreaterThanOrEqual(4);
  });

  it('refuses UPDATE, DELETE and TRUNCATE in the database itself', async () => {
    const db = h.db.database.control;
    await expect(sql`update audit_events set actor = 'x' where seq = 1`.execute(db)).rejects.toThrow(/append-only/);
    await expect(sql`delete from audit_events where seq = 1`.execute(db)).rejects.toThrow(/append-only/);
    await expect(sql`truncate audit_events`.execute(db)).rejects.toThrow(/append-only/);
  });

  it('keeps the chain whole under many concurrent appends', async () => {
    const audit = h.client.app.services.audit;
    const records = await Promise.all(
      Array.from({ length: 300 }, (_, i) =>
        audit.append({ event_type: 'load.test', actor: 'system.test', details: { i } }),
      ),
    );
    const seqs = records.map((r) => r.seq).sort((a, b) => a - b);
    expect(new Set(seqs).size).toBe(300);
    expect(seqs[seqs.length - 1]! - seqs[0]!).toBe(299);
    expect((await verifyAuditChain(h.db.database.control)).ok).toBe(true);
  });

  it('verifies an intact chain while it is being appended to', async () => {
    const audit = h.client.app.services.audit;
    let appending = true;
    const appends = (async () => {
      while (appending) await audit.append({ event_type: 'verify.during.append', actor: 'system.test' });
    })();
    try {
      for (let i = 0; i < 20; i += 1)
        expect(await verifyAuditChain(h.db.database.control, 50)).toMatchObject({ ok: true });
    } finally {
      appending = false;
      await appends;
    }
  });

  it('keeps one chain when two writers take turns', async () => {
    const first = new AuditLog(h.db.database);
    const second = new AuditLog(h.db.database);
    for (let i = 0; i < 5; i += 1) {
      const a = await first.append({ event_type: 'turns.test', actor: 'system.first' });
      const b = await second.append({ event_type: 'turns.test', actor: 'system.second' });
      expect(b.seq).toBe(a.seq + 1);
      expect(b.prev_hash).toBe(a.hash);
    }
    expect((await verifyAuditChain(h.db.database.control)).ok).toBe(true);
  });

  it.skipIf(!hasPostgresServer)(
    'keeps one chain when several gateway instances append at once (needs a PostgreSQL server)',
    async () => {
      const others = await Promise.all([0, 1, 2].map(() => openPool(h.db.url, 5)));
      try {
        await Promise.all(
          others.flatMap((database, n) => {
            const log = new AuditLog(database);
            return Array.from({ length: 100 }, (_, i) =>
              log.append({ event_type: 'replica.test', actor: `system.replica${n}`, details: { i } }),
            );
          }),
        );
        const result = await verifyAuditChain(h.db.database.control);
        expect(result.ok).toBe(true);
      } finally {
        await Promise.all(others.map((d) => d.close()));
      }
    },
  );
});

// Tampering needs the trigger off, which only a superuser can do: this is the attacker's view.
describe('tamper evidence', () => {
  it('reports the first edited row', async () => {
    const db = h.db.database.control;
    const before = await verifyAuditChain(db);
    expect(before.ok).toBe(true);
    await sql`alter table audit_events disable trigger audit_events_no_update_delete`.execute(db);
    try {
      await sql`update audit_events set actor = 'operator:someone-else' where seq = 3`.execute(db);
    } finally {
      await sql`alter table audit_events enable trigger audit_events_no_update_delete`.execute(db);
    }
    const res = await h.client.get('/audit/verify', { token: platform });
    expect(chainOf(res.body)).toEqual({ ok: false, checked: 2, first_bad_seq: 3, head: null });
    expect(res.body.tree).toMatchObject({ ok: false, reason: 'record_changed' });
  });

  it('reports a deleted row as the first gap', async () => {
    const db = h.db.database.control;
    await sql`alter table audit_events disable trigger audit_events_no_update_delete`.execute(db);
    try {
      // A gap before the row edited above: the gap is reported, being earlier.
      await sql`delete from audit_events where seq = 2`.execute(db);
    } finally {
      await sql`alter table audit_events enable trigger audit_events_no_update_delete`.execute(db);
    }
    const res = await h.client.get('/audit/verify', { token: platform });
    expect(res.body).toMatchObject({ ok: false, first_bad_seq: 2 });
  });
});

/**
 * Inserts a copy of `template` at another place in the chain with a valid hash of its own, by a
 * plain INSERT: what anyone allowed to insert into audit_events can do without touching a trigger.
 */
async function insertForgedRow(
  db: Kysely<DB>,
  template: AuditRecord,
  at: Pick<ChainRecord, 'seq' | 'prev_hash'>,
): Promise<ChainRecord> {
  const { hash: _hash, hash_scheme: _scheme, ...unhashed } = template;
  const forged = { ...unhashed, ...at, event_id: randomUUID(), actor: 'operator:mallory' };
  const sealed = sealLinked(forged);
  await insertSealedRecords(db, [sealed.json]);
  return { ...forged, hash: sealed.hash, hash_scheme: HASH_SCHEME.linked };
}

// Each case tampers with a chain of its own, so that one case's evidence cannot mask another's.
describe('tamper evidence, each on a fresh chain', () => {
  async function withChain(
    test: (t: { h: Harness; db: Kysely<DB>; records: ChainRecord[] }) => Promise<void>,
  ): Promise<void> {
    const fresh = await startHarness({}, { chain: 'open' });
    try {
      const records = (
        await fresh.client.app.services.audit.appendMany(
          ['first', 'second', 'third'].map((n) => ({ event_type: 'chain.test', actor: `system.${n}` })),
        )
      ).map(chainRecord);
      await test({ h: fresh, db: fresh.db.database.control, records });
    } finally {
      await fresh.close();
    }
  }

  const verify = async (t: { h: Harness }) =>
    chainOf((await t.h.client.get('/audit/verify', { token: platform })).body);

  it('refuses a row below seq 1 in the database itself, however well it is chained', () =>
    withChain(async (t) => {
      for (const seq of [0, -1]) {
        await expect(insertForgedRow(t.db, t.records[0]!, { seq, prev_hash: GENESIS_HASH })).rejects.toThrow(
          /audit_events_seq_positive/,
        );
      }
    }));

  it('reports a row inserted below seq 1 as itself, even with the constraint dropped', () =>
    withChain(async (t) => {
      await sql`alter table audit_events drop constraint if exists audit_events_seq_positive`.execute(t.db);
      await insertForgedRow(t.db, t.records[0]!, { seq: 0, prev_hash: GENESIS_HASH });
      await insertForgedRow(t.db, t.records[0]!, { seq: -1, prev_hash: GENESIS_HASH });
      expect(await verify(t)).toEqual({ ok: false, checked: 0, first_bad_seq: -1, head: null });
      // GET /audit lists them as stored, as openapi.yaml describes a record, and pages on past them.
      const listed = await t.h.client.get('/audit', { token: platform });
      const stored = [...t.records.map((r) => r.seq).reverse(), 0, -1];
      expect(listed.body.items.map((e: AuditRecord) => e.seq)).toEqual(stored);
      const paged: number[] = [];
      let cursor: string | undefined;
      do {
        const page = await t.h.client.get('/audit', {
          token: platform,
          query: { limit: 2, ...(cursor ? { cursor } : {}) },
        });
        expect(page.status, page.text).toBe(200);
        paged.push(...page.body.items.map((e: AuditRecord) => e.seq));
        cursor = page.body.next_cursor ?? undefined;
      } while (cursor);
      expect(paged).toEqual(stored);
    }));

  it('reports a record whose hash scheme was changed, to one it does not know or to hashing it whole', () =>
    withChain(async (t) => {
      const second = t.records[1]!;
      expect(second.hash_scheme).toBe(2);
      await withTriggerOff(t.db, () =>
        sql`update audit_events set hash_scheme = 1 where seq = ${second.seq}`.execute(t.db),
      );
      expect(await verify(t)).toMatchObject({ ok: false, first_bad_seq: second.seq });
      await sql`alter table audit_events drop constraint audit_events_hash_scheme_known`.execute(t.db);
      await withTriggerOff(t.db, () =>
        sql`update audit_events set hash_scheme = 3 where seq = ${second.seq}`.execute(t.db),
      );
      expect(await verify(t)).toMatchObject({ ok: false, first_bad_seq: second.seq });
    }));

  it('reports a row appended past the chain head as that row', () =>
    withChain(async (t) => {
      const head = await readChainHead(t.db);
      await insertForgedRow(t.db, t.records[0]!, { seq: head.seq + 1, prev_hash: head.hash });
      expect(await verify(t)).toEqual({ ok: false, checked: head.seq, first_bad_seq: head.seq + 1, head: null });
    }));

  it('reports a last row replaced by a well-chained forgery as that row', () =>
    withChain(async (t) => {
      const [, second, third] = t.records;
      await withTriggerOff(t.db, () => sql`delete from audit_events where seq = ${third!.seq}`.execute(t.db));
      await insertForgedRow(t.db, third!, { seq: third!.seq, prev_hash: second!.hash });
      expect(await verify(t)).toEqual({ ok: false, checked: second!.seq, first_bad_seq: third!.seq, head: null });
    }));

  it('reports rows cut off at the tail as the first missing seq', () =>
    withChain(async (t) => {
      const [, second, third] = t.records;
      await withTriggerOff(t.db, () => sql`delete from audit_events where seq = ${third!.seq}`.execute(t.db));
      expect(await verify(t)).toEqual({ ok: false, checked: second!.seq, first_bad_seq: third!.seq, head: null });
    }));

  it('reports an edit of occurred_at by less than a millisecond', () =>
    withChain(async (t) => {
      const [first, second] = t.records;
      // The hash covers occurred_at to the millisecond, as a Date holds it: the part of a
      // millisecond the column also keeps is checked on its own (rows are written from Dates).
      await withTriggerOff(t.db, () =>
        sql`update audit_events set occurred_at = occurred_at + interval '1 microsecond' where seq = ${second!.seq}`.execute(
          t.db,
        ),
      );
      expect(await verify(t)).toEqual({ ok: false, checked: first!.seq, first_bad_seq: second!.seq, head: null });
    }));

  it('reports an occurred_at no JavaScript Date can hold instead of failing', () =>
    withChain(async (t) => {
      const [first, second] = t.records;
      await withTriggerOff(t.db, () =>
        sql`update audit_events set occurred_at = 'infinity' where seq = ${second!.seq}`.execute(t.db),
      );
      expect(await verify(t)).toEqual({ ok: false, checked: first!.seq, first_bad_seq: second!.seq, head: null });
    }));

  it('lists a row whose occurred_at no RFC 3339 time can write, with occurred_at null, instead of failing', () =>
    withChain(async (t) => {
      const [first, second, third] = t.records;
      await withTriggerOff(t.db, async () => {
        await sql`update audit_events set occurred_at = 'infinity' where seq = ${second!.seq}`.execute(t.db);
        await sql`update audit_events set occurred_at = '-infinity' where seq = ${third!.seq}`.execute(t.db);
        await sql`update audit_events set occurred_at = '12000-01-01T00:00:00Z' where seq = ${first!.seq}`.execute(
          t.db,
        );
      });
      const res = await t.h.client.get('/audit', { token: platform });
      expect(res.status).toBe(200);
      expect(res.body.items.map((e: AuditRecord) => [e.seq, e.occurred_at, e.hash])).toEqual([
        [third!.seq, null, third!.hash],
        [second!.seq, null, second!.hash],
        [first!.seq, null, first!.hash],
      ]);
      // The time filters still place such a row where the database does.
      const future = await t.h.client.get('/audit', { token: platform, query: { since: new Date().toISOString() } });
      expect(future.body.items.map((e: AuditRecord) => e.seq).sort()).toEqual([first!.seq, second!.seq]);
      expect(await verify(t)).toEqual({ ok: false, checked: 0, first_bad_seq: first!.seq, head: null });
    }));

  it('reports a number in details edited beyond what a double can tell apart', () =>
    withChain(async (t) => {
      const [first] = await t.h.client.app.services.audit.appendMany([
        { event_type: 'chain.test', actor: 'system.numbers', details: { units: 1, nested: { list: [0.1, 2] } } },
        { event_type: 'chain.test', actor: 'system.numbers', details: { units: 1 } },
      ]);
      expect(await verify(t)).toMatchObject({ ok: true });
      await withTriggerOff(t.db, () =>
        sql`update audit_events set details = jsonb_set(details, '{nested,list,0}', '0.1000000000000000000001') where seq = ${first!.seq}`.execute(
          t.db,
        ),
      );
      expect(await verify(t)).toEqual({ ok: false, checked: first!.seq - 1, first_bad_seq: first!.seq, head: null });
      // Compared page by page, the row found on whichever page it falls.
      for (const pageSize of [1, 2, 3]) {
        expect(await verifyAuditChain(t.db, pageSize)).toEqual({
          ok: false,
          checked: first!.seq - 1,
          first_bad_seq: first!.seq,
          head: null,
        });
      }
    }));

  it('reports a null in details replaced by a number too large for a double', () =>
    withChain(async (t) => {
      const [extra] = await t.h.client.app.services.audit.appendMany([
        { event_type: 'chain.test', actor: 'system.numbers', details: { limit: null } },
      ]);
      await withTriggerOff(t.db, () =>
        sql`update audit_events set details = '{"limit": 1e400}' where seq = ${extra!.seq}`.execute(t.db),
      );
      expect(await verify(t)).toEqual({ ok: false, checked: extra!.seq - 1, first_bad_seq: extra!.seq, head: null });
    }));

  it('reports a null cost or duration edited to NaN or infinity, which hash as null', () =>
    withChain(async (t) => {
      const [first, second] = t.records;
      await withTriggerOff(t.db, async () => {
        await sql`update audit_events set cost_units = 'NaN' where seq = ${second!.seq}`.execute(t.db);
        await sql`update audit_events set duration_ms = '-Infinity' where seq = ${second!.seq + 1}`.execute(t.db);
      });
      expect(await verify(t)).toEqual({ ok: false, checked: first!.seq, first_bad_seq: second!.seq, head: null });
    }));

  it('verifies numbers a double holds exactly, however they are written', () =>
    withChain(async (t) => {
      // eslint-disable-next-line no-loss-of-precision -- a literal longer than a double holds is the point
      const awkward = [0.1 + 0.2, 1e21, 2 ** 64, 5e-324, -0, 1.7976931348623157e308, 123456789.123456789, -1e-7];
      await t.h.client.app.services.audit.appendMany([
        {
          event_type: 'chain.test',
          actor: 'system.numbers',
          cost_units: 0.1 + 0.2,
          duration_ms: 1e-7,
          details: { awkward, deep: { awkward } },
        },
      ]);
      expect(await verify(t)).toMatchObject({ ok: true, first_bad_seq: null });
    }));

  it('verifies strings that JSON must escape, in every text column, and finds one of them edited', () =>
    withChain(async (t) => {
      const awkward =
        'quote " backslash \\ tab \t newline \n nul-ish \u0001 \u001f del \u007f sep \u2028 é 漢 🦊 </script>';
      const [record] = await t.h.client.app.services.audit.appendMany([
        {
          event_type: `chain.${awkward}`,
          actor: `system.${awkward}`,
          tenant_id: awkward,
          reason_code: awkward,
          tool_id: awkward,
          trace_id: awkward,
          details: { [awkward]: awkward },
        },
      ]);
      expect(await verify(t)).toMatchObject({ ok: true, first_bad_seq: null });
      // One character changed in one column, to another that escapes alike.
      await withTriggerOff(t.db, () =>
        sql`update audit_events set reason_code = replace(reason_code, '\u0001', '\u0002') where seq = ${record!.seq}`.execute(
          t.db,
        ),
      );
      expect(await verify(t)).toMatchObject({ ok: false, first_bad_seq: record!.seq });
    }));

  const verifyWith = async (t: { h: Harness }, anchor: { seq: number; hash: string }) =>
    chainOf(
      (
        await t.h.client.get('/audit/verify', {
          token: platform,
          query: { anchor_seq: anchor.seq, anchor_hash: anchor.hash },
        })
      ).body,
    );

  /** Replaces the chain from `from` on with well-chained forgeries and moves the head onto them. */
  async function forgeTail(db: Kysely<DB>, records: ChainRecord[], from: number): Promise<ChainRecord[]> {
    await withTriggerOff(db, () => sql`delete from audit_events where seq >= ${from}`.execute(db));
    const forged: ChainRecord[] = [];
    let prev = records.find((r) => r.seq === from - 1)?.hash ?? GENESIS_HASH;
    for (const template of records.filter((r) => r.seq >= from)) {
      const row = await insertForgedRow(db, template, { seq: template.seq, prev_hash: prev });
      forged.push(row);
      prev = row.hash;
    }
    const last = forged[forged.length - 1]!;
    await sql`update audit_chain_head set seq = ${last.seq}, hash = ${last.hash} where id = 1`.execute(db);
    return forged;
  }

  it('answers the head of the chain it verified: its last row', () =>
    withChain(async (t) => {
      const third = t.records[2]!;
      const res = await verify(t);
      expect(res).toMatchObject({ ok: true, first_bad_seq: null, head: { seq: third.seq, hash: third.hash } });
      expect(res.head).toEqual(await readChainHead(t.db));
      expect(res.checked).toBe(third.seq);
      expect(res).not.toHaveProperty('anchor');
    }));

  it('answers no head for an empty log, and an anchor there as missing', async () => {
    const empty = await startHarness({}, { chain: 'open' });
    try {
      expect(await readChainHead(empty.db.database.control)).toEqual({ seq: 0, hash: GENESIS_HASH });
      expect(await verify({ h: empty })).toEqual({ ok: true, checked: 0, first_bad_seq: null, head: null });
      expect(await verifyWith({ h: empty }, { seq: 1, hash: 'a'.repeat(64) })).toEqual({
        ok: false,
        checked: 0,
        first_bad_seq: 1,
        head: null,
        anchor: { seq: 1, ok: false, reason: 'missing' },
      });
    } finally {
      await empty.close();
    }
  });

  it('holds an anchor across honest appends made after it', () =>
    withChain(async (t) => {
      const anchor = (await verify(t)).head;
      const [, later] = await t.h.client.app.services.audit.appendMany([
        { event_type: 'chain.test', actor: 'system.fourth' },
        { event_type: 'chain.test', actor: 'system.fifth' },
      ]);
      expect(await verifyWith(t, anchor)).toEqual({
        ok: true,
        checked: later!.seq,
        first_bad_seq: null,
        head: { seq: later!.seq, hash: later!.hash },
        anchor: { seq: anchor.seq, ok: true, reason: null },
      });
      // An anchor below the head holds as well.
      const first = t.records[0]!;
      expect(await verifyWith(t, first)).toMatchObject({
        ok: true,
        anchor: { seq: first.seq, ok: true, reason: null },
      });
    }));

  it('reports a forged tail with the head moved onto it, which verifies without an anchor, as a hash mismatch', () =>
    withChain(async (t) => {
      const [first, second, third] = t.records;
      const anchor = (await verify(t)).head;
      expect(anchor).toEqual({ seq: third!.seq, hash: third!.hash });
      const forged = await forgeTail(t.db, t.records, second!.seq);
      // The attack: without an anchor the forgery is an intact chain, head and all.
      expect(await verify(t)).toEqual({
        ok: true,
        checked: third!.seq,
        first_bad_seq: null,
        head: { seq: third!.seq, hash: forged[1]!.hash },
      });
      expect(await verifyWith(t, anchor)).toEqual({
        ok: false,
        checked: third!.seq - 1,
        first_bad_seq: third!.seq,
        head: null,
        anchor: { seq: third!.seq, ok: false, reason: 'hash_mismatch' },
      });
      // Page by page alike.
      for (const pageSize of [1, 2]) {
        expect(await verifyAuditChain(t.db, pageSize, anchor)).toMatchObject({
          ok: false,
          first_bad_seq: third!.seq,
          anchor: { reason: 'hash_mismatch' },
        });
      }
      // An older anchor, of a row kept, still holds: the rewrite began after it.
      expect(await verifyWith(t, first!)).toMatchObject({
        ok: true,
        anchor: { seq: first!.seq, ok: true, reason: null },
      });
      expect(await verifyWith(t, second!)).toMatchObject({
        ok: false,
        first_bad_seq: second!.seq,
        anchor: { reason: 'hash_mismatch' },
      });
    }));

  it('reports rows cut off below the anchor, with the head moved back, as missing', () =>
    withChain(async (t) => {
      const [first, , third] = t.records;
      const anchor = { seq: third!.seq, hash: third!.hash };
      await withTriggerOff(t.db, () => sql`delete from audit_events where seq > ${first!.seq}`.execute(t.db));
      await sql`update audit_chain_head set seq = ${first!.seq}, hash = ${first!.hash} where id = 1`.execute(t.db);
      expect(await verify(t)).toMatchObject({ ok: true, head: { seq: first!.seq, hash: first!.hash } });
      expect(await verifyWith(t, anchor)).toEqual({
        ok: false,
        checked: first!.seq,
        first_bad_seq: first!.seq + 1,
        head: null,
        anchor: { seq: third!.seq, ok: false, reason: 'missing' },
      });
    }));

  it('reports an anchor the chain breaks before as not held, and the break as the first bad seq', () =>
    withChain(async (t) => {
      const [first, second, third] = t.records;
      await withTriggerOff(t.db, () =>
        sql`update audit_events set actor = 'operator:mallory' where seq = ${second!.seq}`.execute(t.db),
      );
      // The anchored row itself is untouched, hash and all.
      expect(await verifyWith(t, third!)).toEqual({
        ok: false,
        checked: first!.seq,
        first_bad_seq: second!.seq,
        head: null,
        anchor: { seq: third!.seq, ok: false, reason: 'chain_broken' },
      });
      // An anchor below the break holds; the chain still does not.
      expect(await verifyWith(t, first!)).toEqual({
        ok: false,
        checked: first!.seq,
        first_bad_seq: second!.seq,
        head: null,
        anchor: { seq: first!.seq, ok: true, reason: null },
      });
    }));

  it('refuses a malformed or half-given anchor with 400 invalid_request naming the field', () =>
    withChain(async (t) => {
      const hash = t.records[0]!.hash;
      const cases: [Record<string, string>, string][] = [
        [{ anchor_seq: '0', anchor_hash: hash }, 'query.anchor_seq'],
        [{ anchor_seq: '-1', anchor_hash: hash }, 'query.anchor_seq'],
        [{ anchor_seq: '1.5', anchor_hash: hash }, 'query.anchor_seq'],
        [{ anchor_seq: '1e3', anchor_hash: hash }, 'query.anchor_seq'],
        [{ anchor_seq: ' 1', anchor_hash: hash }, 'query.anchor_seq'],
        [{ anchor_seq: '9007199254740993', anchor_hash: hash }, 'query.anchor_seq'],
        [{ anchor_seq: '1', anchor_hash: hash.toUpperCase() }, 'query.anchor_hash'],
        [{ anchor_seq: '1', anchor_hash: hash.slice(1) }, 'query.anchor_hash'],
        [{ anchor_seq: '1' }, 'query.anchor_hash'],
        [{ anchor_hash: hash }, 'query.anchor_seq'],
        [{ anchor: hash }, 'query'],
      ];
      for (const [query, field] of cases) {
        const res = await t.h.client.get('/audit/verify', { token: platform, query });
        expect(res.status, JSON.stringify(query)).toBe(400);
        expect(res.body.error).toMatchObject({ code: 'invalid_request', message: expect.stringContaining(field) });
      }
    }));
});
