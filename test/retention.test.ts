import { Kysely, PostgresDialect, sql } from 'kysely';
import pg from 'pg';
import { pino } from 'pino';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RetentionSweeper, type RetentionSweep } from '../src/retention/retention-sweeper.js';
import type { DB } from '../src/db/schema.js';
import { TestBackend } from './helpers/backend.js';
import { hasPostgresServer } from './helpers/database.js';
import { AppClient, startHarness, type Harness } from './helpers/harness.js';
import { ManualClock, startClient } from './helpers/manual-clock.js';
import { execute, step } from './helpers/runs.js';
import { tokens } from './helpers/tokens.js';
import { createBudget, grantTool, newRunId, registerTool } from './helpers/world.js';
import { until } from './helpers/waits.js';

// Retention: a finished run tree goes, with every row kept only for it, TOOLGATE_RETENTION_DAYS
// after it finished. Runs, reservations and the rest are aged here by moving their timestamps
// back, as 100 days of waiting would.
const T = 'tenant-retention';
const AGENT = 'veritas.keeper';
const SUB = 'sophia.helper';
const operator = tokens.tenantOperator(T);
const as = (agentId: string) => tokens.agent(agentId, { tenant: T });

let h: Harness;
let backend: TestBackend;

function sweeper(options: { batchSize?: number; now?: () => Date } = {}): RetentionSweeper {
  return new RetentionSweeper({
    database: h.db.database,
    now: () => new Date(),
    retentionDays: 90,
    intervalMs: 60_000,
    logger: pino({ level: 'silent' }),
    registry: new Registry(),
    ...options,
  });
}

/** Moves a run's timestamps, and its reservations', `days` into the past. */
async function age(runIds: string[], days: number): Promise<void> {
  const db = h.db.database.control;
  const back = sql`make_interval(days => ${days})`;
  await sql`update runs set created_at = created_at - ${back}, updated_at = updated_at - ${back} where tenant_id = ${T} and run_id = any(${runIds}::text[])`.execute(
    db,
  );
  await sql`update budget_reservations set reserved_at = reserved_at - ${back}, expires_at = expires_at - ${back}, closed_at = closed_at - ${back}
            where tenant_id = ${T} and run_id = any(${runIds}::text[])`.execute(db);
}

/** How many rows each per-call table holds for these runs. */
async function rowsOf(runIds: string[]): Promise<Record<string, number>> {
  const db = h.db.database.control;
  const counters = runIds.map((id) => `run/${T}/${id}`);
  const result = await sql<Record<string, string>>`
    select
      (select count(*) from runs where tenant_id = ${T} and run_id = any(${runIds}::text[])) as runs,
      (select count(*) from approvals where tenant_id = ${T} and run_id = any(${runIds}::text[])) as approvals,
      (select count(*) from handoffs where tenant_id = ${T} and (sub_run_id = any(${runIds}::text[]) or parent_run_id = any(${runIds}::text[]))) as handoffs,
      (select count(*) from run_grant_uses where tenant_id = ${T} and run_id = any(${runIds}::text[])) as run_grant_uses,
      (select count(*) from budget_reservations where tenant_id = ${T} and run_id = any(${runIds}::text[])) as budget_reservations,
      (select count(*) from budget_counters where counter_key = any(${counters}::text[])) as budget_counters`.execute(
    db,
  );
  return Object.fromEntries(Object.entries(result.rows[0]!).map(([k, v]) => [k, Number(v)]));
}

async function auditCount(): Promise<number> {
  const result = await sql<{ n: string }>`select count(*) as n from audit_events`.execute(h.db.database.control);
  return Number(result.rows[0]!.n);
}

const spentOf = async (budgetId: string) =>
  (await h.client.get(`/budgets/${budgetId}`, { token: operator })).body.spent_units as number;

beforeAll(async () => {
  h = await startHarness();
  backend = await new TestBackend().start();
  const everyone = { allowed_agents: [AGENT, SUB] };
  await registerTool(h.client, { id: 'search', backendUrl: `${backend.url}/echo`, cost_units: 2, ...everyone });
  await registerTool(h.client, {
    id: 'publish',
    backendUrl: `${backend.url}/echo`,
    cost_units: 1,
    requires_approval: true,
    ...everyone,
  });
  await registerTool(h.client, { id: 'slow', backendUrl: `${backend.url}/gate`, cost_units: 5, ...everyone });
  for (const tool of ['search', 'publish', 'slow']) await grantTool(h.client, { tenant: T, agent: AGENT, tool });
  await grantTool(h.client, { tenant: T, agent: SUB, tool: 'search' });
});

