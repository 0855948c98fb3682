import { sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TestBackend } from './helpers/backend.js';
import { hasPostgresServer } from './helpers/database.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { execute, step } from './helpers/runs.js';
import { tokens } from './helpers/tokens.js';
import { until } from './helpers/waits.js';
import { grantTool, newRunId, registerTool } from './helpers/world.js';

// A run's last call ends the run in the commit of its own record (one commit instead of two):
// the record and the run's end become durable together, or neither does. A run whose row another
// transaction holds then is ended right after, the usual way, and meanwhile nothing else waits.
const T = 'tenant-run-ends';
const AGENT = 'closing.agent';
const OTHER = 'other.agent';
const agent = tokens.agent(AGENT, { tenant: T });
const other = tokens.agent(OTHER, { tenant: T });

let h: Harness;
let backend: TestBackend;

beforeAll(async () => {
  h = await startHarness();
  backend = await new TestBackend().start();
  await registerTool(h.client, {
    id: 'echo',
    backendUrl: `${backend.url}/echo`,
    cost_units: 1,
    allowed_agents: [AGENT, OTHER],
  });
  await registerTool(h.client, {
    id: 'failing',
    backendUrl: `${backend.url}/status/500`,
    cost_units: 1,
    allowed_agents: [AGENT],
  });
  await registerTool(h.client, {
    id: 'ungranted',
    backendUrl: `${backend.url}/echo`,
    cost_units: 1,
    allowed_agents: [AGENT],
  });
  await registerTool(h.client, {
    id: 'gated',
    backendUrl: `${backend.url}/gate`,
    cost_units: 1,
    allowed_agents: [AGENT],
  });
  await registerTool(h.client, {
    id: 'scarce',
    backendUrl: `${backend.url}/echo`,
    cost_units: 1,
    allowed_agents: [AGENT],
    rate_limit: { capacity: 1, refill_per_second: 0.001 },
  });
  for (const tool of ['echo', 'failing', 'gated', 'scarce'])
    await grantTool(h.client, { tenant: T, agent: AGENT, tool });
  await grantTool(h.client, { tenant: T, agent: OTHER, tool: 'echo' });
});

afterAll(async () => {
  await backend?.close();
  await h?.close();
});

/** The transaction that wrote the run's row as it stands, and each of its records, by event id. */
async function writers(
  runId: string,
): Promise<{ run: string; status: string; records: Map<string, { xid: string; event_type: string }> }> {
  const db = h.db.database.control;
  const run = await sql<{
    xid: string;
    status: string;
  }>`select xmin::text as xid, status from runs where tenant_id = ${T} and run_id = ${runId}`.execute(db);
  const records = await sql<{ event_id: string; xid: string; event_type: string }>`
    select event_id, xmin::text as xid, event_type from audit_events where tenant_id = ${T} and run_id = ${runId} order by seq`.execute(
    db,
  );
  return {
    run: run.rows[0]!.xid,
    status: run.rows[0]!.status,
    records: new Map(records.rows.map((r) => [r.event_id, { xid: r.xid, event_type: r.event_type }])),
  };
}

