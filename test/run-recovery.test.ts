import { spawn, type ChildProcess } from 'node:child_process';
import { sql } from 'kysely';
import pg from 'pg';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runTotalRef } from '../src/budgets/run-allowance.js';
import { openDatabase, type Database } from '../src/db/database.js';
import { TestBackend } from './helpers/backend.js';
import { hasPostgresServer } from './helpers/database.js';
import { AppClient, startHarness, type Harness } from './helpers/harness.js';
import { freePort } from './helpers/net.js';
import { TcpProxy } from './helpers/tcp-proxy.js';
import { TEST_JWT_SECRET, tokens } from './helpers/tokens.js';
import { createBudget, grantTool, newRunId, registerTool } from './helpers/world.js';
import { lockWaits, until } from './helpers/waits.js';
import { asCutOff } from './helpers/runs.js';

// A run is busy while an executor holds it. When that executor is gone — its replica died, or
// its execution broke off because the database went away mid-call — the run must not stay busy
// (its owner would get 409 for good): it ends, with what is known of it, and nothing is sent twice.
const T = 'tenant-recovery';
const AGENT = 'recovery.agent';
const agent = tokens.agent(AGENT, { tenant: T });
// The lease of the replicas a test takes for lost: short enough to wait out in a test.
const LEASE_MS = '1500';
// The lease of the replica that recovers them (and dispatches the calls the tests check): longer,
// because a live lease must never lapse here. Under the whole suite a renewal was seen to take a
// second (a durable commit while other test files create and drop databases), and with a 1.5 s
// lease renewed every 0.5 s that let it lapse for a moment: a call dispatched then was refused
// 503 gateway_unavailable, failing a test about something else.
const RECOVERER_LEASE_MS = '4500';
const root = new URL('..', import.meta.url).pathname;

let h: Harness;
let backend: TestBackend;

const threeSteps = (runId: string) => ({
  run_id: runId,
  context: {},
  plan: [
    { tool_id: 'echo', input: { q: 'first' } },
    { tool_id: 'gated', input: { q: 'held' } },
    { tool_id: 'echo', input: { q: 'never' } },
  ],
});

function hitsOf(runId: string) {
  return backend.hitsOfRun(runId);
}

/** The bound on this file's waits: recovery works in rounds of leases that last seconds. */
const patiently = { timeoutMs: 15_000, intervalMs: 25 };

function runRow(runId: string) {
  return h.db.database.control
    .selectFrom('runs')
    .select(['status', 'busy', 'executor_id', 'http_status'])
    .where('tenant_id', '=', T)
    .where('run_id', '=', runId)
    .executeTakeFirstOrThrow();
}

async function recoveryEvents(runId: string) {
  const res = await h.client.get('/audit', {
    token: tokens.platform(),
    query: { run_id: runId, event_type: 'run.executor_lost' },
  });
  return res.body.items as Array<{
    actor: string;
    status: string;
    reason_code: string;
    details: Record<string, unknown>;
  }>;
}

beforeAll(async () => {
  h = await startHarness({ TOOLGATE_REPLICA_LEASE_MS: RECOVERER_LEASE_MS });
  backend = await new TestBackend().start();
  const base = { allowed_agents: [AGENT], timeout_ms: 20_000 };
  await registerTool(h.client, { id: 'gated', backendUrl: `${backend.url}/gate`, cost_units: 2, ...base });
  await registerTool(h.client, { id: 'echo', backendUrl: `${backend.url}/echo`, cost_units: 1, ...base });
  for (const tool of ['gated', 'echo']) await grantTool(h.client, { tenant: T, agent: AGENT, tool });
});

afterAll(async () => {
  await backend?.close();
  await h?.close();
});