afterAll(async () => {
  await backend?.close();
  await h?.close();
});

describe('the retention sweep', () => {
  it('deletes finished run trees and their bookkeeping after the retention period, and keeps everything else', async () => {
    const tenantBudget = await createBudget(h.client, { tenant: T, period: 'total', limit_units: 10_000 });

    // Old and finished: a run tree (a root kept open, a hand-off, a sub-run), a plain run, and a
    // run cancelled while it waited for an approval.
    const root = newRunId('old-root');
    expect(
      (
        await execute(h.client, as(AGENT), {
          run_id: root,
          keep_open: true,
          budget_units: 100,
          plan: [step('search', 'root')],
        })
      ).status,
    ).toBe(200);
    const handoff = await h.client.post(`/runs/${root}/handoffs`, {
      token: as(AGENT),
      body: {
        sub_agent_id: SUB,
        sub_run_id: newRunId('old-sub'),
        budget_units: 10,
        delegable_tool_ids: ['search'],
        max_fanout: 0,
      },
    });
    expect(handoff.status, JSON.stringify(handoff.body)).toBe(201);
    const sub = handoff.body.sub_run_id as string;
    expect(
      (await execute(h.client, as(SUB), { run_id: sub, parent_run_id: root, plan: [step('search', 'sub')] })).status,
    ).toBe(200);
    expect((await h.client.post(`/runs/${root}/complete`, { token: as(AGENT), body: {} })).status).toBe(200);
    const plain = newRunId('old-plain');
    expect(
      (await execute(h.client, as(AGENT), { run_id: plain, plan: [step('search', 'a'), step('search', 'b')] })).status,
    ).toBe(200);
    const cancelled = newRunId('old-cancelled');
    expect((await execute(h.client, as(AGENT), { run_id: cancelled, plan: [step('publish', 'draft')] })).status).toBe(
      202,
    );
    expect((await h.client.post(`/runs/${cancelled}/cancel`, { token: operator, body: {} })).status).toBe(200);

    // Old but not finished: a run still waiting for its approval.
    const waiting = newRunId('old-waiting');
    expect(
      (await execute(h.client, as(AGENT), { run_id: waiting, plan: [step('publish', 'still waiting')] })).status,
    ).toBe(202);
    // Finished recently.
    const recentBody = { run_id: newRunId('recent'), context: {}, plan: [step('search', 'recent')] };
    const recent = await execute(h.client, as(AGENT), recentBody);
    expect(recent.status).toBe(200);

    const old = [root, sub, plain, cancelled];
    await age([...old, waiting], 100);
    const before = await rowsOf(old);
    expect(before).toMatchObject({ runs: 4, approvals: 1, handoffs: 1 });
    expect(before.run_grant_uses).toBeGreaterThan(0);
    expect(before.budget_reservations).toBe(4);
    expect(before.budget_counters).toBeGreaterThan(0);
    const keptBefore = await rowsOf([waiting, recentBody.run_id]);
    const spent = await spentOf(tenantBudget.id);
    expect(spent).toBe(2 + 2 + 4 + 2);
    const events = await auditCount();

    const swept = await sweeper().sweep();
    expect(swept).toMatchObject({ runs: 4, approvals: 1, handoffs: 1, budget_reservations: 4, skipped: false });

    expect(await rowsOf(old)).toEqual({
      runs: 0,
      approvals: 0,
      handoffs: 0,
      run_grant_uses: 0,
      budget_reservations: 0,
      budget_counters: 0,
    });
    for (const runId of old) expect((await h.client.get(`/runs/${runId}`, { token: operator })).status).toBe(404);
    const listed = (await h.client.get('/runs', { token: operator, query: { limit: 100 } })).body.items.map(
      (r: { run_id: string }) => r.run_id,
    );
    expect(listed).toEqual(expect.arrayContaining([waiting, recentBody.run_id]));
    expect(listed).not.toEqual(expect.arrayContaining([plain]));

    // What is not finished, or finished recently, is all still there.
    expect(await rowsOf([waiting, recentBody.run_id])).toEqual(keptBefore);
    expect((await h.client.get(`/runs/${waiting}`, { token: operator })).body.status).toBe('awaiting_approval');
    expect((await h.client.get('/approvals', { token: operator, query: { run_id: waiting } })).body.items).toHaveLength(
      1,
    );
    // A recent run still replays, without calling its backend again.
    const hits = backend.hits.length;
    const replay = await h.client.post('/runs/execute', { token: as(AGENT), body: recentBody });
    expect(replay.status).toBe(200);
    expect(replay.headers['x-toolgate-replayed']).toBe('true');
    expect(replay.body).toEqual(recent.body);
    expect(backend.hits.length).toBe(hits);

    // The audit log is untouched, its chain intact, and the deleted runs' calls still on record.
    expect(await auditCount()).toBe(events);
    expect((await h.client.get('/audit/verify', { token: tokens.platform() })).body).toMatchObject({ ok: true });
    expect(
      (await h.client.get('/audit', { token: operator, query: { run_id: plain, event_type: 'run.step.completed' } }))
        .body.items,
    ).toHaveLength(2);

    // Budgets keep what was spent: the live one's counter, and one created now over all time.
    expect(await spentOf(tenantBudget.id)).toBe(spent);
    const agentTotal = await createBudget(h.client, {
      tenant: T,
      scope: 'agent',
      agent_id: AGENT,
      period: 'total',
      limit_units: 10_000,
    });
    expect(await spentOf(agentTotal.id)).toBe(2 + 4 + 2);
    const subTotal = await createBudget(h.client, {
      tenant: T,
      scope: 'agent',
      agent_id: SUB,
      period: 'total',
      limit_units: 10_000,
    });
    expect(await spentOf(subTotal.id)).toBe(2);
    // A month's budget counts only the month: the deleted runs were 100 days ago.
    const month = await createBudget(h.client, { tenant: T, period: 'month', limit_units: 10_000 });
    expect(await spentOf(month.id)).toBe(2);

    // Nothing more is due.
    expect(await sweeper().sweep()).toMatchObject({ runs: 0, budget_reservations: 0 });
  });

  it('keeps a finished run while its call is still in flight, and its open reservation; deletes it once the call ends', async () => {
    // Older ones first, so that the batches (of two) have to look past the one kept.
    const killed = newRunId('old-killed');
    const answer = execute(h.client, as(AGENT), { run_id: killed, plan: [step('slow', 'in flight')] });
    await until('the killed run’s call to reach the backend', () => backend.hitsOfRun(killed).length > 0, {
      intervalMs: 50,
    });
    expect((await h.client.post(`/runs/${killed}/kill`, { token: operator, body: { reason: 'stop it' } })).status).toBe(
      200,
    );
    const others: string[] = [];
    for (let i = 0; i < 3; i += 1) {
      const runId = newRunId('old-other');
      expect((await execute(h.client, as(AGENT), { run_id: runId, plan: [step('search', `other ${i}`)] })).status).toBe(
        200,
      );
      others.push(runId);
    }
    await age([killed], 101);
    await age(others, 100);
    const inFlight = await sql<{
      status: string;
      busy: boolean;
    }>`select status, busy from runs where tenant_id = ${T} and run_id = ${killed}`.execute(h.db.database.control);
    expect(inFlight.rows[0]).toEqual({ status: 'killed', busy: true });

    expect(await sweeper({ batchSize: 2 }).sweep()).toMatchObject({ runs: 3 });
    expect(await rowsOf(others)).toMatchObject({ runs: 0, budget_reservations: 0 });
    expect(await rowsOf([killed])).toMatchObject({ runs: 1, budget_reservations: 1 });

    backend.openGate();
    await answer;
    await age([killed], 100);
    expect(await sweeper({ batchSize: 2 }).sweep()).toMatchObject({ runs: 1, budget_reservations: 1 });
    expect(await rowsOf([killed])).toMatchObject({ runs: 0, budget_reservations: 0, budget_counters: 0 });
  });

  it('keeps a finished run whose id a live run budget or per-run grant names, until they end: they would apply to the next run under the id', async () => {
    const budgeted = newRunId('old-budgeted');
    const granted = newRunId('old-granted');
    const budget = await createBudget(h.client, { tenant: T, scope: 'run', run_id: budgeted, limit_units: 50 });
    const grant = await grantTool(h.client, {
      tenant: T,
      agent: SUB,
      tool: 'search',
      scope: 'per-run',
      scope_ref: granted,
    });
    const expired = newRunId('old-grant-expired');
    const clock = new ManualClock(new Date());
    await grantTool(h.client, {
      tenant: T,
      agent: SUB,
      tool: 'search',
      scope: 'per-run',
      scope_ref: expired,
      expires_at: new Date(clock.now().getTime() + 60_000).toISOString(),
    });
    expect((await execute(h.client, as(AGENT), { run_id: budgeted, plan: [step('search', 'budgeted')] })).status).toBe(
      200,
    );
    expect((await execute(h.client, as(SUB), { run_id: granted, plan: [step('search', 'granted')] })).status).toBe(200);
    expect((await execute(h.client, as(SUB), { run_id: expired, plan: [step('search', 'expiring')] })).status).toBe(
      200,
    );
    await age([budgeted, granted, expired], 100);
    clock.advance(60_001);

    // The expired grant names its run no more: that run goes; the two others stay.
    expect(await sweeper({ now: clock.now }).sweep()).toMatchObject({ runs: 1 });
    expect(await rowsOf([expired])).toMatchObject({ runs: 0 });
    expect(await rowsOf([budgeted, granted])).toMatchObject({ runs: 2 });

    expect((await h.client.request('DELETE', `/budgets/${budget.id}`, { token: operator })).status).toBe(200);
    expect(
      (await h.client.post(`/grants/${grant.id}/revoke`, { token: operator, body: { reason: 'done with it' } })).status,
    ).toBe(200);
    expect(await sweeper().sweep()).toMatchObject({ runs: 2 });
    expect(await rowsOf([budgeted, granted])).toMatchObject({ runs: 0, budget_reservations: 0 });
  });

  it('is safe with several replicas sweeping at once: each tree is deleted once', async () => {
    const runIds: string[] = [];
    for (let i = 0; i < 6; i += 1) {
      const runId = newRunId('old-raced');
      expect((await execute(h.client, as(AGENT), { run_id: runId, plan: [step('search', `raced ${i}`)] })).status).toBe(
        200,
      );
      runIds.push(runId);
    }
    await age(runIds, 100);
    const sweeps: RetentionSweep[] = await Promise.all([1, 2, 3, 4].map(() => sweeper({ batchSize: 2 }).sweep()));
    expect(sweeps.reduce((sum, s) => sum + s.runs, 0)).toBe(6);
    expect(sweeps.reduce((sum, s) => sum + s.budget_reservations, 0)).toBe(6);
    expect(await rowsOf(runIds)).toMatchObject({ runs: 0, budget_reservations: 0, run_grant_uses: 0 });
  });

  it('sets aside a tree whose deletion always fails, reports it, and still deletes the trees after it', async () => {
    const db = h.db.database.control;
    const stuck = newRunId('old-stuck');
    const others: string[] = [];
    expect((await execute(h.client, as(AGENT), { run_id: stuck, plan: [step('search', 'stuck')] })).status).toBe(200);
    for (let i = 0; i < 3; i += 1) {
      const runId = newRunId('old-after-stuck');
      expect((await execute(h.client, as(AGENT), { run_id: runId, plan: [step('search', `after ${i}`)] })).status).toBe(
        200,
      );
      others.push(runId);
    }
    // The oldest, so that every round meets it first.
    await age([stuck], 101);
    await age(others, 100);
    // A row only this test has refers to its run: deleting the tree fails, every time.
    await sql`create table retention_pins (tenant_id text, run_id text, foreign key (tenant_id, run_id) references runs)`.execute(
      db,
    );
    try {
      await sql`insert into retention_pins values (${T}, ${stuck})`.execute(db);
      const lines: Array<Record<string, unknown>> = [];
      const registry = new Registry();
      let now = Date.now();
      const retention = new RetentionSweeper({
        database: h.db.database,
        now: () => new Date(now),
        retentionDays: 90,
        intervalMs: 60_000,
        registry,
        batchSize: 2,
        logger: pino({ level: 'warn' }, { write: (line: string) => lines.push(JSON.parse(line)) }),
      });
      const failedTrees = async () =>
        (await registry.getSingleMetric('toolgate_retention_failed_trees_total')!.get()).values[0]?.value;

      expect(await retention.sweep()).toMatchObject({
        runs: 3,
        failed: [{ tenant_id: T, run_id: stuck }],
        skipped: false,
      });
      expect(await rowsOf(others)).toMatchObject({ runs: 0, budget_reservations: 0 });
      expect(await rowsOf([stuck])).toMatchObject({ runs: 1, budget_reservations: 1 });
      expect(await failedTrees()).toBe(1);
      const warned = lines.filter((line) => line.run_id === stuck);
      expect(warned).toHaveLength(1);
      expect(warned[0]).toMatchObject({ tenant_id: T, msg: expect.stringMatching(/could not delete/) });
      expect(String((warned[0]!.err as { message: string }).message)).toMatch(/foreign key/);

      // Set aside: later sweeps pass it by, and delete what finished after it.
      const later = newRunId('old-later');
      expect((await execute(h.client, as(AGENT), { run_id: later, plan: [step('search', 'later')] })).status).toBe(200);
      await age([later], 100);
      expect(await retention.sweep()).toMatchObject({ runs: 1, failed: [] });
      expect(await rowsOf([later])).toMatchObject({ runs: 0 });
      expect(await failedTrees()).toBe(1);

      // A day later it is tried again, and goes once nothing holds it.
      await sql`delete from retention_pins`.execute(db);
      expect(await retention.sweep()).toMatchObject({ runs: 0, failed: [] });
      now += 86_400_000 + 1;
      expect(await retention.sweep()).toMatchObject({ runs: 1, budget_reservations: 1, failed: [] });
      expect(await rowsOf([stuck])).toMatchObject({ runs: 0, budget_reservations: 0, budget_counters: 0 });
    } finally {
      await sql`drop table retention_pins`.execute(db);
    }
  });

  it.skipIf(!hasPostgresServer)(
    'sets aside a tree whose deletion times out, and leaves the rest of that batch to the next round (needs a PostgreSQL server)',
    async () => {
      const stuck = newRunId('old-slow');
      const others: string[] = [];
      expect(
        (await execute(h.client, as(AGENT), { run_id: stuck, plan: [step('search', 'slow to delete')] })).status,
      ).toBe(200);
      for (let i = 0; i < 2; i += 1) {
        const runId = newRunId('old-after-slow');
        expect(
          (await execute(h.client, as(AGENT), { run_id: runId, plan: [step('search', `after ${i}`)] })).status,
        ).toBe(200);
        others.push(runId);
      }
      await age([stuck], 101);
      await age(others, 100);
      // Another client holds the tree's reservation locked, and the sweeper's statements time out
      // waiting for it; a short statement_timeout stands in for a tree too large to delete in time.
      const holder = new pg.Client({ connectionString: h.db.url });
      const pool = new pg.Pool({ connectionString: h.db.url, max: 2, statement_timeout: 300 });
      const db = new Kysely<DB>({ dialect: new PostgresDialect({ pool }) });
      await holder.connect();
      try {
        await holder.query('begin');
        await holder.query('select 1 from budget_reservations where tenant_id = $1 and run_id = $2 for update', [
          T,
          stuck,
        ]);
        let now = Date.now();
        const retention = new RetentionSweeper({
          database: { ...h.db.database, control: db },
          now: () => new Date(now),
          retentionDays: 90,
          intervalMs: 60_000,
          logger: pino({ level: 'silent' }),
          registry: new Registry(),
          batchSize: 3,
        });

        // The timeout ends the round at the tree that timed out: the server itself might be the slow one.
        expect(await retention.sweep()).toMatchObject({
          runs: 0,
          failed: [{ tenant_id: T, run_id: stuck }],
          skipped: false,
        });
        expect(await rowsOf([stuck, ...others])).toMatchObject({ runs: 3 });
        // The next round passes it by.
        expect(await retention.sweep()).toMatchObject({ runs: 2, failed: [] });
        expect(await rowsOf(others)).toMatchObject({ runs: 0 });

        await holder.query('rollback');
        now += 86_400_000 + 1;
        expect(await retention.sweep()).toMatchObject({ runs: 1, failed: [] });
        expect(await rowsOf([stuck])).toMatchObject({ runs: 0, budget_reservations: 0 });
      } finally {
        await holder.end();
        await db.destroy();
      }
    },
  );

  it("frees a run id without handing the deleted run's calls to the next run under it, should that one's executor be lost", async () => {
    // The first run under the id made three calls 100 days ago (its replica's clock says so, as
    // its audit records do) and was deleted.
    const runId = newRunId('old-reused');
    const then = await startClient(h.db.database, new ManualClock(new Date(Date.now() - 100 * 86_400_000)));
    try {
      const plan = ['1', '2', '3'].map((q) => step('search', q));
      expect(
        (await then.post('/runs/execute', { token: as(AGENT), body: { run_id: runId, context: {}, plan } })).status,
      ).toBe(200);
    } finally {
      await then.close();
    }
    await age([runId], 100);
    expect(await sweeper().sweep()).toMatchObject({ runs: 1 });

    // The next run under the id makes its first call, then its executor is lost before its second
    // (held between the two by a pause, then left busy by a replica that is gone).
    const body = { run_id: runId, context: {}, plan: [step('slow', 'a'), step('search', 'b'), step('search', 'c')] };
    const answer = h.client.post('/runs/execute', { token: as(AGENT), body });
    await until(
      'the held call to reach the backend',
      () => backend.hitsOfRun(runId).some((hit) => hit.path === '/gate'),
      { intervalMs: 50 },
    );
    expect((await h.client.post(`/runs/${runId}/pause`, { token: operator, body: {} })).status).toBe(200);
    backend.openGate();
    expect((await answer).body.status).toBe('paused');
    await h.db.database.control
      .updateTable('runs')
      .set({ status: 'running', busy: true, executor_id: 'rep_gone' })
      .where('tenant_id', '=', T)
      .where('run_id', '=', runId)
      .execute();
    expect(await h.client.app.services.recovery.recoverIfLost({ tenant_id: T, run_id: runId })).toBe(true);

    // Recovery knows of its one call: the deleted run's second and third are not this run's.
    const recovered = (await h.client.get(`/runs/${runId}`, { token: operator })).body;
    expect(recovered.status).toBe('failed');
    expect(recovered.steps.map((s: { status: string }) => s.status)).toEqual(['completed', 'denied', 'skipped']);
    expect(recovered.steps[1].error).toMatchObject({
      code: 'gateway_unavailable',
      details: { reason: 'executor_lost', in_doubt: false },
    });
  });

  it('forgets replicas whose lease lapsed long ago, and keeps live ones', async () => {
    const db = h.db.database.control;
    await sql`insert into replicas (id, hostname, pid, started_at, renewed_at, expires_at)
              values ('rep_long_gone', 'gone', 1, now() - interval '200 days', now() - interval '100 days', now() - interval '100 days')`.execute(
      db,
    );
    const live = (await sql<{ n: string }>`select count(*) as n from replicas where expires_at > now()`.execute(db))
      .rows[0]!.n;
    expect(await sweeper().sweep()).toMatchObject({ replicas: 1 });
    expect(
      (await sql<{ id: string }>`select id from replicas where id = 'rep_long_gone'`.execute(db)).rows,
    ).toHaveLength(0);
    expect(
      (await sql<{ n: string }>`select count(*) as n from replicas where expires_at > now()`.execute(db)).rows[0]!.n,
    ).toBe(live);
  });

  it('deletes idempotency keys past their 24 hours, and keeps younger ones', async () => {
    const db = h.db.database.control;
    await sql`insert into idempotency_keys (tenant_id, actor, key, fingerprint, status_code, response, created_at, completed_at)
              values ('t', 'operator:o', 'old', 'f', 201, '{}', now() - interval '25 hours', now() - interval '25 hours'),
                     ('t', 'operator:o', 'young', 'f', 201, '{}', now() - interval '23 hours', now() - interval '23 hours')`.execute(
      db,
    );
    expect(await sweeper().sweep()).toMatchObject({ idempotency_keys: 1 });
    expect(
      (await sql<{ key: string }>`select key from idempotency_keys where tenant_id = 't'`.execute(db)).rows,
    ).toEqual([{ key: 'young' }]);
  });

  it('runs in every replica, every TOOLGATE_RETENTION_SWEEP_MS', async () => {
    const runId = newRunId('old-by-app');
    expect((await execute(h.client, as(AGENT), { run_id: runId, plan: [step('search', 'by the app')] })).status).toBe(
      200,
    );
    await age([runId], 100);
    const replica = await AppClient.start(h.db.database, { TOOLGATE_RETENTION_SWEEP_MS: '1000' });
    try {
      await until('the run to be deleted', async () => (await rowsOf([runId])).runs === 0, { intervalMs: 50 });
    } finally {
      await replica.close();
    }
  });
});
