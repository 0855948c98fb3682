import pg from 'pg';
import { pino } from 'pino';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { closeAuditChain, writeAuditEvents } from '../src/audit/audit-repository.js';
import { openDatabase, type Database } from '../src/db/database.js';
import { withTriggerOff } from './helpers/audit.js';
import { TestBackend } from './helpers/backend.js';
import { hasPostgresServer } from './helpers/database.js';
import { AppClient, startHarness, type Harness } from './helpers/harness.js';
import { execute, step } from './helpers/runs.js';
import { tokens } from './helpers/tokens.js';
import { until } from './helpers/waits.js';
import { createBudget, grantTool, newRunId, registerTool } from './helpers/world.js';

/*
 * Once the linear chain is closed, a record is a plain INSERT (SPEC §8.1 "Writing"): no lock that every
 * append shares, seqs from a sequence, and the sequencer finds records whatever order they commit in.
 */
describe.skipIf(!hasPostgresServer)('leaf records after the chain is closed (needs a PostgreSQL server)', () => {
  const T = 'tenant-leaves';
  const AGENT = 'leaves.agent';
  const agent = tokens.agent(AGENT, { tenant: T });
  const platform = tokens.platform();
  let h: Harness;
  let backend: TestBackend;
  let chainEnd: { seq: number; hash: string };
  let replica: { database: Database; client: AppClient };
  let budgetId: string;

  const leafOf = async (eventId: string) =>
    (await h.client.get(`/audit/events/${eventId}`, { token: platform })).body as {
      record: { event_id: string };
      seq: number;
      leaf_index: number | null;
    };

  beforeAll(async () => {
    // The chain open at first: what a log written before its closing holds.
    h = await startHarness({ TOOLGATE_AUDIT_SEQUENCE_INTERVAL_MS: '50' }, { chain: 'open' });
    backend = await new TestBackend().start();
    await registerTool(h.client, {
      id: 'leaves.echo',
      backendUrl: `${backend.url}/echo`,
      allowed_agents: [AGENT],
      cost_units: 1,
    });
    await grantTool(h.client, { tenant: T, agent: AGENT, tool: 'leaves.echo' });
    budgetId = (await createBudget(h.client, { tenant: T, limit_units: 1000 })).id;
    // One charged call while the chain is open: this process appends linked records until it finds the chain closed.
    expect((await execute(h.client, agent, { run_id: newRunId('open'), plan: [step('leaves.echo')] })).status).toBe(
      200,
    );
    chainEnd = await closeAuditChain(h.db.database.control);
    const database = await openDatabase({
      databaseUrl: h.db.url,
      dataDir: '',
      poolSize: 10,
      logger: pino({ level: 'silent' }),
    });
    replica = { database, client: await AppClient.start(database) };
    await until(
      'the other replica to know the tool',
      () => replica.client.app.services.catalog.resolve('leaves.echo').ok,
    );
  });

  afterAll(async () => {
    await replica?.client.close();
    await replica?.database.close();
    await h?.close();
    await backend?.close();
  });

  it('closes once, at the head the chain reached, and numbers records after it', async () => {
    // The first append after the closing is tried linked, writes nothing, and goes in as leaf records, charged once.
    const first = await execute(h.client, agent, { run_id: newRunId('closed'), plan: [step('leaves.echo')] });
    expect(first.status, JSON.stringify(first.body)).toBe(200);
    const usage = await h.client.get(`/budgets/${budgetId}`, { token: platform });
    expect(usage.body).toMatchObject({ spent_units: 2, reserved_units: 0 });
    expect(chainEnd.seq).toBeGreaterThan(0);
    expect(await closeAuditChain(h.db.database.control)).toEqual(chainEnd);
    const [record] = await h.client.app.services.audit.appendMany([
      { event_type: 'leaves.test', actor: 'system.test' },
    ]);
    expect(record).toMatchObject({ hash_scheme: 3, prev_hash: null, hash: null });
    expect(record!.seq).toBeGreaterThan(chainEnd.seq);
  });

  it("writes a call's records while another transaction holds the chain head", async () => {
    const holder = new pg.Client({ connectionString: h.db.url });
    await holder.connect();
    try {
      await holder.query('begin');
      await holder.query('select * from audit_chain_head where id = 1 for update');
      const runId = newRunId('leaves');
      const call = execute(h.client, agent, { run_id: runId, plan: [step('leaves.echo', 'held')] });
      // An append that waited on the head would wait until the holder ends: the call answers first.
      const answered = await Promise.race([
        call.then(() => true),
        new Promise<boolean>((resolve) => setTimeout(() => resolve(false), 20_000)),
      ]);
      expect(answered).toBe(true);
      expect((await call).status).toBe(200);
      const records = await h.client.get('/audit', { token: platform, query: { run_id: runId } });
      expect(records.body.items.map((r: { hash_scheme: number }) => r.hash_scheme)).toEqual(
        records.body.items.map(() => 3),
      );
      expect(records.body.items.length).toBeGreaterThanOrEqual(2);
    } finally {
      await holder.query('rollback').catch(() => undefined);
      await holder.end();
    }
  });

  it('sequences a record that commits after one with a later seq', async () => {
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let early: { seq: number; event_id: string } | undefined;
    const held = h.db.database.control.transaction().execute(async (trx) => {
      [early] = await writeAuditEvents(trx, [
        { event: { event_type: 'leaves.test', actor: 'system.test', details: { late: true } }, occurredAt: new Date() },
      ]);
      await gate;
    });
    await until('the held record to be written', () => early !== undefined);
    const [later] = await h.client.app.services.audit.appendMany([{ event_type: 'leaves.test', actor: 'system.test' }]);
    expect(later!.seq).toBeGreaterThan(early!.seq);
    await until('the later record to be sequenced', async () => (await leafOf(later!.event_id)).leaf_index !== null);
    release();
    await held;
    await until('the earlier record to be sequenced', async () => (await leafOf(early!.event_id)).leaf_index !== null);
    const [a, b] = [await leafOf(early!.event_id), await leafOf(later!.event_id)];
    expect(a.leaf_index!).toBeGreaterThan(b.leaf_index!);
    const verified = await h.client.get('/audit/verify', { token: platform });
    expect(verified.body).toMatchObject({ ok: true, tree: { ok: true } });
  });

  it('keeps every call of two replicas exactly: one intent and one outcome each, every one a leaf', async () => {
    const runs = Array.from({ length: 60 }, (_, i) => ({ client: i % 2 === 0 ? h.client : replica.client, i }));
    const answers = await Promise.all(
      runs.map(({ client, i }) =>
        execute(client, agent, { run_id: newRunId(`pair-${i}`), plan: [step('leaves.echo', `c${i}`)] }),
      ),
    );
    expect(answers.map((a) => a.status)).toEqual(answers.map(() => 200));
    const db = h.db.database.control;
    const counts = await sql<{ event_type: string; n: number }>`
      select event_type, count(*)::int as n from audit_events
      where tenant_id = ${T} and run_id like 'pair-%' and tool_call_id is not null
      group by event_type order by event_type`.execute(db);
    expect(counts.rows).toEqual([
      { event_type: 'run.step.completed', n: 60 },
      { event_type: 'run.step.dispatching', n: 60 },
    ]);
    await until('every record to be a leaf', async () => {
      const { rows } = await sql<{ records: number; leaves: number; queued: number }>`
        select (select count(*)::int from audit_events) as records, (select count(*)::int from audit_leaves) as leaves,
          (select count(*)::int from audit_unsequenced) as queued`.execute(db);
      return rows[0]!.records === rows[0]!.leaves && rows[0]!.queued === 0;
    });
    const { rows } = await sql<{ n: number }>`
      select count(*)::int as n from (select event_id from audit_leaves group by event_id having count(*) > 1) d`.execute(
      db,
    );
    expect(rows[0]!.n).toBe(0);
  });

  it('verifies the chain up to where it closed by the old walk, and every record as a leaf', async () => {
    const verified = await h.client.get('/audit/verify', { token: platform });
    expect(verified.body).toMatchObject({ ok: true, checked: chainEnd.seq, head: chainEnd, tree: { ok: true } });
    const db = h.db.database.control;
    const leaf = await db
      .selectFrom('audit_leaves')
      .select(['leaf_index', 'seq'])
      .where('seq', '>', String(chainEnd.seq))
      .orderBy('leaf_index')
      .executeTakeFirstOrThrow();
    await withTriggerOff(db, () =>
      sql`update audit_events set actor = 'operator:mallory' where seq = ${leaf.seq}`.execute(db),
    );
    const tampered = await h.client.get('/audit/verify', { token: platform });
    expect(tampered.body).toMatchObject({
      ok: false,
      head: chainEnd,
      tree: { ok: false, first_bad_leaf_index: Number(leaf.leaf_index), reason: 'record_changed' },
    });
  });
});