describe('a run ends in the commit of its last record', () => {
  it('when its last call completes', async () => {
    const runId = newRunId('done');
    const res = await execute(h.client, agent, { run_id: runId, plan: [step('echo')] });
    expect(res.status).toBe(200);
    expect(res.body.status).toBe('completed');
    const seen = await writers(runId);
    expect(seen.status).toBe('completed');
    const outcome = seen.records.get(res.body.steps[0].audit_id);
    expect(outcome).toEqual({ xid: seen.run, event_type: 'run.step.completed' });
    // The envelope stored with the end is the answer: a resubmission replays it as it was.
    const replay = await execute(h.client, agent, { run_id: runId, plan: [step('echo')] });
    expect(replay.body).toEqual(res.body);
  });

  it('when its call fails at the backend, with the steps after it skipped', async () => {
    const runId = newRunId('failed');
    const res = await execute(h.client, agent, { run_id: runId, plan: [step('failing'), step('echo')] });
    expect(res.status).toBe(502);
    expect(res.body).toMatchObject({
      status: 'failed',
      steps: [{ status: 'failed', error: { code: 'tool_backend_failed' } }, { status: 'skipped' }],
    });
    const seen = await writers(runId);
    expect(seen.status).toBe('failed');
    expect(seen.records.get(res.body.steps[0].audit_id)).toEqual({ xid: seen.run, event_type: 'run.step.failed' });
    expect((await execute(h.client, agent, { run_id: runId, plan: [step('failing'), step('echo')] })).body).toEqual(
      res.body,
    );
  });

  it('when its call is denied', async () => {
    const runId = newRunId('denied');
    const res = await execute(h.client, agent, { run_id: runId, plan: [step('ungranted')] });
    expect(res.status).toBe(403);
    expect(res.body.steps[0]).toMatchObject({ status: 'denied', error: { code: 'grant_missing' } });
    const seen = await writers(runId);
    expect(seen.status).toBe('failed');
    expect(seen.records.get(res.body.steps[0].audit_id)).toEqual({ xid: seen.run, event_type: 'run.step.denied' });
  });

  it('when its call is rate limited: the run is let go of, throttled, in the commit of the denial', async () => {
    expect((await execute(h.client, agent, { run_id: newRunId('spend'), plan: [step('scarce')] })).status).toBe(200);
    const runId = newRunId('throttled');
    const res = await execute(h.client, agent, { run_id: runId, plan: [step('scarce'), step('echo')] });
    expect(res.status).toBe(429);
    expect(res.body).toMatchObject({
      status: 'throttled',
      retry_after_seconds: expect.any(Number),
      steps: [{ status: 'denied', error: { code: 'rate_limited' } }, { status: 'skipped' }],
    });
    const seen = await writers(runId);
    expect(seen.status).toBe('throttled');
    expect(seen.records.get(res.body.steps[0].audit_id)).toEqual({ xid: seen.run, event_type: 'run.step.denied' });
    // Not busy: a resubmission is refused by the bucket again, not as a run still executing.
    const again = await execute(h.client, agent, { run_id: runId, plan: [step('scarce'), step('echo')] });
    expect(again.status).toBe(429);
    expect(again.body.steps[0].error.code).toBe('rate_limited');
  });

  it('only with the last step of its plan', async () => {
    const runId = newRunId('two');
    const res = await execute(h.client, agent, { run_id: runId, plan: [step('echo'), step('echo')] });
    expect(res.status).toBe(200);
    const seen = await writers(runId);
    const [first, last] = res.body.steps.map((s: { audit_id: string }) => seen.records.get(s.audit_id)!);
    expect(last!.xid).toBe(seen.run);
    expect(first!.xid).not.toBe(seen.run);
  });

  it('not when its envelope is large: the run ends right after, in a commit of its own', async () => {
    const runId = newRunId('large');
    const input = { q: 'x'.repeat(100_000) };
    const res = await execute(h.client, agent, { run_id: runId, plan: [{ tool_id: 'echo', input }] });
    expect(res.status).toBe(200);
    expect(res.body.steps[0].output).toEqual({ echo: input });
    const seen = await writers(runId);
    expect(seen.status).toBe('completed');
    expect(seen.records.get(res.body.steps[0].audit_id)!.xid).not.toBe(seen.run);
    expect((await execute(h.client, agent, { run_id: runId, plan: [{ tool_id: 'echo', input }] })).body).toEqual(
      res.body,
    );
  });

  it('not when the run is kept open: it rests running', async () => {
    const runId = newRunId('open');
    const res = await execute(h.client, agent, { run_id: runId, keep_open: true, plan: [step('echo')] });
    expect(res.status).toBe(200);
    expect(res.body.status).toBe('running');
    const seen = await writers(runId);
    expect(seen.status).toBe('running');
    expect(seen.records.get(res.body.steps[0].audit_id)!.xid).not.toBe(seen.run);
  });
});

describe.skipIf(!hasPostgresServer)(
  'a run whose row is held when its last record is appended (needs a PostgreSQL server)',
  () => {
    it('is ended after the holder lets go, while the audit log goes on meanwhile', async () => {
      const runId = newRunId('held');
      const holder = new pg.Client({ connectionString: h.db.url });
      await holder.connect();
      try {
        const running = execute(h.client, agent, { run_id: runId, plan: [step('gated')] });
        await backend.waitForHits('/gate', backend.hitsOn('/gate').length + 1);
        // Something holds the run's row without the audit chain: the record carrying the run's end
        // holds the chain's head, and must not wait for the row with it.
        await holder.query('begin');
        await holder.query('select 1 from runs where tenant_id = $1 and run_id = $2 for no key update', [T, runId]);
        backend.openGate();
        const recorded = async () =>
          (
            await holder.query(
              "select count(*)::int as n from audit_events where run_id = $1 and event_type = 'run.step.completed'",
              [runId],
            )
          ).rows[0].n === 1;
        await until('the outcome record to go in without the run’s end', recorded);
        // Another run's calls are recorded and answered while the row is held.
        const meanwhile = await execute(h.client, other, { run_id: newRunId('meanwhile'), plan: [step('echo')] });
        expect(meanwhile.status).toBe(200);
        expect(
          (await holder.query('select status from runs where tenant_id = $1 and run_id = $2', [T, runId])).rows[0]
            .status,
        ).toBe('running');
        await holder.query('commit');
        const res = await running;
        expect(res.status).toBe(200);
        expect(res.body.status).toBe('completed');
        const seen = await writers(runId);
        expect(seen.status).toBe('completed');
        // Ended in a commit of its own.
        expect(seen.records.get(res.body.steps[0].audit_id)!.xid).not.toBe(seen.run);
      } finally {
        await holder.end();
      }
    });
  },
);