describe.skipIf(!hasPostgresServer)('a replica killed mid-call (needs a PostgreSQL server)', () => {
  let child: ChildProcess | undefined;
  afterAll(() => {
    child?.kill('SIGKILL');
    h.client.app.services.recovery.start();
  });

  it('ends its run failed with the call in doubt named, replays that to the owner, and sends nothing again', async () => {
    // A real gateway process on the same database, killed with SIGKILL while a call is at its backend.
    const port = await freePort();
    // Node itself (as `npm start` runs it), not the tsx launcher: SIGKILL must reach the gateway.
    child = spawn(process.execPath, ['--import', 'tsx', 'src/server.ts'], {
      cwd: root,
      env: {
        PATH: process.env.PATH,
        HOME: process.env.HOME,
        PORT: String(port),
        DATABASE_URL: h.db.url!,
        TOOLGATE_JWT_SECRET: TEST_JWT_SECRET,
        TOOLGATE_REPLICA_LEASE_MS: LEASE_MS,
        LOG_LEVEL: 'silent',
      },
      stdio: 'ignore',
    });
    const url = `http://127.0.0.1:${port}`;
    await until(
      'the gateway process to be ready',
      async () => (await fetch(`${url}/ready`).catch(() => undefined))?.status === 200,
      { timeoutMs: 60_000, intervalMs: 25 },
    );
    // Only the owner's resubmission may end the run here: the sweeper stays out of it.
    await h.client.app.services.recovery.stop();

    const runId = newRunId('killed');
    const budget = await createBudget(h.client, { tenant: T, scope: 'run', run_id: runId, limit_units: 100 });
    const body = threeSteps(runId);
    const answer = fetch(`${url}/runs/execute`, {
      method: 'POST',
      headers: { authorization: `Bearer ${agent}`, 'content-type': 'application/json' },
      body: JSON.stringify(body),
    }).catch(() => undefined);
    await until(
      'the held call to reach the backend',
      () => hitsOf(runId).some((hit) => hit.path === '/gate'),
      patiently,
    );
    const lostReplica = (await runRow(runId)).executor_id;
    expect(lostReplica).toMatch(/^rep_/);
    expect(lostReplica).not.toBe(h.client.app.services.lease.id);
    child.kill('SIGKILL');
    await answer;

    // While the dead replica's lease holds, the owner is told the run is busy (409); once it has
    // passed, the owner's resubmission ends the run and gets its answer.
    let res = await h.client.post('/runs/execute', { token: agent, body });
    await until(
      'the lost run to be recovered',
      async () => {
        if (res.status !== 409) return true;
        expect(res.body.error.code).toBe('run_id_conflict');
        res = await h.client.post('/runs/execute', { token: agent, body });
        return false;
      },
      patiently,
    );
    expect(res.status, JSON.stringify(res.body)).toBe(503);
    expect(res.headers['x-toolgate-replayed']).toBe('true');
    expect(res.body.status).toBe('failed');
    expect(res.body.warnings).toContain('executor_lost');
    const inDoubtId = hitsOf(runId).find((hit) => hit.path === '/gate')!.headers['x-toolgate-tool-call-id'];
    const [first, second, third] = res.body.steps;
    // The first call completed (its output died with the replica), the second may have reached its backend.
    expect(first).toMatchObject({ index: 0, tool_id: 'echo', status: 'completed' });
    expect(first.output).toBeUndefined();
    expect(second).toMatchObject({
      index: 1,
      tool_id: 'gated',
      status: 'failed',
      error: {
        code: 'gateway_unavailable',
        details: { reason: 'executor_lost', in_doubt: true, tool_call_id: inDoubtId },
      },
    });
    expect(third).toMatchObject({ index: 2, status: 'skipped' });

    // Asked again, the same answer; the backend saw each call once and the third never.
    const again = await h.client.post('/runs/execute', { token: agent, body });
    expect(again.status).toBe(503);
    expect(again.body).toEqual(res.body);
    expect(hitsOf(runId).map((hit) => hit.path)).toEqual(['/echo', '/gate']);
    expect(await runRow(runId)).toMatchObject({ status: 'failed', busy: false, http_status: 503 });
    // The first call was settled by its executor (1 unit); the call in doubt is charged its price
    // (2 units) rather than its reservation left to lapse and be given back.
    const budgets = await h.client.get('/budgets', { token: tokens.tenantOperator(T) });
    expect(budgets.body.items.find((b: { id: string }) => b.id === budget.id)).toMatchObject({
      spent_units: 3,
      reserved_units: 0,
    });

    const run = await h.client.get(`/runs/${runId}`, { token: agent });
    expect(run.body.status).toBe('failed');
    expect(run.body.steps).toEqual(res.body.steps);
    const [event] = await recoveryEvents(runId);
    expect(event).toMatchObject({ actor: 'system.recovery', status: 'failed', reason_code: 'gateway_unavailable' });
    expect(event!.details).toMatchObject({
      reason: 'executor_lost',
      executor_id: lostReplica,
      in_doubt_tool_call_ids: [inDoubtId],
    });
    backend.openGate();
  }, 120_000);
});

