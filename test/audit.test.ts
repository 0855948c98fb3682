import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AuditLog } from '../src/audit/audit-log.js';
import { verifyAuditChain } from '../src/audit/audit-repository.js';
import { openDatabase } from '../src/db/database.js';
import { pino } from 'pino';
import { hasPostgresServer } from './helpers/database.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';

let h: Harness;
const platform = tokens.platform();

beforeAll(async () => {
  h = await startHarness();
  const audit = h.client.app.services.audit;
  await audit.appendMany([
    { event_type: 'tool.registered', actor: 'operator:ops', tenant_id: null, tool_id: 'web.fetch' },
    { event_type: 'grant.created', actor: 'operator:ops.a', tenant_id: 'tenant-a', agent_id: 'a.one', tool_id: 'web.fetch' },
    { event_type: 'run.step.dispatched', actor: 'agent:a.one', tenant_id: 'tenant-a', agent_id: 'a.one', run_id: 'run-1', tool_id: 'web.fetch', cost_units: 1.5, duration_ms: 12.25, details: { nested: { b: 2, a: 1 } } },
    { event_type: 'run.step.dispatched', actor: 'agent:b.one', tenant_id: 'tenant-b', agent_id: 'b.one', run_id: 'run-2', tool_id: 'web.fetch' },
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
    expect(dispatched).toMatchObject({ cost_units: 1.5, duration_ms: 12.25, details: { nested: { a: 1, b: 2 } }, tenant_id: 'tenant-a' });
    expect(dispatched.hash).toMatch(/^[0-9a-f]{64}$/);
  });

  it('filters by run, tool, agent, event type and time', async () => {
    const byRun = await h.client.get('/audit', { token: platform, query: { run_id: 'run-2' } });
    expect(byRun.body.items.map((e: { agent_id: string }) => e.agent_id)).toEqual(['b.one']);
    const byAgent = await h.client.get('/audit', { token: platform, query: { agent_id: 'a.one' } });
    expect(byAgent.body.items).toHaveLength(2);
    const byType = await h.client.get('/audit', { token: platform, query: { event_type: 'tool.registered' } });
    expect(byType.body.items).toHaveLength(1);
    const byTool = await h.client.get('/audit', { token: platform, query: { tool_id: 'web.fetch', tenant_id: 'tenant-b' } });
    expect(byTool.body.items).toHaveLength(1);
    const future = await h.client.get('/audit', { token: platform, query: { since: new Date(Date.now() + 60_000).toISOString() } });
    expect(future.body.items).toEqual([]);
    const past = await h.client.get('/audit', { token: platform, query: { until: new Date(Date.now() + 60_000).toISOString(), event_type: 'grant.created' } });
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
    expect((await h.client.get('/audit', { token: platform, query: { cursor: '!!nope' } })).body.error.code).toBe('invalid_request');
    expect((await h.client.get('/audit', { token: platform, query: { since: 'yesterday' } })).status).toBe(400);
    expect((await h.client.get('/audit', { token: platform, query: { colour: 'blue' } })).status).toBe(400);
  });

  it('confines a tenant-operator to its own tenant', async () => {
    const own = await h.client.get('/audit', { token: tokens.tenantOperator('tenant-a') });
    expect(own.status).toBe(200);
    expect(own.body.items.length).toBeGreaterThan(0);
    expect(new Set(own.body.items.map((e: { tenant_id: string }) => e.tenant_id))).toEqual(new Set(['tenant-a']));
  });

  it("answers 404 to a tenant-operator naming another tenant, and records the attempt", async () => {
    const res = await h.client.get('/audit', { token: tokens.tenantOperator('tenant-a', 'mallory'), query: { tenant_id: 'tenant-b' } });
    expect(res.status).toBe(404);
    expect(res.body.error.code).toBe('not_found');
    expect(res.text).not.toContain('b.one');
    const events = await h.client.get('/audit', { token: platform, query: { event_type: 'security.cross_tenant_attempt' } });
    expect(events.body.items[0]).toMatchObject({ actor: 'operator:mallory', tenant_id: 'tenant-a', details: { requested_tenant_id: 'tenant-b' } });
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
    const db = h.db.database.db;
    await expect(sql`update audit_events set actor = 'x' where seq = 1`.execute(db)).rejects.toThrow(/append-only/);
    await expect(sql`delete from audit_events where seq = 1`.execute(db)).rejects.toThrow(/append-only/);
    await expect(sql`truncate audit_events`.execute(db)).rejects.toThrow(/append-only/);
  });

  it('keeps the chain whole under many concurrent appends', async () => {
    const audit = h.client.app.services.audit;
    const records = await Promise.all(
      Array.from({ length: 300 }, (_, i) => audit.append({ event_type: 'load.test', actor: 'system.test', details: { i } })),
    );
    const seqs = records.map((r) => r.seq).sort((a, b) => a - b);
    expect(new Set(seqs).size).toBe(300);
    expect(seqs[seqs.length - 1]! - seqs[0]!).toBe(299);
    expect((await verifyAuditChain(h.db.database.db)).ok).toBe(true);
  });

  it('keeps one chain when two writers take turns, each holding a stale head', async () => {
    const first = new AuditLog(h.db.database.db);
    const second = new AuditLog(h.db.database.db);
    for (let i = 0; i < 5; i += 1) {
      const a = await first.append({ event_type: 'turns.test', actor: 'system.first' });
      const b = await second.append({ event_type: 'turns.test', actor: 'system.second' });
      expect(b.seq).toBe(a.seq + 1);
      expect(b.prev_hash).toBe(a.hash);
    }
    expect((await verifyAuditChain(h.db.database.db)).ok).toBe(true);
  });

  it.skipIf(!hasPostgresServer)('keeps one chain when several gateway instances append at once (needs a PostgreSQL server)', async () => {
    const others = await Promise.all(
      [0, 1, 2].map(() => openDatabase({ databaseUrl: h.db.url, dataDir: '', poolSize: 5, logger: pino({ level: 'silent' }) })),
    );
    try {
      await Promise.all(
        others.flatMap((database, n) => {
          const log = new AuditLog(database.db);
          return Array.from({ length: 100 }, (_, i) => log.append({ event_type: 'replica.test', actor: `system.replica${n}`, details: { i } }));
        }),
      );
      const result = await verifyAuditChain(h.db.database.db);
      expect(result.ok).toBe(true);
    } finally {
      await Promise.all(others.map((d) => d.close()));
    }
  });
});

// Tampering needs the trigger off, which only a superuser can do: this is the attacker's view.
describe('tamper evidence', () => {
  it('reports the first edited row', async () => {
    const db = h.db.database.db;
    const before = await verifyAuditChain(db);
    expect(before.ok).toBe(true);
    await sql`alter table audit_events disable trigger audit_events_no_update_delete`.execute(db);
    try {
      await sql`update audit_events set actor = 'operator:someone-else' where seq = 3`.execute(db);
    } finally {
      await sql`alter table audit_events enable trigger audit_events_no_update_delete`.execute(db);
    }
    const res = await h.client.get('/audit/verify', { token: platform });
    expect(res.body).toEqual({ ok: false, checked: 2, first_bad_seq: 3 });
  });

  it('reports a deleted row as the first gap', async () => {
    const db = h.db.database.db;
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