describe.skipIf(!hasPostgresServer)('an execution broken off by a database outage (needs a PostgreSQL server)', () => {
  let proxy: TcpProxy;
  let database: Database;
  let client: AppClient;

  beforeAll(async () => {
    const server = new URL(h.db.url!);
    proxy = await new TcpProxy(server.hostname, Number(server.port || 5432)).start();
    database = await openDatabase({
      databaseUrl: proxy.urlFor(h.db.url!),
      dataDir: '',
      poolSize: 5,
      logger: pino({ level: 'silent' }),
    });
    client = await AppClient.start(database, { TOOLGATE_REPLICA_LEASE_MS: LEASE_MS });
    await until('the catalog to know the tools', () => client.app.services.catalog.resolve('gated').ok, patiently);
  });

  afterAll(async () => {
    await client?.close();
    await database?.close();
    await proxy?.close();
  });

  const cutOff = async (runId: string) => {
    const body = { run_id: runId, context: {}, plan: [{ tool_id: 'gated', input: { q: 'cut off' } }] };
    const answer = client.post('/runs/execute', { token: agent, body });
    await until('the held call to reach the backend', () => hitsOf(runId).length === 1, patiently);
    proxy.cutConnections();
    backend.openGate();
    expect((await answer).status).toBe(503);
    proxy.restore();
    return body;
  };

  const expectInDoubtReplay = async (
    runId: string,
    res: { status: number; headers: Record<string, unknown>; body: any },
  ) => {
    expect(res.status).toBe(503);
    expect(res.headers['x-toolgate-replayed']).toBe('true');
    expect(res.body.steps).toEqual([
      expect.objectContaining({
        index: 0,
        status: 'failed',
        error: expect.objectContaining({
          code: 'gateway_unavailable',
          details: expect.objectContaining({ in_doubt: true }),
        }),
      }),
    ]);
    expect(hitsOf(runId)).toHaveLength(1);
    expect(await recoveryEvents(runId)).toHaveLength(1);
  };

  it('is ended by its own replica once the database returns, with the call in doubt, and replayed without a second call', async () => {
    const runId = newRunId('outage');
    const body = await cutOff(runId);
    // Its replica is alive and let go of the run without ending it: its own recovery (or, had the
    // outage outlasted its lease, another replica's) ends it.
    await until('the run to be let go', async () => !(await runRow(runId)).busy, patiently);
    expect(await runRow(runId)).toMatchObject({
      status: 'failed',
      http_status: 503,
      executor_id: client.app.services.lease.id,
    });
    await expectInDoubtReplay(runId, await h.client.post('/runs/execute', { token: agent, body }));
  });

  it('is ended at once when its owner resubmits to the same replica', async () => {
    await client.app.services.recovery.stop();
    try {
      const runId = newRunId('outage-again');
      const body = await cutOff(runId);
      // The first resubmissions may still find the database reconnecting (503, not replayed).
      let res = await client.post('/runs/execute', { token: agent, body });
      await until(
        'a replayed answer',
        async () => {
          if (res.headers['x-toolgate-replayed'] === 'true') return true;
          expect(res.status).toBe(503);
          res = await client.post('/runs/execute', { token: agent, body });
          return false;
        },
        patiently,
      );
      await expectInDoubtReplay(runId, res);
    } finally {
      client.app.services.recovery.start();
    }
  });
});

describe.skipIf(!hasPostgresServer)(
  'a run ended by an operator while its executor was gone (needs a PostgreSQL server)',
  () => {
    it('keeps that end, is replayed to its owner instead of 409, and its executor, back after all, changes nothing', async () => {
      const ghost = await AppClient.start(h.db.database, { TOOLGATE_REPLICA_LEASE_MS: LEASE_MS });
      try {
        await until('the catalog to know the tools', () => ghost.app.services.catalog.resolve('gated').ok, patiently);
        const runId = newRunId('ghost');
        const body = {
          run_id: runId,
          context: {},
          plan: [
            { tool_id: 'gated', input: { q: 'ghost' } },
            { tool_id: 'echo', input: { q: 'later' } },
          ],
        };
        const answer = ghost.post('/runs/execute', { token: agent, body });
        await until('the held call to reach the backend', () => hitsOf(runId).length === 1, patiently);
        // As far as the other replicas can tell, this one is gone: its lease is given up.
        await ghost.app.services.lease.stop();
        const cancelled = await h.client.post(`/runs/${runId}/cancel`, {
          token: tokens.tenantOperator(T),
          body: { reason: 'stuck' },
        });
        expect(cancelled.body.status).toBe('cancelled');

        const res = await h.client.post('/runs/execute', { token: agent, body });
        expect(res.status).toBe(409);
        expect(res.headers['x-toolgate-replayed']).toBe('true');
        expect(res.body.status).toBe('cancelled');
        expect(res.body.steps.map((step: { status: string }) => step.status)).toEqual(['failed', 'skipped']);
        expect(res.body.steps[0].error.details).toMatchObject({ reason: 'executor_lost', in_doubt: true });
        const [event] = await recoveryEvents(runId);
        expect(event).toMatchObject({ status: 'cancelled', details: { executor_id: ghost.app.services.lease.id } });

        // The executor was only cut off: its call finishes, but the run is no longer its to write.
        backend.openGate();
        expect((await answer).body.status).toBe('cancelled');
        const run = await h.client.get(`/runs/${runId}`, { token: agent });
        expect(run.body.steps).toEqual(res.body.steps);
        expect(hitsOf(runId)).toHaveLength(1);
      } finally {
        await ghost.close();
      }
    });
  },
);

describe.skipIf(!hasPostgresServer)(
  'a run whose calls all completed before its executor was lost (needs a PostgreSQL server)',
  () => {
    // The run's calls were made for real; then its row is put back as a crash between the last
    // outcome record and the run's end leaves it: running, busy, held by a replica that is gone.
    async function lostAfterLastCall(keepOpen: boolean) {
      const runId = newRunId(keepOpen ? 'open' : 'done');
      const body = {
        run_id: runId,
        context: {},
        keep_open: keepOpen,
        plan: [
          { tool_id: 'echo', input: { q: 'a' } },
          { tool_id: 'echo', input: { q: 'b' } },
        ],
      };
      expect((await h.client.post('/runs/execute', { token: agent, body })).status).toBe(200);
      await h.db.database.control
        .updateTable('runs')
        .set(asCutOff(body))
        .where('tenant_id', '=', T)
        .where('run_id', '=', runId)
        .execute();
      expect(await h.client.app.services.recovery.recoverIfLost({ tenant_id: T, run_id: runId })).toBe(true);
      const replay = await h.client.post('/runs/execute', { token: agent, body });
      expect(replay.status).toBe(200);
      expect(replay.headers['x-toolgate-replayed']).toBe('true');
      expect(replay.body.steps.map((step: { status: string; output?: unknown }) => [step.status, step.output])).toEqual(
        [
          ['completed', undefined],
          ['completed', undefined],
        ],
      );
      expect(replay.body.warnings).toEqual(['executor_lost']);
      expect(hitsOf(runId)).toHaveLength(2);
      return { runId, replay };
    }

    it('ends it completed', async () => {
      const { runId, replay } = await lostAfterLastCall(false);
      expect(replay.body.status).toBe('completed');
      expect(await runRow(runId)).toMatchObject({ status: 'completed', busy: false });
      const [event] = await recoveryEvents(runId);
      expect(event).toMatchObject({
        status: 'completed',
        details: { executor_id: 'rep_gone', in_doubt_tool_call_ids: [] },
      });
    });

    it('leaves one kept open running, at rest, for its owner to complete', async () => {
      const { runId, replay } = await lostAfterLastCall(true);
      expect(replay.body.status).toBe('running');
      expect(await runRow(runId)).toMatchObject({ status: 'running', busy: false });
      const completed = await h.client.post(`/runs/${runId}/complete`, { token: agent, body: {} });
      expect(completed.status).toBe(200);
      expect(completed.body.status).toBe('completed');
    });
  },
);

describe.skipIf(!hasPostgresServer)('a replica that is alive (needs a PostgreSQL server)', () => {
  it('keeps its run through a call that outlasts several leases, while other replicas sweep', async () => {
    const runId = newRunId('slow');
    const answer = h.client.post('/runs/execute', {
      token: agent,
      body: { run_id: runId, context: {}, plan: [{ tool_id: 'gated', input: { q: 'slow' } }] },
    });
    await until('the held call to reach the backend', () => hitsOf(runId).length === 1, patiently);
    // Three leases go by; the replica renews its own, and every sweep — another replica's and
    // its own — leaves the run alone.
    const other = await AppClient.start(h.db.database, { TOOLGATE_REPLICA_LEASE_MS: LEASE_MS });
    await new Promise((r) => setTimeout(r, 3 * Number(LEASE_MS)));
    expect(await other.app.services.recovery.sweep()).toBe(0);
    await other.close();
    expect(await h.client.app.services.recovery.sweep()).toBe(0);
    expect(await runRow(runId)).toMatchObject({ status: 'running', busy: true });
    backend.openGate();
    const res = await answer;
    expect(res.status).toBe(200);
    expect(res.body.steps[0]).toMatchObject({ status: 'completed', output: { echo: { q: 'slow' } } });
    expect(await recoveryEvents(runId)).toEqual([]);
  });

  it('dispatches nothing while it cannot renew its lease, and dispatches again once it can', async () => {
    // Another session holds the replicas table: renewals wait, and the lease runs out.
    const blocker = await h.db.database.control.connection().execute(async (conn) => {
      await sql`begin`.execute(conn);
      await sql`lock table replicas in access exclusive mode`.execute(conn);
      await until('the lease to lapse', () => !h.client.app.services.lease.valid(), {
        timeoutMs: 10_000,
        intervalMs: 25,
      });
      const runId = newRunId('fenced');
      const refused = await h.client.post('/runs/execute', {
        token: agent,
        body: { run_id: runId, context: {}, plan: [{ tool_id: 'echo', input: { q: 'fenced' } }] },
      });
      await sql`rollback`.execute(conn);
      return { runId, refused };
    });
    expect(blocker.refused.status).toBe(503);
    expect(blocker.refused.body.error.code).toBe('gateway_unavailable');
    expect(hitsOf(blocker.runId)).toHaveLength(0);

    await until('the lease to be renewed', () => h.client.app.services.lease.valid(), patiently);
    // The refused run was let go by its replica's recovery: nothing was in doubt.
    await until('the refused run to be let go', async () => !(await runRow(blocker.runId)).busy, patiently);
    const run = await h.client.get(`/runs/${blocker.runId}`, { token: agent });
    expect(run.body.status).toBe('failed');
    expect(run.body.steps[0]).toMatchObject({
      status: 'denied',
      error: { code: 'gateway_unavailable', details: { reason: 'executor_lost', in_doubt: false } },
    });
    const ok = await h.client.post('/runs/execute', {
      token: agent,
      body: { run_id: newRunId('after'), context: {}, plan: [{ tool_id: 'echo', input: { q: 'again' } }] },
    });
    expect(ok.status).toBe(200);
  });
});

/** An audit append as `pg_stat_activity` shows its start (it keeps a statement's first kilobyte), linked or not. */
const APPEND_STATEMENT = '%from audit_chain_head where id = 1 and%';

describe.skipIf(!hasPostgresServer)(
  'a run taken for lost while its executor settles its call (needs a PostgreSQL server)',
  () => {
    const TL = 'tenant-recovery-locks';
    const PARENT = 'lockstep.parent';
    const SUB = 'lockstep.sub';
    let watcher: pg.Client;

    beforeAll(async () => {
      const base = { allowed_agents: [PARENT, SUB], timeout_ms: 20_000 };
      await registerTool(h.client, { id: 'settle.held', backendUrl: `${backend.url}/gate`, cost_units: 2, ...base });
      await registerTool(h.client, { id: 'settle.quick', backendUrl: `${backend.url}/echo`, cost_units: 1, ...base });
      for (const tool of ['settle.held', 'settle.quick'])
        await grantTool(h.client, { tenant: TL, agent: PARENT, tool });
      await grantTool(h.client, { tenant: TL, agent: SUB, tool: 'settle.quick' });
      watcher = new pg.Client({ connectionString: h.db.url });
      await watcher.connect();
    });

    afterAll(async () => {
      await watcher?.end();
    });

    /**
     * A root run of PARENT in `tenant` whose call is held at its backend by `ghost`, with a sub-run
     * handed `subTool`; then the ghost gives its lease up, so the run is taken for lost.
     */
    async function lostParentWithSubRun(ghost: AppClient, tenant: string, name: string, subTool: string) {
      const runId = newRunId(`${name}-parent`);
      const subRunId = newRunId(`${name}-sub`);
      const parentToken = tokens.agent(PARENT, { tenant });
      const body = {
        run_id: runId,
        context: {},
        budget_units: 100,
        plan: [{ tool_id: 'settle.held', input: { q: 'in doubt' } }],
      };
      const answer = ghost.post('/runs/execute', { token: parentToken, body });
      await until('the held call to reach the backend', () => hitsOf(runId).length === 1, patiently);
      const handoff = await h.client.post(`/runs/${runId}/handoffs`, {
        token: parentToken,
        body: {
          sub_agent_id: SUB,
          sub_run_id: subRunId,
          budget_units: 5,
          delegable_tool_ids: [subTool],
          max_fanout: 0,
        },
      });
      expect(handoff.status, JSON.stringify(handoff.body)).toBe(201);
      await ghost.app.services.lease.stop();
      return { runId, subRunId, parentToken, body, answer };
    }

    it('is ended without a deadlock: recovery takes the reservation before any counter, as the settlement does', async () => {
      // This replica's sweep stays out of the way: the test ends the run itself, at a chosen moment.
      await h.client.app.services.recovery.stop();
      const ghost = await AppClient.start(h.db.database, { TOOLGATE_REPLICA_LEASE_MS: LEASE_MS });
      const subCounterHolder = new pg.Client({ connectionString: h.db.url });
      const budgetCounterHolder = new pg.Client({ connectionString: h.db.url });
      await subCounterHolder.connect();
      await budgetCounterHolder.connect();
      try {
        const budget = await createBudget(h.client, { tenant: TL, limit_units: 1000 });
        await until(
          'the catalog to know the tools',
          () => ghost.app.services.catalog.resolve('settle.held').ok,
          patiently,
        );
        // The parent's call is at its backend, and it has handed a budget to a sub-run, still open.
        // (Ids in this order, so that the parent's run-total counter is locked before the sub-run's.)
        const runId = newRunId('lockstep-a');
        const subRunId = newRunId('lockstep-z');
        const parentToken = tokens.agent(PARENT, { tenant: TL });
        const answer = ghost.post('/runs/execute', {
          token: parentToken,
          body: {
            run_id: runId,
            context: {},
            budget_units: 100,
            plan: [{ tool_id: 'settle.held', input: { q: 'settle me' } }],
          },
        });
        await until('the held call to reach the backend', () => hitsOf(runId).length === 1, patiently);
        const handoff = await h.client.post(`/runs/${runId}/handoffs`, {
          token: parentToken,
          body: {
            sub_agent_id: SUB,
            sub_run_id: subRunId,
            budget_units: 5,
            delegable_tool_ids: ['settle.quick'],
            max_fanout: 0,
          },
        });
        expect(handoff.status, JSON.stringify(handoff.body)).toBe(201);
        // As far as this replica can tell, the ghost is gone; it is alive, and about to settle.
        await ghost.app.services.lease.stop();

        // Recovery is held at a counter (the tenant budget's, or the sub-run's run total) after it
        // locked the chain head and the parent's reservation; the settlement, riding the outcome
        // record, then waits for the chain head.
        const sub = runTotalRef(TL, subRunId);
        await subCounterHolder.query('begin');
        await subCounterHolder.query(
          'insert into budget_counters (counter_key, period_start) values ($1, $2) on conflict (counter_key, period_start) do update set counter_key = excluded.counter_key',
          [sub.key, sub.periodStart],
        );
        await budgetCounterHolder.query('begin');
        await budgetCounterHolder.query('select 1 from budget_counters where counter_key = $1 for update', [budget.id]);
        const recovered = h.client.app.services.recovery.recoverIfLost({ tenant_id: TL, run_id: runId });
        const outcome = recovered.then(
          () => 'recovered',
          (error: Error) => error.message,
        );
        await until(
          'recovery to wait for a counter',
          async () => (await lockWaits(watcher, '%with applicable as%')) === 1,
          patiently,
        );
        backend.openGate();
        // (The outcome record's statement: its start, since pg_stat_activity keeps only a statement's first kilobyte.)
        await until(
          'the settlement to wait',
          async () => (await lockWaits(watcher, APPEND_STATEMENT)) === 1,
          patiently,
        );
        await subCounterHolder.query('commit');
        // Recovery still waits for the tenant budget's counter (it locks every counter it changes
        // in one statement, in key order), the settlement for what recovery holds.
        await until(
          'both to wait on the ledger',
          async () =>
            (await lockWaits(watcher, '%with applicable as%')) === 1 &&
            (await lockWaits(watcher, APPEND_STATEMENT)) === 1,
          patiently,
        );
        await budgetCounterHolder.query('commit');

        expect(await outcome).toBe('recovered');
        expect(await recovered).toBe(true);
        expect((await answer).body.status).toBe('failed');
        const operator = tokens.tenantOperator(TL);
        const run = (await h.client.get(`/runs/${runId}`, { token: operator })).body;
        expect(run.steps[0]).toMatchObject({
          status: 'failed',
          error: { details: { reason: 'executor_lost', in_doubt: true } },
        });
        expect((await h.client.get(`/runs/${subRunId}`, { token: operator })).body.status).toBe('cancelled');
        // The call is charged once: by recovery, at its price (in doubt); the settlement found it closed.
        const reservations = await h.db.database.control
          .selectFrom('budget_reservations')
          .select(['status', 'actual_units'])
          .where('tenant_id', '=', TL)
          .where('run_id', '=', runId)
          .execute();
        expect(reservations.map((r) => [r.status, Number(r.actual_units)])).toEqual([['settled', 2]]);
        expect((await h.client.get(`/budgets/${budget.id}`, { token: operator })).body).toMatchObject({
          spent_units: 2,
          reserved_units: 0,
        });
      } finally {
        backend.openGate();
        await subCounterHolder.end();
        await budgetCounterHolder.end();
        await ghost.close();
        h.client.app.services.recovery.start();
      }
    });

    it('is ended without a deadlock while a sub-run reserves: recovery locks every counter it needs in one statement, in key order', async () => {
      // A sub-run's reservation locks its counters in key order: the tenant's budgets (`bud_…`),
      // then its own run total (`run/…`). Recovery used to lock the run totals first (closing the
      // hand-offs) and the budgets' counters after (closing the parent's reservation): reversed.
      const TS = 'tenant-recovery-subrun';
      for (const tool of ['settle.held', 'settle.quick'])
        await grantTool(h.client, { tenant: TS, agent: PARENT, tool });
      await grantTool(h.client, { tenant: TS, agent: SUB, tool: 'settle.quick' });
      await h.client.app.services.recovery.stop();
      const ghost = await AppClient.start(h.db.database, { TOOLGATE_REPLICA_LEASE_MS: LEASE_MS });
      const counterHolder = new pg.Client({ connectionString: h.db.url });
      await counterHolder.connect();
      let answer: Promise<unknown> | undefined;
      try {
        // Two tenant budgets, charged by the parent's call and the sub-run's alike.
        const budgets = [
          await createBudget(h.client, { tenant: TS, limit_units: 1000 }),
          await createBudget(h.client, { tenant: TS, period: 'month', limit_units: 1000 }),
        ];
        const [first, second] = budgets.map((b) => b.id).sort();
        await until(
          'the catalog to know the tools',
          () => ghost.app.services.catalog.resolve('settle.held').ok,
          patiently,
        );
        const lost = await lostParentWithSubRun(ghost, TS, 'subrun', 'settle.quick');
        const { runId, subRunId, parentToken, body } = lost;
        answer = lost.answer;

        // The sub-run's reservation holds the first budget's counter and waits for the second's.
        await counterHolder.query('begin');
        await counterHolder.query('select 1 from budget_counters where counter_key = $1 for update', [second]);
        const subAnswer = h.client.post('/runs/execute', {
          token: tokens.agent(SUB, { tenant: TS }),
          body: {
            run_id: subRunId,
            parent_run_id: runId,
            context: {},
            plan: [{ tool_id: 'settle.quick', input: { q: 'sub call' } }],
          },
        });
        await until(
          "the sub-run's reservation to wait",
          async () => (await lockWaits(watcher, '%with expected as%')) === 1,
          patiently,
        );
        // The owner resubmits: its replica ends the lost run, and waits for the first budget's counter.
        const resubmitted = h.client.post('/runs/execute', { token: parentToken, body });
        await until('recovery to wait too', async () => (await lockWaits(watcher)) === 2, patiently);
        await counterHolder.query('commit');

        const res = await resubmitted;
        expect(res.status, JSON.stringify(res.body)).toBe(503);
        expect(res.body).toMatchObject({ status: 'failed', warnings: ['executor_lost'] });
        expect(res.body.steps[0]).toMatchObject({
          status: 'failed',
          error: { details: { reason: 'executor_lost', in_doubt: true } },
        });
        // The sub-run ended with its parent, its call sent or not; nothing stays reserved.
        const sub = await subAnswer;
        expect(['cancelled', 'completed'], JSON.stringify(sub.body)).toContain(sub.body.status);
        const operator = tokens.tenantOperator(TS);
        expect((await h.client.get(`/runs/${subRunId}`, { token: operator })).body.status).toBe(sub.body.status);
        const subCalls = hitsOf(subRunId).length;
        for (const id of [first, second]) {
          // The parent's call in doubt (2) and the sub-run's call if it was sent (1), charged once.
          expect((await h.client.get(`/budgets/${id}`, { token: operator })).body).toMatchObject({
            spent_units: 2 + subCalls,
            reserved_units: 0,
          });
        }
        const open = await h.db.database.control
          .selectFrom('budget_reservations')
          .select('id')
          .where('tenant_id', '=', TS)
          .where('status', '=', 'reserved')
          .execute();
        expect(open).toEqual([]);
      } finally {
        await counterHolder.query('rollback').catch(() => undefined);
        backend.openGate();
        await answer;
        await counterHolder.end();
        await ghost.close();
        h.client.app.services.recovery.start();
      }
    });

    it("starts over, without a deadlock, when a sub-run's reservation lands between its locks and is being released", async () => {
      // Recovery locks the tree's reservations, then its counters. A reservation recorded between
      // the two is not locked; its release (here: the rate stage refused the call) locks it, then
      // its counters — which recovery holds. Recovery must not go on to lock it: it starts over.
      const TR = 'tenant-recovery-release';
      await registerTool(h.client, {
        id: 'settle.limited',
        backendUrl: `${backend.url}/echo`,
        cost_units: 1,
        allowed_agents: [PARENT, SUB],
        rate_limit: { capacity: 1, refill_per_second: 0.000001 },
        timeout_ms: 20_000,
      });
      for (const tool of ['settle.held', 'settle.limited'])
        await grantTool(h.client, { tenant: TR, agent: PARENT, tool });
      await grantTool(h.client, { tenant: TR, agent: SUB, tool: 'settle.limited' });
      await h.client.app.services.recovery.stop();
      const ghost = await AppClient.start(h.db.database, { TOOLGATE_REPLICA_LEASE_MS: LEASE_MS });
      const [parentBudgetHolder, subBudgetHolder, bucketHolder] = [1, 2, 3].map(
        () => new pg.Client({ connectionString: h.db.url }),
      );
      for (const client of [parentBudgetHolder!, subBudgetHolder!, bucketHolder!]) await client.connect();
      let answer: Promise<unknown> | undefined;
      try {
        // The parent's call charges its agent's budget only, the sub-run's its own agent's.
        const parentBudget = await createBudget(h.client, {
          tenant: TR,
          scope: 'agent',
          agent_id: PARENT,
          limit_units: 1000,
        });
        const subBudget = await createBudget(h.client, {
          tenant: TR,
          scope: 'agent',
          agent_id: SUB,
          limit_units: 1000,
        });
        await until(
          'the catalog to know the tools',
          () =>
            ghost.app.services.catalog.resolve('settle.held').ok &&
            h.client.app.services.catalog.resolve('settle.limited').ok,
          patiently,
        );
        const lost = await lostParentWithSubRun(ghost, TR, 'released', 'settle.limited');
        const { runId, subRunId, parentToken, body } = lost;
        answer = lost.answer;

        // The sub-run's call, claimed, is kept at its reservation (its budget's counter held) ...
        const counter = { key: subBudget.id, periodStart: runTotalRef(TR, subRunId).periodStart };
        await subBudgetHolder!.query('begin');
        await subBudgetHolder!.query(
          'insert into budget_counters (counter_key, period_start) values ($1, $2) on conflict (counter_key, period_start) do update set counter_key = excluded.counter_key',
          [counter.key, counter.periodStart],
        );
        await bucketHolder!.query('begin');
        await bucketHolder!.query(
          'insert into rate_buckets (tenant_id, agent_id, tool_id, tokens, updated_at) values ($1, $2, $3, 0, now())',
          [TR, SUB, 'settle.limited'],
        );
        const subAnswer = h.client.post('/runs/execute', {
          token: tokens.agent(SUB, { tenant: TR }),
          body: {
            run_id: subRunId,
            parent_run_id: runId,
            context: {},
            plan: [{ tool_id: 'settle.limited', input: { q: 'refused' } }],
          },
        });
        await until("the sub-run's reservation to wait", async () => (await lockWaits(watcher)) === 1, patiently);
        // ... until recovery has locked the parent's reservation and waits for its budget's counter.
        await parentBudgetHolder!.query('begin');
        await parentBudgetHolder!.query('select 1 from budget_counters where counter_key = $1 for update', [
          parentBudget.id,
        ]);
        const resubmitted = h.client.post('/runs/execute', { token: parentToken, body });
        await until(
          "recovery to wait for the parent budget's counter",
          async () => (await lockWaits(watcher)) === 2,
          patiently,
        );
        // Reserved, the call waits at the rate stage for an empty bucket.
        await subBudgetHolder!.query('commit');
        await until(
          'the call to wait at the rate stage',
          async () => (await lockWaits(watcher, '%rate_buckets%')) === 1,
          patiently,
        );
        // Refused, its reservation's release locks it and waits for the sub-run budget's counter (the release
        // rides the denial record: its statement's start, as pg_stat_activity keeps only the first kilobyte).
        await subBudgetHolder!.query('begin');
        await subBudgetHolder!.query('select 1 from budget_counters where counter_key = $1 for update', [counter.key]);
        await bucketHolder!.query('commit');
        await until('the release to wait', async () => (await lockWaits(watcher, APPEND_STATEMENT)) === 1, patiently);
        // Recovery takes its counters (the sub-run's run total among them), then meets the reservation.
        await parentBudgetHolder!.query('commit');
        await until('recovery to wait for the reservation', async () => (await lockWaits(watcher)) === 2, patiently);
        await subBudgetHolder!.query('commit');

        const res = await resubmitted;
        expect(res.status, JSON.stringify(res.body)).toBe(503);
        expect(res.body).toMatchObject({ status: 'failed', warnings: ['executor_lost'] });
        await subAnswer;
        expect(hitsOf(subRunId)).toEqual([]);
        const reservations = await h.db.database.control
          .selectFrom('budget_reservations')
          .select(['run_id', 'status'])
          .where('tenant_id', '=', TR)
          .execute();
        expect(reservations.map((r) => [r.run_id === runId ? 'parent' : 'sub', r.status]).sort()).toEqual([
          ['parent', 'settled'],
          ['sub', 'released'],
        ]);
        const operator = tokens.tenantOperator(TR);
        expect((await h.client.get(`/budgets/${subBudget.id}`, { token: operator })).body).toMatchObject({
          spent_units: 0,
          reserved_units: 0,
        });
        expect((await h.client.get(`/budgets/${parentBudget.id}`, { token: operator })).body).toMatchObject({
          spent_units: 2,
          reserved_units: 0,
        });
      } finally {
        for (const client of [parentBudgetHolder!, subBudgetHolder!, bucketHolder!])
          await client.query('rollback').catch(() => undefined);
        backend.openGate();
        await answer;
        for (const client of [parentBudgetHolder!, subBudgetHolder!, bucketHolder!]) await client.end();
        await ghost.close();
        h.client.app.services.recovery.start();
      }
    });

    it('runs again when PostgreSQL ends a deadlock by aborting it, instead of failing the resubmission', async () => {
      // A writer that locks out of order: it holds the budget's counter that recovery waits for,
      // then asks for the run recovery holds. Recovery, waiting first, is the deadlock's victim.
      const TD = 'tenant-recovery-victim';
      await grantTool(h.client, { tenant: TD, agent: PARENT, tool: 'settle.held' });
      await h.client.app.services.recovery.stop();
      const ghost = await AppClient.start(h.db.database, { TOOLGATE_REPLICA_LEASE_MS: LEASE_MS });
      const holder = new pg.Client({ connectionString: h.db.url });
      await holder.connect();
      let answer: Promise<unknown> | undefined;
      try {
        const budget = await createBudget(h.client, { tenant: TD, limit_units: 1000 });
        await until(
          'the catalog to know the tools',
          () => ghost.app.services.catalog.resolve('settle.held').ok,
          patiently,
        );
        const runId = newRunId('victim');
        const token = tokens.agent(PARENT, { tenant: TD });
        const body = { run_id: runId, context: {}, plan: [{ tool_id: 'settle.held', input: { q: 'in doubt' } }] };
        answer = ghost.post('/runs/execute', { token, body });
        await until('the held call to reach the backend', () => hitsOf(runId).length === 1, patiently);
        await ghost.app.services.lease.stop();

        // The holder's own deadlock check comes long after recovery's (1 s), so recovery is the victim.
        await holder.query("set deadlock_timeout = '20s'");
        await holder.query('begin');
        await holder.query('select 1 from budget_counters where counter_key = $1 for update', [budget.id]);
        const resubmitted = h.client.post('/runs/execute', { token, body });
        await until('recovery to wait for the counter', async () => (await lockWaits(watcher)) === 1, patiently);
        const outOfOrder = holder
          .query('select 1 from runs where tenant_id = $1 and run_id = $2 for update', [TD, runId])
          .then(
            () => 'locked',
            (error: { code?: string }) => error.code,
          );
        // Had the holder been the victim instead (a machine too slow to ask within a second), the
        // resubmission would pass either way; this test then proves less, but does not fail.
        expect(['locked', '40P01']).toContain(await outOfOrder);
        await holder.query('commit').catch(() => undefined);

        const res = await resubmitted;
        expect(res.status, JSON.stringify(res.body)).toBe(503);
        expect(res.body).toMatchObject({ status: 'failed', warnings: ['executor_lost'] });
        expect(res.body.steps[0]).toMatchObject({
          status: 'failed',
          error: { details: { reason: 'executor_lost', in_doubt: true } },
        });
        expect((await h.client.get(`/budgets/${budget.id}`, { token: tokens.tenantOperator(TD) })).body).toMatchObject({
          spent_units: 2,
          reserved_units: 0,
        });
        expect(await recoveryEvents(runId)).toHaveLength(1);
      } finally {
        await holder.query('rollback').catch(() => undefined);
        backend.openGate();
        await answer;
        await holder.end();
        await ghost.close();
        h.client.app.services.recovery.start();
      }
    });
  },
);
