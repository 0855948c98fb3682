import { sql } from 'kysely';
import { runCounterKey } from '../src/budgets/budget.js';
import { closeLostRunReservations } from '../src/budgets/reservation-close-repository.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TestBackend } from './helpers/backend.js';
import { AppClient, startHarness, type Harness } from './helpers/harness.js';
import { ManualClock, startClient } from './helpers/manual-clock.js';
import { execute, step } from './helpers/runs.js';
import { tokens } from './helpers/tokens.js';
import { createBudget, grantTool, newRunId, registerTool, toolBody } from './helpers/world.js';
import { until } from './helpers/waits.js';

const T = 'tenant-runs';
const AGENT = 'veritas.fact-checker';
const agent = tokens.agent(AGENT, { tenant: T, family: 'veritas', scope: 'scf:read' });
const operator = tokens.tenantOperator(T);

let h: Harness;
let backend: TestBackend;

/** A run's budget reservations, as stored. */
const reservationsOf = (tenant: string, runId: string) =>
  h.db.database.control
    .selectFrom('budget_reservations')
    .selectAll()
    .where('tenant_id', '=', tenant)
    .where('run_id', '=', runId)
    .execute();

beforeAll(async () => {
  h = await startHarness({ TOOLGATE_SECRET_ECHO_KEY: 'k-123-secret' });
  backend = await new TestBackend().start();
  const base = { allowed_agents: [AGENT] };
  await registerTool(h.client, { id: 'echo', backendUrl: `${backend.url}/echo`, ...base });
  await registerTool(h.client, {
    id: 'echo',
    version: '2.0.0',
    backendUrl: `${backend.url}/echo`,
    ...base,
    cost_units: 2,
  });
  await registerTool(h.client, {
    id: 'final.publish',
    category: 'final_write',
    risk_level: 'high',
    backendUrl: `${backend.url}/echo`,
  });
  await registerTool(h.client, {
    id: 'web.fetch',
    category: 'external_call',
    risk_level: 'medium',
    egress: { allowed_hosts: ['example.com'] },
    ...base,
  });
  await registerTool(h.client, {
    id: 'not.allowed',
    backendUrl: `${backend.url}/echo`,
    allowed_agents: ['someone.else'],
  });
  await registerTool(h.client, { id: 'ungranted', backendUrl: `${backend.url}/echo`, ...base });
  await registerTool(h.client, {
    id: 'scoped',
    backendUrl: `${backend.url}/echo`,
    ...base,
    required_scopes: [{ scope: 'scf:write', required: true, rationale: 'writes drafts' }],
  });
  await registerTool(h.client, {
    id: 'contextual',
    backendUrl: `${backend.url}/echo`,
    ...base,
    required_context: ['organization_id', 'assessment_id'],
  });
  await registerTool(h.client, { id: 'no.backend', backendUrl: null, ...base });
  await registerTool(h.client, { id: 'hangs', backendUrl: `${backend.url}/hang`, timeout_ms: 300, ...base });
  await registerTool(h.client, { id: 'fails', backendUrl: `${backend.url}/status/500`, ...base });
  await registerTool(h.client, { id: 'html', backendUrl: `${backend.url}/html`, ...base });
  await registerTool(h.client, {
    id: 'huge',
    backendUrl: `${backend.url}/big`,
    max_response_bytes: 64 * 1024,
    ...base,
  });
  await registerTool(h.client, { id: 'wrong.shape', backendUrl: `${backend.url}/wrong-shape`, ...base });
  await registerTool(h.client, { id: 'costly', backendUrl: `${backend.url}/cost/3`, ...base, cost_units: 5 });
  await registerTool(h.client, {
    id: 'limited',
    backendUrl: `${backend.url}/echo`,
    ...base,
    rate_limit: { capacity: 2, refill_per_second: 0.01 },
  });
  await registerTool(h.client, {
    id: 'refilling',
    backendUrl: `${backend.url}/echo`,
    ...base,
    rate_limit: { capacity: 1, refill_per_second: 2 },
  });
  await registerTool(h.client, { id: 'switched', backendUrl: `${backend.url}/echo`, ...base });
  await registerTool(h.client, { id: 'expensive', backendUrl: `${backend.url}/echo`, ...base, cost_units: 1000 });
  const keyed = await h.client.post('/tools', {
    token: tokens.platform(),
    body: {
      ...toolBody({ id: 'keyed', backendUrl: `${backend.url}/echo`, ...base }),
      backend: {
        url: `${backend.url}/echo`,
        method: 'POST',
        timeout_ms: 2000,
        max_response_bytes: 65536,
        headers: { 'x-api-key': { from_env: 'TOOLGATE_SECRET_ECHO_KEY' } },
      },
    },
  });
  expect(keyed.status).toBe(201);
  for (const tool of [
    'keyed',
    'echo',
    'web.fetch',
    'scoped',
    'contextual',
    'no.backend',
    'hangs',
    'fails',
    'html',
    'huge',
    'wrong.shape',
    'costly',
    'limited',
    'refilling',
    'switched',
    'expensive',
  ]) {
    await grantTool(h.client, { tenant: T, agent: AGENT, tool });
  }
  await createBudget(h.client, { tenant: T, scope: 'agent', agent_id: AGENT, limit_units: 500, warn_ratio: 0.99 });
});

afterAll(async () => {
  await backend?.close();
  await h?.close();
});

describe('POST /runs/execute: a run that completes', () => {
  it('dispatches every step to its backend and answers 200 with the envelope', async () => {
    const runId = newRunId();
    const res = await execute(h.client, agent, {
      run_id: runId,
      plan: [step('echo', 'one'), step('echo', 'two', '^2')],
    });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ run_id: runId, status: 'completed', dry_run: false, warnings: [] });
    expect(res.body.steps).toMatchObject([
      {
        index: 0,
        tool_id: 'echo',
        version: '2.0.0',
        status: 'completed',
        output: { echo: { q: 'one' } },
        cost_units: 2,
      },
      {
        index: 1,
        tool_id: 'echo',
        version: '2.0.0',
        status: 'completed',
        output: { echo: { q: 'two' } },
        cost_units: 2,
      },
    ]);
    expect(res.body.steps[0].audit_id).toMatch(/^[0-9a-f-]{36}$/);
  });

  it('sends the backend the run, tenant and agent, and continues the caller’s trace', async () => {
    const runId = newRunId();
    const traceId = '4bf92f3577b34da6a3ce929d0e0e4736';
    const before = backend.hitsOn('/echo').length;
    await h.client.post('/runs/execute', {
      token: agent,
      headers: { traceparent: `00-${traceId}-00f067aa0ba902b7-01` },
      body: { run_id: runId, context: {}, plan: [step('echo', 'trace', '1.0.0')] },
    });
    const hit = backend.hitsOn('/echo')[before]!;
    expect(hit.headers['x-toolgate-run-id']).toBe(runId);
    expect(hit.headers['x-toolgate-tenant-id']).toBe(T);
    expect(hit.headers['x-toolgate-agent-id']).toBe(AGENT);
    expect(hit.headers.traceparent).toMatch(new RegExp(`^00-${traceId}-[0-9a-f]{16}-01$`));
    expect(hit.headers.authorization).toBeUndefined();
  });

  it('starts a fresh trace, audited with the run, when the caller sends none, and a new span id per dispatch', async () => {
    const runId = newRunId();
    const before = backend.hitsOn('/echo').length;
    await execute(h.client, agent, { run_id: runId, plan: [step('echo', 'a', '1.0.0'), step('echo', 'b', '1.0.0')] });
    const hits = backend.hitsOn('/echo').slice(before);
    expect(hits).toHaveLength(2);
    const parts = hits.map((hit) => /^00-([0-9a-f]{32})-([0-9a-f]{16})-01$/.exec(String(hit.headers.traceparent)));
    expect(parts[0]).not.toBeNull();
    expect(parts[1]).not.toBeNull();
    const [traceId, firstSpan] = [parts[0]![1]!, parts[0]![2]!];
    expect(traceId).not.toMatch(/^0+$/);
    expect(parts[1]![1]).toBe(traceId);
    expect(parts[1]![2]).not.toBe(firstSpan);
    const events = await h.client.get('/audit', { token: operator, query: { run_id: runId } });
    expect(events.body.items.map((e: { trace_id: string }) => e.trace_id)).toEqual(Array(4).fill(traceId));
  });

  it('writes an intent record before and an outcome record after each dispatch, with hashes not payloads', async () => {
    const runId = newRunId();
    await execute(h.client, agent, { run_id: runId, plan: [step('echo', 'secret-payload', '1.0.0')] });
    const events = await h.client.get('/audit', { token: operator, query: { run_id: runId } });
    const types = events.body.items.map((e: { event_type: string }) => e.event_type).reverse();
    expect(types).toEqual(['run.step.dispatching', 'run.step.completed']);
    const [outcome, intent] = events.body.items;
    expect(intent.seq).toBeLessThan(outcome.seq);
    expect(outcome).toMatchObject({
      tool_id: 'echo',
      tool_version: '1.0.0',
      tool_category: 'read_only',
      status: 'completed',
      cost_units: 1,
    });
    expect(outcome.input_sha256).toMatch(/^[0-9a-f]{64}$/);
    expect(outcome.output_sha256).toMatch(/^[0-9a-f]{64}$/);
    expect(JSON.stringify(events.body)).not.toContain('secret-payload');
  });

  it('sends backend secrets named by the contract, and never records them', async () => {
    const runId = newRunId();
    const res = await execute(h.client, agent, { run_id: runId, plan: [step('keyed', 'with key')] });
    expect(res.status).toBe(200);
    const hit = backend.hitsOfRun(runId)[0]!;
    expect(hit.headers['x-api-key']).toBe('k-123-secret');
    const events = await h.client.get('/audit', { token: operator, query: { run_id: runId } });
    expect(events.text).not.toContain('k-123-secret');
    expect((await h.client.get('/tools/keyed', { token: tokens.platform() })).text).not.toContain('k-123-secret');
  });

  it('refuses to dispatch on a replica that lacks a backend secret (503, nothing sent)', async () => {
    const replica = await AppClient.start(h.db.database);
    try {
      const runId = newRunId();
      const res = await replica.post('/runs/execute', {
        token: agent,
        body: { run_id: runId, context: {}, plan: [step('keyed', 'no key')] },
      });
      expect(res.status).toBe(503);
      expect(res.body.steps[0].error.code).toBe('tool_backend_not_configured');
      expect(backend.hitsOfRun(runId)).toEqual([]);
    } finally {
      await replica.close();
    }
  });

  it('charges what the backend reports it cost', async () => {
    const runId = newRunId();
    const res = await execute(h.client, agent, { run_id: runId, plan: [step('costly')] });
    expect(res.body.steps[0].cost_units).toBe(3);
  });

  it("keeps a run's own total only where a limit can be checked against it: its budget_units", async () => {
    const total = async (runId: string) =>
      (
        await h.db.database.control
          .selectFrom('budget_counters')
          .select('spent_units')
          .where('counter_key', '=', runCounterKey(T, runId))
          .execute()
      ).map((row) => Number(row.spent_units));
    const charged = async (runId: string) =>
      (await reservationsOf(T, runId)).flatMap((row) =>
        (row.charges as Array<{ counter_key: string }>).map((charge) => charge.counter_key),
      );
    const plain = newRunId();
    expect((await execute(h.client, agent, { run_id: plain, plan: [step('costly')] })).status).toBe(200);
    expect(await total(plain)).toEqual([]);
    expect(await charged(plain)).not.toContain(runCounterKey(T, plain));
    const limited = newRunId();
    const res = await execute(h.client, agent, {
      run_id: limited,
      plan: [step('costly'), step('costly')],
      budget_units: 7,
    });
    expect(res.status, JSON.stringify(res.body)).toBe(402);
    // 3 spent by the first call; the second reserves 5, past the run's 7.
    expect(res.body.steps.map((s: { status: string }) => s.status)).toEqual(['completed', 'denied']);
    expect(await total(limited)).toEqual([3]);
  });

  it('drops the stored request of a run it ended, and still replays it or refuses another request under its id', async () => {
    const stored = async (runId: string) =>
      (
        await h.db.database.control
          .selectFrom('runs')
          .select(['request', 'request_sha256'])
          .where('tenant_id', '=', T)
          .where('run_id', '=', runId)
          .executeTakeFirstOrThrow()
      ).request;
    const done = newRunId();
    const body = { run_id: done, plan: [step('echo')] };
    expect((await execute(h.client, agent, body)).status).toBe(200);
    expect(await stored(done)).toBeNull();
    const replay = await execute(h.client, agent, body);
    expect(replay.status).toBe(200);
    expect(replay.headers['x-toolgate-replayed']).toBe('true');
    expect((await execute(h.client, agent, { ...body, plan: [step('echo'), step('echo')] })).status).toBe(409);
  });
});

describe("a first call's reservation made with its run's claim", () => {
  const T7 = 'tenant-runs-claim-charge';
  const chargedAgent = tokens.agent(AGENT, { tenant: T7, family: 'veritas', scope: 'scf:read' });

  it('is given back when a later stage refuses the call, and settled when it completes', async () => {
    await grantTool(h.client, { tenant: T7, agent: AGENT, tool: 'echo' });
    const budget = await createBudget(h.client, { tenant: T7, limit_units: 100 });
    const shown = async () =>
      (await h.client.get(`/budgets/${budget.id}`, { token: tokens.tenantOperator(T7) })).body as {
        spent_units: number;
        reserved_units: number;
      };
    const statuses = async (runId: string) => (await reservationsOf(T7, runId)).map((row) => row.status);
    // The transaction that last wrote a run's reservation, and the one that appended its record of `eventType`.
    const commitsOf = async (runId: string, eventType: string) => {
      const { rows } = await sql<{ xid: string }>`
        select xmin::text as xid from budget_reservations where tenant_id = ${T7} and run_id = ${runId}
        union all
        select xmin::text from audit_events where tenant_id = ${T7} and run_id = ${runId} and event_type = ${eventType}`.execute(
        h.db.database.control,
      );
      return rows.map((row) => row.xid);
    };
    // The gateway learns the budget with a first call; later claims reserve with it.
    for (let i = 0; i < 3; i += 1) {
      const done = newRunId();
      expect((await execute(h.client, chargedAgent, { run_id: done, plan: [step('echo')] })).status).toBe(200);
      expect(await statuses(done)).toEqual(['settled']);
      // Settled by the outcome record's own commit.
      const commits = await commitsOf(done, 'run.step.completed');
      expect(commits).toHaveLength(2);
      expect(new Set(commits).size).toBe(1);
    }
    const refused = newRunId();
    const res = await execute(h.client, chargedAgent, {
      run_id: refused,
      plan: [{ tool_id: 'echo', input: { q: 'x', extra: true } }],
    });
    expect(res.status, JSON.stringify(res.body)).toBe(422);
    expect(res.body.steps[0].error.code).toBe('tool_input_schema_invalid');
    // Refused before its run was claimed: nothing was reserved, and its record created the run already ended.
    expect(await statuses(refused)).toEqual([]);
    const { rows: ran } = await sql<{ status: string; xid: string }>`
      select status, xmin::text as xid from runs where tenant_id = ${T7} and run_id = ${refused}`.execute(
      h.db.database.control,
    );
    expect(ran.map((row) => row.status)).toEqual(['failed']);
    expect(await commitsOf(refused, 'run.step.denied')).toEqual([ran[0]!.xid]);
    // Three calls of echo@2.0.0 at 2 units each.
    expect(await shown()).toMatchObject({ spent_units: 6, reserved_units: 0 });
  });
});

describe("a first call its budget refuses, refused with its run's claim", () => {
  const T9 = 'tenant-runs-claim-refusal';
  const agent = tokens.agent(AGENT, { tenant: T9, family: 'veritas', scope: 'scf:read' });

  it('is one statement: its record creates the run already ended, confirming the levels it was refused on', async () => {
    await grantTool(h.client, { tenant: T9, agent: AGENT, tool: 'echo' });
    const budget = await createBudget(h.client, { tenant: T9, limit_units: 3 });
    // The gateway learns the budget with a first call (echo@2.0.0: 2 units).
    expect((await execute(h.client, agent, { run_id: newRunId(), plan: [step('echo')] })).status).toBe(200);
    let fewest = Infinity;
    for (let i = 0; i < 8; i += 1) {
      const runId = newRunId();
      const before = h.db.database.statementsSent();
      const res = await execute(h.client, agent, { run_id: runId, plan: [step('echo')] });
      fewest = Math.min(fewest, h.db.database.statementsSent() - before);
      expect(res.status, JSON.stringify(res.body)).toBe(402);
      expect(res.body.steps[0].error).toMatchObject({
        code: 'budget_exceeded',
        details: { budget_id: budget.id, consumed_units: 2, requested_units: 2, limit_units: 3 },
      });
      expect(await reservationsOf(T9, runId)).toEqual([]);
      const { rows } = await sql<{ xid: string }>`
        select xmin::text as xid from runs where tenant_id = ${T9} and run_id = ${runId} and status = 'killed'
        union all
        select xmin::text from audit_events where tenant_id = ${T9} and run_id = ${runId}`.execute(
        h.db.database.control,
      );
      expect(rows).toHaveLength(2);
      expect(new Set(rows.map((row) => row.xid)).size).toBe(1);
    }
    expect(fewest).toBe(1);
  });

  it('is decided again when the levels it was refused on moved behind the copy, and admitted', async () => {
    const T15 = 'tenant-runs-refusal-moved';
    const agent15 = tokens.agent(AGENT, { tenant: T15, family: 'veritas', scope: 'scf:read' });
    await grantTool(h.client, { tenant: T15, agent: AGENT, tool: 'echo' });
    const budget = await createBudget(h.client, { tenant: T15, limit_units: 3 });
    expect((await execute(h.client, agent15, { run_id: newRunId(), plan: [step('echo')] })).status).toBe(200);
    expect((await execute(h.client, agent15, { run_id: newRunId(), plan: [step('echo')] })).status).toBe(402);
    // Given back behind this replica's copy (its levels still say 2 of 3 are spent).
    await sql`update budget_counters set spent_units = 0 where counter_key = ${budget.id}`.execute(
      h.db.database.control,
    );
    const res = await execute(h.client, agent15, { run_id: newRunId(), plan: [step('echo')] });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const shown = await h.client.get(`/budgets/${budget.id}`, { token: tokens.tenantOperator(T15) });
    expect(shown.body).toMatchObject({ spent_units: 2, reserved_units: 0 });
  });
});

describe("a first call its rate limit refuses, from this replica's level of the bucket", () => {
  const rateDenials = async () =>
    Number(
      /toolgate_rate_limit_denials_total\{tool_id="limited"\} (\d+)/.exec((await h.client.get('/metrics')).text)?.[1] ??
        0,
    );
  const T13 = 'tenant-runs-rate-refusal';
  const agent13 = tokens.agent(AGENT, { tenant: T13, family: 'veritas', scope: 'scf:read' });
  const bucket = async (tenant: string) =>
    (
      await sql<{ tokens: number; xid: string }>`
        select tokens, xmin::text as xid from rate_buckets where tenant_id = ${tenant} and tool_id = 'limited'`.execute(
        h.db.database.control,
      )
    ).rows;

  beforeAll(async () => {
    await grantTool(h.client, { tenant: T13, agent: AGENT, tool: 'echo' });
    await grantTool(h.client, { tenant: T13, agent: AGENT, tool: 'limited' });
    await createBudget(h.client, { tenant: T13, limit_units: 1000 });
    expect((await execute(h.client, agent13, { run_id: newRunId(), plan: [step('echo')] })).status).toBe(200);
  });

  it('is one statement: its record creates the run throttled, and the bucket is not written', async () => {
    // `limited` holds two tokens and refills one in 100 s.
    for (let i = 0; i < 2; i += 1)
      expect((await execute(h.client, agent13, { run_id: newRunId(), plan: [step('limited')] })).status).toBe(200);
    expect((await execute(h.client, agent13, { run_id: newRunId(), plan: [step('limited')] })).status).toBe(429);
    const emptied = await bucket(T13);
    let fewest = Infinity;
    for (let i = 0; i < 8; i += 1) {
      const runId = newRunId();
      const before = h.db.database.statementsSent();
      const res = await execute(h.client, agent13, { run_id: runId, plan: [step('limited')] });
      fewest = Math.min(fewest, h.db.database.statementsSent() - before);
      expect(res.status, JSON.stringify(res.body)).toBe(429);
      expect(res.body).toMatchObject({ status: 'throttled', retry_after_seconds: expect.any(Number) });
      expect(res.body.steps[0].error.code).toBe('rate_limited');
      const { rows } = await sql<{ kind: string; xid: string }>`
        select status as kind, xmin::text as xid from runs where tenant_id = ${T13} and run_id = ${runId}
        union all
        select event_type, xmin::text from audit_events where tenant_id = ${T13} and run_id = ${runId}`.execute(
        h.db.database.control,
      );
      expect(rows.map((row) => row.kind)).toEqual(['throttled', 'run.step.denied']);
      expect(new Set(rows.map((row) => row.xid)).size).toBe(1);
      expect(await reservationsOf(T13, runId)).toEqual([]);
    }
    expect(fewest).toBe(1);
    expect(await bucket(T13)).toEqual(emptied);
  });

  it('counts a refusal decided from the bucket level it knows once', async () => {
    const T18 = 'tenant-runs-rate-refusal-counted';
    const agent18 = tokens.agent(AGENT, { tenant: T18, family: 'veritas', scope: 'scf:read' });
    await grantTool(h.client, { tenant: T18, agent: AGENT, tool: 'echo' });
    await grantTool(h.client, { tenant: T18, agent: AGENT, tool: 'limited' });
    await createBudget(h.client, { tenant: T18, limit_units: 1000 });
    for (let i = 0; i < 2; i += 1)
      expect((await execute(h.client, agent18, { run_id: newRunId(), plan: [step('limited')] })).status).toBe(200);
    const before = await rateDenials();
    expect((await execute(h.client, agent18, { run_id: newRunId(), plan: [step('limited')] })).status).toBe(429);
    expect(await rateDenials()).toBe(before + 1);
  });

  it('is decided again when the bucket moved behind the copy, and admitted', async () => {
    const T16 = 'tenant-runs-rate-refusal-moved';
    const agent16 = tokens.agent(AGENT, { tenant: T16, family: 'veritas', scope: 'scf:read' });
    await grantTool(h.client, { tenant: T16, agent: AGENT, tool: 'limited' });
    for (let i = 0; i < 2; i += 1)
      expect((await execute(h.client, agent16, { run_id: newRunId(), plan: [step('limited')] })).status).toBe(200);
    expect((await execute(h.client, agent16, { run_id: newRunId(), plan: [step('limited')] })).status).toBe(429);
    // Tokens given back by another replica: this one's level of the bucket does not know.
    await sql`update rate_buckets set tokens = 1 where tenant_id = ${T16} and tool_id = 'limited'`.execute(
      h.db.database.control,
    );
    const before = await rateDenials();
    const res = await execute(h.client, agent16, { run_id: newRunId(), plan: [step('limited')] });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    // The refusal decided from the level it knew did not stand: no denial is counted for the call admitted.
    expect(await rateDenials()).toBe(before);
    expect((await execute(h.client, agent16, { run_id: newRunId(), plan: [step('limited')] })).status).toBe(429);
    expect(await rateDenials()).toBe(before + 1);
  });

  it('is refused for its revoked grant, not its rate limit, when the grant was revoked behind the copy', async () => {
    const T17 = 'tenant-runs-rate-refusal-revoked';
    const agent17 = tokens.agent(AGENT, { tenant: T17, family: 'veritas', scope: 'scf:read' });
    const granted = await grantTool(h.client, { tenant: T17, agent: AGENT, tool: 'limited' });
    for (let i = 0; i < 2; i += 1)
      expect((await execute(h.client, agent17, { run_id: newRunId(), plan: [step('limited')] })).status).toBe(200);
    expect((await execute(h.client, agent17, { run_id: newRunId(), plan: [step('limited')] })).status).toBe(429);
    await h.db.database.control.transaction().execute(async (trx) => {
      await sql`alter table grants disable trigger grants_changed`.execute(trx);
      await sql`update grants set revoked_at = now(), revoked_by_actor_id = 'test' where id = ${granted.id}`.execute(
        trx,
      );
      await sql`alter table grants enable trigger grants_changed`.execute(trx);
    });
    const res = await execute(h.client, agent17, { run_id: newRunId(), plan: [step('limited')] });
    expect(res.status, JSON.stringify(res.body)).toBe(403);
    expect(res.body.steps[0].error.code).toBe('grant_revoked');
  });
});

describe('a first call admitted before its run is claimed, the claim riding its intent record', () => {
  const T10 = 'tenant-runs-claim-intent';
  const agent10 = tokens.agent(AGENT, { tenant: T10, family: 'veritas', scope: 'scf:read' });
  const recordsOf = async (tenant: string, runId: string) =>
    (
      await sql<{ event_type: string; reason_code: string | null; xid: string }>`
        select event_type, reason_code, xmin::text as xid from audit_events
        where tenant_id = ${tenant} and run_id = ${runId} order by seq`.execute(h.db.database.control)
    ).rows;
  const grantUseCommits = async (tenant: string, runId: string) =>
    (
      await sql<{ xid: string }>`
        select xmin::text as xid from run_grant_uses where tenant_id = ${tenant} and run_id = ${runId}`.execute(
        h.db.database.control,
      )
    ).rows.map((row) => row.xid);

  beforeAll(async () => {
    await grantTool(h.client, { tenant: T10, agent: AGENT, tool: 'echo' });
    await grantTool(h.client, { tenant: T10, agent: AGENT, tool: 'limited' });
    await createBudget(h.client, { tenant: T10, limit_units: 1000 });
    // The gateway learns the tenant's budgets with a first call.
    expect((await execute(h.client, agent10, { run_id: newRunId(), plan: [step('echo')] })).status).toBe(200);
  });

  it('is two statements: the run, its grant use and its reservation commit with the intent record', async () => {
    let fewest = Infinity;
    for (let i = 0; i < 8; i += 1) {
      const runId = newRunId();
      const before = h.db.database.statementsSent();
      const res = await execute(h.client, agent10, { run_id: runId, plan: [step('echo')] });
      fewest = Math.min(fewest, h.db.database.statementsSent() - before);
      expect(res.status, JSON.stringify(res.body)).toBe(200);
      const records = await recordsOf(T10, runId);
      expect(records.map((r) => r.event_type)).toEqual(['run.step.dispatching', 'run.step.completed']);
      // The grant use went in the intent record's commit; the reservation too, settled since by the outcome's.
      expect(await grantUseCommits(T10, runId)).toEqual([records[0]!.xid]);
      expect((await reservationsOf(T10, runId)).map((r) => [r.status, Number(r.actual_units)])).toEqual([
        ['settled', 2],
      ]);
    }
    expect(fewest).toBe(2);
  });

  it("carries a later call's reservation with its intent record: a run of two calls is four statements", async () => {
    let fewest = Infinity;
    for (let i = 0; i < 8; i += 1) {
      const runId = newRunId();
      const before = h.db.database.statementsSent();
      const res = await execute(h.client, agent10, { run_id: runId, plan: [step('echo'), step('echo')] });
      fewest = Math.min(fewest, h.db.database.statementsSent() - before);
      expect(res.status, JSON.stringify(res.body)).toBe(200);
      const records = await recordsOf(T10, runId);
      expect(records.map((r) => r.event_type)).toEqual([
        'run.step.dispatching',
        'run.step.completed',
        'run.step.dispatching',
        'run.step.completed',
      ]);
      // Each call's intent cites the reservation its statement wrote; each outcome settled it.
      const { rows } = await sql<{ id: string; status: string }>`
        select id, status from budget_reservations where tenant_id = ${T10} and run_id = ${runId}`.execute(
        h.db.database.control,
      );
      expect(rows.map((r) => r.status)).toEqual(['settled', 'settled']);
      const cited = await sql<{ id: string }>`
        select details->>'reservation_id' as id from audit_events
        where tenant_id = ${T10} and run_id = ${runId} and event_type = 'run.step.dispatching'`.execute(
        h.db.database.control,
      );
      expect(new Set(cited.rows.map((r) => r.id))).toEqual(new Set(rows.map((r) => r.id)));
    }
    expect(fewest).toBe(4);
  });

  it('sends no later call of a run cancelled meanwhile: its intent record finds the run stopped', async () => {
    await registerTool(h.client, { id: 'gated.echo', backendUrl: `${backend.url}/gate`, allowed_agents: [AGENT] });
    await grantTool(h.client, { tenant: T10, agent: AGENT, tool: 'gated.echo' });
    expect((await execute(h.client, agent10, { run_id: newRunId(), plan: [step('echo')] })).status).toBe(200);
    const runId = newRunId();
    const gated = backend.hitsOn('/gate').length;
    const answer = execute(h.client, agent10, { run_id: runId, plan: [step('gated.echo'), step('echo', 'never')] });
    await backend.waitForHits('/gate', gated + 1);
    const operator10 = tokens.tenantOperator(T10);
    expect((await h.client.post(`/runs/${runId}/cancel`, { token: operator10, body: {} })).body.status).toBe(
      'cancelled',
    );
    backend.openGate();
    const res = await answer;
    expect(res.status, JSON.stringify(res.body)).toBe(409);
    expect(res.body.steps.map((s: { status: string }) => s.status)).toEqual(['completed', 'denied']);
    expect(backend.hitsOfRun(runId)).toHaveLength(1);
    expect((await recordsOf(T10, runId)).filter((r) => r.event_type === 'run.step.dispatching')).toHaveLength(1);
    // Nothing was reserved for the call not sent.
    expect((await reservationsOf(T10, runId)).map((r) => r.status)).toEqual(['settled']);
  });

  it('leaves a taken run id to the usual path, and a replay spends no rate token', async () => {
    // `limited` holds two tokens and refills one in 100 s.
    const runId = newRunId();
    const body = { run_id: runId, plan: [step('limited')] };
    const first = await execute(h.client, agent10, body);
    expect(first.status, JSON.stringify(first.body)).toBe(200);
    for (let i = 0; i < 3; i += 1) {
      const replay = await execute(h.client, agent10, body);
      expect(replay.status).toBe(200);
      expect(replay.headers['x-toolgate-replayed']).toBe('true');
      expect(replay.body).toEqual(first.body);
    }
    expect((await recordsOf(T10, runId)).map((r) => r.event_type)).toEqual([
      'run.step.dispatching',
      'run.step.completed',
    ]);
    // The second token is still there for a new run, and then the bucket is empty.
    expect((await execute(h.client, agent10, { run_id: newRunId(), plan: [step('limited')] })).status).toBe(200);
    const refused = await execute(h.client, agent10, { run_id: newRunId(), plan: [step('limited')] });
    expect(refused.status).toBe(429);
    // Another principal's run id is still a conflict.
    const other = tokens.agent('someone.else', { tenant: T10 });
    expect((await execute(h.client, other, body)).status).toBe(409);
  });

  it('is decided again on its claimed run when its budget moved meanwhile, and refused exactly', async () => {
    const T11 = 'tenant-runs-claim-intent-moved';
    const agent11 = tokens.agent(AGENT, { tenant: T11, family: 'veritas', scope: 'scf:read' });
    await grantTool(h.client, { tenant: T11, agent: AGENT, tool: 'echo' });
    const budget = await createBudget(h.client, { tenant: T11, limit_units: 10 });
    expect((await execute(h.client, agent11, { run_id: newRunId(), plan: [step('echo')] })).status).toBe(200);
    // Another replica spent the rest: this one's copy of the levels does not know.
    await sql`update budget_counters set spent_units = 9 where counter_key = ${budget.id}`.execute(
      h.db.database.control,
    );
    const runId = newRunId();
    const res = await execute(h.client, agent11, { run_id: runId, plan: [step('echo')] });
    expect(res.status, JSON.stringify(res.body)).toBe(402);
    expect(res.body.steps[0].error).toMatchObject({ code: 'budget_exceeded', details: { consumed_units: 9 } });
    // No intent was recorded, nothing reserved; the run was claimed and ended by its denial.
    expect((await recordsOf(T11, runId)).map((r) => r.event_type)).toEqual(['run.step.denied']);
    expect(await reservationsOf(T11, runId)).toEqual([]);
    const shown = await h.client.get(`/budgets/${budget.id}`, { token: tokens.tenantOperator(T11) });
    expect(shown.body).toMatchObject({ spent_units: 9, reserved_units: 0 });
  });

  it('is decided again on its claimed run when its grant was revoked behind the copy', async () => {
    const T12 = 'tenant-runs-claim-intent-revoked';
    const agent12 = tokens.agent(AGENT, { tenant: T12, family: 'veritas', scope: 'scf:read' });
    const granted = await grantTool(h.client, { tenant: T12, agent: AGENT, tool: 'echo' });
    await createBudget(h.client, { tenant: T12, limit_units: 10 });
    expect((await execute(h.client, agent12, { run_id: newRunId(), plan: [step('echo')] })).status).toBe(200);
    // Revoked without telling the replicas (its trigger announces every change): the copy still holds the grant.
    await h.db.database.control.transaction().execute(async (trx) => {
      await sql`alter table grants disable trigger grants_changed`.execute(trx);
      await sql`update grants set revoked_at = now(), revoked_by_actor_id = 'test' where id = ${granted.id}`.execute(
        trx,
      );
      await sql`alter table grants enable trigger grants_changed`.execute(trx);
    });
    const runId = newRunId();
    const res = await execute(h.client, agent12, { run_id: runId, plan: [step('echo')] });
    expect(res.status, JSON.stringify(res.body)).toBe(403);
    expect(res.body.steps[0].error.code).toBe('grant_revoked');
    expect((await recordsOf(T12, runId)).map((r) => r.event_type)).toEqual(['run.step.denied']);
    expect(await reservationsOf(T12, runId)).toEqual([]);
    expect(await grantUseCommits(T12, runId)).toEqual([]);
  });
});

describe('a first call refused before its run is claimed', () => {
  const T8 = 'tenant-runs-refused-first';
  const agent = tokens.agent(AGENT, { tenant: T8, family: 'veritas', scope: 'scf:read' });
  const records = async (runId: string) =>
    (
      await sql<{ event_type: string; reason_code: string | null; xid: string }>`
        select event_type, reason_code, xmin::text as xid from audit_events
        where tenant_id = ${T8} and run_id = ${runId} order by seq`.execute(h.db.database.control)
    ).rows;
  const runRow = async (runId: string) =>
    (
      await sql<{ status: string; http_status: number; busy: boolean; request: unknown; epoch: number; xid: string }>`
        select status, http_status, busy, request, epoch, xmin::text as xid from runs
        where tenant_id = ${T8} and run_id = ${runId}`.execute(h.db.database.control)
    ).rows[0];

  it('is one statement: the refusal’s record creates the run already ended, and a replay answers it', async () => {
    // The fewest statements any of eight calls took: other work of the gateway (the sequencer's rounds) only adds to a count.
    let fewest = Infinity;
    for (let i = 0; i < 8; i += 1) {
      const runId = newRunId();
      const before = h.db.database.statementsSent();
      const res = await execute(h.client, agent, { run_id: runId, plan: [step('ungranted'), step('echo')] });
      fewest = Math.min(fewest, h.db.database.statementsSent() - before);
      expect(res.status, JSON.stringify(res.body)).toBe(403);
      expect(res.body).toMatchObject({ run_id: runId, status: 'failed' });
      expect(res.body.steps.map((s: { status: string }) => s.status)).toEqual(['denied', 'skipped']);
      expect(res.body.steps[0].error.code).toBe('grant_missing');
      const [record] = await records(runId);
      expect(record).toMatchObject({ event_type: 'run.step.denied', reason_code: 'grant_missing' });
      expect(await runRow(runId)).toEqual({
        status: 'failed',
        http_status: 403,
        busy: false,
        request: null,
        epoch: 1,
        xid: record!.xid,
      });
      const replay = await execute(h.client, agent, { run_id: runId, plan: [step('ungranted'), step('echo')] });
      expect(replay.status).toBe(403);
      expect(replay.headers['x-toolgate-replayed']).toBe('true');
      expect(replay.body).toEqual(res.body);
      expect(await records(runId)).toHaveLength(1);
    }
    expect(fewest).toBe(1);
  });

  it('is decided again from the database when a grant for the call exists after all', async () => {
    // A revoked grant: the copy holds no live grant, but the database knows why there is none.
    const granted = await grantTool(h.client, { tenant: T8, agent: AGENT, tool: 'ungranted' });
    const revoked = await h.client.post(`/grants/${granted.id}/revoke`, {
      token: tokens.tenantOperator(T8),
      body: { reason: 'pulled' },
    });
    expect(revoked.status, JSON.stringify(revoked.body)).toBe(200);
    const snapshot = h.client.app.services.grantSnapshot;
    const subject = { tenantId: T8, agentId: AGENT, toolId: 'ungranted' };
    await until(
      'the copy of the grants to drop it',
      () => !snapshot.resolve(subject, { tenant_id: T8 }, new Date()).ok,
    );
    const runId = newRunId();
    const res = await execute(h.client, agent, { run_id: runId, plan: [step('ungranted')] });
    expect(res.status).toBe(403);
    expect(res.body.steps[0].error.code).toBe('grant_revoked');
    expect((await records(runId)).map((r) => r.reason_code)).toEqual(['grant_revoked']);
    expect(await runRow(runId)).toMatchObject({ status: 'failed', busy: false });
  });

  it('leaves a run id another principal holds to the usual answer, with no record of its own', async () => {
    const runId = newRunId();
    const other = tokens.agent('someone.else', { tenant: T8 });
    await execute(h.client, other, { run_id: runId, plan: [step('ungranted')] });
    const before = (await records(runId)).length;
    const res = await execute(h.client, agent, { run_id: runId, plan: [step('ungranted')] });
    expect(res.status).toBe(409);
    expect(res.body.error.code).toBe('run_id_conflict');
    const after = await records(runId);
    expect(after.slice(before).map((r) => r.event_type)).toEqual(['run.rejected']);
  });
});

describe('reported costs and the bound on units', () => {
  const T2 = 'tenant-runs-cap';
  const capAgent = tokens.agent(AGENT, { tenant: T2, family: 'veritas', scope: 'scf:read' });

  it('charges a reported cost above MAX_UNITS as MAX_UNITS, and audits what was reported', async () => {
    await registerTool(h.client, {
      id: 'overpriced',
      backendUrl: `${backend.url}/cost/5000000000`,
      allowed_agents: [AGENT],
      cost_units: 1,
    });
    await grantTool(h.client, { tenant: T2, agent: AGENT, tool: 'overpriced' });
    const budget = await createBudget(h.client, { tenant: T2, limit_units: 1_000_000_000, grace_units: 1 });
    const runId = newRunId();
    const res = await execute(h.client, capAgent, { run_id: runId, plan: [step('overpriced')] });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.steps[0]).toMatchObject({ status: 'completed', cost_units: 1_000_000_000 });
    const events = await h.client.get('/audit', { token: tokens.tenantOperator(T2), query: { run_id: runId } });
    const outcome = events.body.items.find((e: { event_type: string }) => e.event_type === 'run.step.completed');
    expect(outcome).toMatchObject({
      cost_units: 1_000_000_000,
      details: { reported_cost_units: 5_000_000_000, reported_cost_capped: true },
    });
    const shown = await h.client.get(`/budgets/${budget.id}`, { token: tokens.tenantOperator(T2) });
    expect(shown.body).toMatchObject({ spent_units: 1_000_000_000, reserved_units: 0 });
  });

  it("charges a reported cost at most the grant's max_cost_units, and audits what was reported", async () => {
    const T3 = 'tenant-runs-grant-cap';
    await registerTool(h.client, {
      id: 'reports.ten',
      backendUrl: `${backend.url}/cost/10`,
      allowed_agents: [AGENT],
      cost_units: 1,
    });
    await grantTool(h.client, {
      tenant: T3,
      agent: AGENT,
      tool: 'reports.ten',
      capability_modifiers: { max_cost_units: 4 },
    });
    const budget = await createBudget(h.client, { tenant: T3, limit_units: 100 });
    const runId = newRunId();
    const res = await execute(h.client, tokens.agent(AGENT, { tenant: T3 }), {
      run_id: runId,
      plan: [step('reports.ten')],
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.steps[0]).toMatchObject({ status: 'completed', cost_units: 4 });
    const events = await h.client.get('/audit', { token: tokens.tenantOperator(T3), query: { run_id: runId } });
    const outcome = events.body.items.find((e: { event_type: string }) => e.event_type === 'run.step.completed');
    expect(outcome).toMatchObject({
      cost_units: 4,
      details: { reported_cost_units: 10, reported_cost_capped: true, charged_at_most: 4 },
    });
    const shown = await h.client.get(`/budgets/${budget.id}`, { token: tokens.tenantOperator(T3) });
    expect(shown.body).toMatchObject({ spent_units: 4, reserved_units: 0 });
  });

  it('charges a call that outlived its reservation when it settles, and says so in audit', async () => {
    const T4 = 'tenant-runs-outlived';
    await registerTool(h.client, {
      id: 'slow.costly',
      backendUrl: `${backend.url}/gate/cost/3`,
      allowed_agents: [AGENT],
      cost_units: 2,
    });
    await grantTool(h.client, { tenant: T4, agent: AGENT, tool: 'slow.costly' });
    const budget = await createBudget(h.client, { tenant: T4, limit_units: 100 });
    const shown = async () => (await h.client.get(`/budgets/${budget.id}`, { token: tokens.tenantOperator(T4) })).body;
    const runId = newRunId();
    const running = execute(h.client, tokens.agent(AGENT, { tenant: T4 }), {
      run_id: runId,
      plan: [step('slow.costly')],
    });
    await backend.waitForHits('/gate/cost/3', 1);
    // As if the call had been in flight past the reservation's TTL: the sweep gives its units back.
    await sql`update budget_reservations set expires_at = now() - interval '1 second' where tenant_id = ${T4} and run_id = ${runId}`.execute(
      h.db.database.control,
    );
    expect(await h.client.app.services.budgets.releaseExpired()).toBe(1);
    expect(await shown()).toMatchObject({ spent_units: 0, reserved_units: 0 });
    backend.openGate();
    const res = await running;
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.steps[0]).toMatchObject({ status: 'completed', cost_units: 3 });
    expect(await shown()).toMatchObject({ spent_units: 3, reserved_units: 0 });
    const events = (await h.client.get('/audit', { token: tokens.tenantOperator(T4), query: { run_id: runId } })).body
      .items as Array<Record<string, any>>;
    const expired = events.find((e) => e.event_type === 'budget.reservation_expired');
    expect(expired).toMatchObject({ actor: 'system.expiry', status: 'expired', details: { released_units: 2 } });
    const late = events.find((e) => e.event_type === 'budget.reservation_settled_late');
    expect(late).toMatchObject({
      actor: `agent:${AGENT}`,
      status: 'settled',
      cost_units: 3,
      tool_id: 'slow.costly',
      details: { reservation_id: expired!.details.reservation_id, reserved_units: 2, charged_units: 3 },
    });
  });

  describe('a call whose settlement was lost with its replica (its outcome recorded, its reservation left open)', () => {
    const T5 = 'tenant-runs-lost-settlement';
    let budgetId: string;
    const shown = async () => (await h.client.get(`/budgets/${budgetId}`, { token: tokens.tenantOperator(T5) })).body;

    beforeAll(async () => {
      await registerTool(h.client, {
        id: 'costs.three',
        backendUrl: `${backend.url}/cost/3`,
        allowed_agents: [AGENT],
        cost_units: 2,
      });
      await grantTool(h.client, { tenant: T5, agent: AGENT, tool: 'costs.three' });
      budgetId = (await createBudget(h.client, { tenant: T5, limit_units: 100 })).id;
    });

    /** Runs a call, then puts its reservation and counters back as they stood before its settlement committed. */
    async function callLosingItsSettlement(): Promise<{ runId: string; outcomeId: string }> {
      const before = await shown();
      const runId = newRunId('lost');
      const res = await execute(h.client, tokens.agent(AGENT, { tenant: T5 }), {
        run_id: runId,
        plan: [step('costs.three')],
      });
      expect(res.status, JSON.stringify(res.body)).toBe(200);
      const db = h.db.database.control;
      await sql`
        update budget_counters c set spent_units = c.spent_units - r.actual_units, reserved_units = c.reserved_units + r.units
        from budget_reservations r cross join lateral jsonb_array_elements(r.charges) ch
        where r.tenant_id = ${T5} and r.run_id = ${runId}
          and c.counter_key = ch->>'counter_key' and c.period_start = (ch->>'period_start')::timestamptz`.execute(db);
      await sql`
        update budget_reservations set status = 'reserved', actual_units = null, closed_at = null, expires_at = now() - interval '1 second'
        where tenant_id = ${T5} and run_id = ${runId}`.execute(db);
      expect(await shown()).toMatchObject({ spent_units: before.spent_units, reserved_units: 2 });
      return { runId, outcomeId: res.body.steps[0].audit_id };
    }

    it('is charged what its outcome record says when the sweep finds its reservation, not given back', async () => {
      const before = (await shown()).spent_units as number;
      const { runId, outcomeId } = await callLosingItsSettlement();
      const outcome = (
        await h.client.get('/audit', {
          token: tokens.tenantOperator(T5),
          query: { run_id: runId, event_type: 'run.step.completed' },
        })
      ).body.items[0];
      expect(outcome).toMatchObject({ cost_units: 3, details: { reservation_id: expect.any(String) } });
      expect(await h.client.app.services.budgets.releaseExpired()).toBe(1);
      expect(await shown()).toMatchObject({ spent_units: before + 3, reserved_units: 0 });
      const events = (await h.client.get('/audit', { token: tokens.tenantOperator(T5), query: { run_id: runId } })).body
        .items as Array<Record<string, any>>;
      expect(events.find((e) => e.event_type === 'budget.reservation_expired')).toBeUndefined();
      expect(events.find((e) => e.event_type === 'budget.reservation_settled_late')).toMatchObject({
        actor: 'system.expiry',
        status: 'settled',
        cost_units: 3,
        details: {
          reservation_id: outcome.details.reservation_id,
          reserved_units: 2,
          charged_units: 3,
          reason: 'settlement_lost',
          outcome_event_id: outcomeId,
        },
      });
    });

    it('is charged what its outcome record says when recovery closes its run’s reservations', async () => {
      const before = (await shown()).spent_units as number;
      const { runId } = await callLosingItsSettlement();
      // No call of the run is in doubt, so recovery would give its open reservations back.
      const closed = await h.db.database.control
        .transaction()
        .execute((trx) => closeLostRunReservations(trx, T5, runId, 'release', new Date()));
      expect(closed).toBe(1);
      expect(await shown()).toMatchObject({ spent_units: before + 3, reserved_units: 0 });
    });
  });

  it('refuses amounts above MAX_UNITS with 400 instead of failing to store them', async () => {
    const run = await execute(h.client, agent, { run_id: newRunId(), plan: [step('echo')], budget_units: 1e10 });
    expect(run.status).toBe(400);
    expect(run.body.error.code).toBe('invalid_request');
    const budget = await h.client.post('/budgets', {
      token: operator,
      body: { scope: 'tenant', period: 'day', limit_units: 2e9, warn_ratio: 0.8, grace_units: 0 },
    });
    expect(budget.status).toBe(400);
    const grace = await h.client.post('/budgets', {
      token: operator,
      body: { scope: 'tenant', period: 'day', limit_units: 10, warn_ratio: 0.8, grace_units: 2e9 },
    });
    expect(grace.status).toBe(400);
  });
});

describe('POST /runs/execute: each denial stops the run with its status, later steps skipped', () => {
  const cases: Array<[string, () => Record<string, unknown>[], number, string, string]> = [
    ['an unregistered tool', () => [step('nope')], 404, 'tool_not_registered', 'failed'],
    ['a version range nothing matches', () => [step('echo', 'x', '^9')], 404, 'tool_version_not_found', 'failed'],
    ['a final_write tool', () => [step('final.publish')], 403, 'tool_category_blocked', 'failed'],
    [
      'an external_call tool in a tenant without it',
      () => [{ tool_id: 'web.fetch', input: { url: 'https://example.com/' } }],
      403,
      'tool_category_blocked',
      'failed',
    ],
    ['a tool whose allowlist omits the agent', () => [step('not.allowed')], 403, 'unauthorized_tool_access', 'failed'],
    ['a tool without a grant', () => [step('ungranted')], 403, 'grant_missing', 'failed'],
    ['a scope the token lacks', () => [step('scoped')], 403, 'tool_scope_missing', 'failed'],
    ['missing required context', () => [step('contextual')], 400, 'missing_required_context', 'failed'],
    [
      'input failing the schema',
      () => [{ tool_id: 'echo', input: { q: 42 } }],
      422,
      'tool_input_schema_invalid',
      'failed',
    ],
    ['a cost beyond the budget', () => [step('expensive')], 402, 'budget_exceeded', 'killed'],
    ['a tool with no backend', () => [step('no.backend')], 503, 'tool_backend_not_configured', 'failed'],
    ['a backend that hangs', () => [step('hangs')], 504, 'tool_backend_timeout', 'failed'],
    ['a backend answering 500', () => [step('fails')], 502, 'tool_backend_failed', 'failed'],
    ['a backend answering HTML', () => [step('html')], 502, 'tool_backend_failed', 'failed'],
    ['a backend answering 10 MB', () => [step('huge')], 502, 'tool_backend_failed', 'failed'],
    ['output failing its schema', () => [step('wrong.shape')], 502, 'tool_output_schema_invalid', 'failed'],
  ];

  it.each(cases)('%s', async (_name, plan, status, code, runStatus) => {
    const runId = newRunId();
    const res = await execute(h.client, agent, {
      run_id: runId,
      plan: [step('echo', 'first', '1.0.0'), ...plan(), step('echo', 'never', '1.0.0')],
    });
    expect(res.status).toBe(status);
    expect(res.body.status).toBe(runStatus);
    expect(res.body.steps.map((s: { status: string }) => s.status)).toEqual([
      'completed',
      expect.stringMatching(/^(denied|failed)$/),
      'skipped',
    ]);
    expect(res.body.steps[1].error.code).toBe(code);
    expect(res.body.steps[1].output).toBeUndefined();
    const events = await h.client.get('/audit', { token: operator, query: { run_id: runId } });
    const last = events.body.items[0];
    expect(last).toMatchObject({ reason_code: code, run_id: runId });
    expect(backend.hitsOfRun(runId).filter((hit) => (hit.body as { q?: string })?.q === 'never')).toEqual([]);
  });

  it('throttles (429, exact Retry-After) without killing the run, and continues it when resubmitted', async () => {
    const first = await execute(h.client, agent, { run_id: newRunId(), plan: [step('limited'), step('limited')] });
    expect(first.status).toBe(200);
    const runId = newRunId();
    const throttled = await execute(h.client, agent, {
      run_id: runId,
      plan: [step('echo', 'a', '1.0.0'), step('limited')],
    });
    expect(throttled.status).toBe(429);
    expect(throttled.body.status).toBe('throttled');
    // One token at 0.01/s takes up to 100 s to refill.
    const retryAfter = Number(throttled.headers['retry-after']);
    expect(retryAfter).toBeGreaterThanOrEqual(99);
    expect(retryAfter).toBeLessThanOrEqual(100);
    expect(throttled.body.retry_after_seconds).toBe(retryAfter);
    const again = await execute(h.client, agent, {
      run_id: runId,
      plan: [step('echo', 'a', '1.0.0'), step('limited')],
    });
    // Not a replay: the rate stage decided again, and the bucket is still empty.
    expect(again.status).toBe(429);
    expect(again.headers['x-toolgate-replayed']).toBeUndefined();
    expect(again.body.steps.map((s: { status: string }) => s.status)).toEqual(['completed', 'denied']);
    // The completed first step is not dispatched again.
    expect(backend.hitsOfRun(runId)).toHaveLength(1);
  });

  it('tells why a throttled run was ended meanwhile, not that it was throttled', async () => {
    const runId = newRunId();
    const plan = [step('echo', 'b', '1.0.0'), step('limited')];
    expect((await execute(h.client, agent, { run_id: runId, plan })).status).toBe(429);
    const cancelled = await h.client.post(`/runs/${runId}/cancel`, {
      token: operator,
      body: { reason: 'no longer needed' },
    });
    expect(cancelled.body.status).toBe('cancelled');
    const again = await execute(h.client, agent, { run_id: runId, plan });
    expect(again.status).toBe(409);
    expect(again.body.status).toBe('cancelled');
    expect(
      again.body.steps.map((s: { status: string; error?: { code: string } }) => [s.status, s.error?.code]),
    ).toEqual([
      ['completed', undefined],
      ['denied', 'run_not_resumable'],
    ]);
    expect(again.body.steps[1].error.details).toMatchObject({ control: 'cancelled', reason: 'no longer needed' });
  });

  it('finishes a throttled run when its owner resubmits it after Retry-After, without running its completed steps again', async () => {
    // On a replica whose clock the test moves: Retry-After goes by without being waited out.
    const clock = new ManualClock(new Date());
    const replica = await startClient(h.db.database, clock);
    try {
      const runId = newRunId();
      const plan = [step('refilling', 'one'), step('refilling', 'two')];
      const throttled = await execute(replica, agent, { run_id: runId, plan });
      expect(throttled.status).toBe(429);
      expect(throttled.body.steps.map((s: { status: string }) => s.status)).toEqual(['completed', 'denied']);
      // One token at 2/s: half a second, in whole seconds.
      expect(throttled.headers['retry-after']).toBe('1');
      clock.advance(Number(throttled.headers['retry-after']) * 1000);
      const finished = await execute(replica, agent, { run_id: runId, plan });
      expect(finished.status).toBe(200);
      expect(finished.body.status).toBe('completed');
      expect(finished.body.steps.map((s: { status: string; output?: unknown }) => [s.status, s.output])).toEqual([
        ['completed', { echo: { q: 'one' } }],
        ['completed', { echo: { q: 'two' } }],
      ]);
      const hits = backend.hitsOfRun(runId);
      expect(hits.map((hit) => hit.body)).toEqual([{ q: 'one' }, { q: 'two' }]);
      // Finished now: a further resubmission replays it.
      const replayed = await execute(replica, agent, { run_id: runId, plan });
      expect(replayed.headers['x-toolgate-replayed']).toBe('true');
      expect(replayed.body).toEqual(finished.body);
    } finally {
      await replica.close();
    }
  });

  it('refuses a plan longer than MAX_PLAN_STEPS instead of truncating it', async () => {
    const res = await execute(h.client, agent, {
      run_id: newRunId(),
      plan: Array.from({ length: 33 }, () => step('echo')),
    });
    expect(res.status).toBe(400);
    expect(res.body.error).toMatchObject({ code: 'invalid_request', message: expect.stringContaining('at most 32') });
  });

  it('refuses a context naming another tenant', async () => {
    const res = await execute(h.client, agent, {
      run_id: newRunId(),
      context: { tenant_id: 'someone-else' },
      plan: [step('echo')],
    });
    expect(res.status).toBe(400);
    expect(res.body.steps[0].error.code).toBe('invalid_request');
  });

  it('keeps operators off the agent route', async () => {
    const res = await h.client.post('/runs/execute', {
      token: operator,
      body: { run_id: newRunId(), plan: [step('echo')] },
    });
    expect(res.status).toBe(403);
  });
});

describe('dry runs', () => {
  it('returns every step’s verdicts and dispatches, reserves and audits no call', async () => {
    const before = backend.hits.length;
    const runId = newRunId();
    const res = await execute(h.client, agent, {
      run_id: runId,
      dry_run: true,
      plan: [step('echo'), step('ungranted'), step('limited')],
    });
    expect(res.status).toBe(200);
    expect(res.body.dry_run).toBe(true);
    expect(res.body.steps.map((s: { status: string }) => s.status)).toEqual([
      'admissible',
      'denied',
      expect.any(String),
    ]);
    expect(res.body.steps[0].verdicts.map((v: { stage: string }) => v.stage)).toEqual([
      'registry',
      'category',
      'allowlist',
      'grant',
      'scopes',
      'context',
      'input',
      'approval',
      'safety',
      'cost',
      'rate',
    ]);
    expect(res.body.steps[1].verdicts.at(-1)).toEqual({ stage: 'grant', ok: false, code: 'grant_missing' });
    expect(backend.hits.length).toBe(before);
    expect((await h.client.get(`/runs/${runId}`, { token: agent })).status).toBe(404);
  });

  it('fails closed with 503 gateway_unavailable, not a denied step, on a replica whose kill-switch snapshot is stale, as an execution does', async () => {
    // A second replica on the same database, whose snapshot stops being confirmed.
    const stale = await AppClient.start(h.db.database, {
      TOOLGATE_KILL_SWITCH_POLL_MS: '100',
      TOOLGATE_KILL_SWITCH_MAX_STALENESS_MS: '500',
    });
    try {
      const dry = () =>
        stale.post('/runs/execute', {
          token: agent,
          body: { run_id: newRunId(), context: {}, dry_run: true, plan: [step('echo')] },
        });
      expect((await dry()).body.steps[0].status).toBe('admissible');
      await stale.app.services.killSwitches.stop();
      await until('the snapshot to go stale', () => !stale.app.services.killSwitches.readiness().ok, {
        intervalMs: 50,
      });
      const res = await dry();
      expect(res.status).toBe(503);
      expect(res.body.error.code).toBe('gateway_unavailable');
      // An execution on it fails closed too, dispatching nothing; its refused step is on record.
      const hits = backend.hits.length;
      const executed = await stale.post('/runs/execute', {
        token: agent,
        body: { run_id: newRunId(), context: {}, plan: [step('echo')] },
      });
      expect(executed.status).toBe(503);
      expect(executed.body.status).toBe('failed');
      expect(executed.body.steps[0]).toMatchObject({ status: 'denied', error: { code: 'gateway_unavailable' } });
      expect(backend.hits.length).toBe(hits);
    } finally {
      await stale.close();
    }
  });
});

describe('run ownership and replay', () => {
  it('replays a finished run’s envelope without calling the backend again', async () => {
    const runId = newRunId();
    const body = { run_id: runId, plan: [step('echo', 'once', '1.0.0')] };
    const first = await execute(h.client, agent, body);
    const hitsAfterFirst = backend.hits.length;
    const second = await execute(h.client, agent, body);
    expect(second.status).toBe(first.status);
    expect(second.body).toEqual(first.body);
    expect(second.headers['x-toolgate-replayed']).toBe('true');
    expect(backend.hits.length).toBe(hitsAfterFirst);
  });

  it('gives another agent’s run id 409 run_id_conflict', async () => {
    const runId = newRunId();
    await execute(h.client, agent, { run_id: runId, plan: [step('echo', 'mine', '1.0.0')] });
    const thief = tokens.agent('other.agent', { tenant: T });
    const res = await execute(h.client, thief, { run_id: runId, plan: [step('echo', 'mine', '1.0.0')] });
    expect(res.status).toBe(409);
    expect(res.body.error.code).toBe('run_id_conflict');
    // The refusal is on record, under the run id asked for and the agent that asked.
    const refused = await h.client.get('/audit', {
      token: operator,
      query: { run_id: runId, agent_id: 'other.agent' },
    });
    expect(refused.body.items).toEqual([
      expect.objectContaining({
        event_type: 'run.rejected',
        actor: 'agent:other.agent',
        status: 'denied',
        reason_code: 'run_id_conflict',
      }),
    ]);
  });

  it('gives the owner 409 for a different request under a used run id, on record; a replay is not', async () => {
    const runId = newRunId();
    const body = { run_id: runId, plan: [step('echo', 'a', '1.0.0')] };
    await execute(h.client, agent, body);
    expect((await execute(h.client, agent, body)).headers['x-toolgate-replayed']).toBe('true');
    const res = await execute(h.client, agent, { run_id: runId, plan: [step('echo', 'b', '1.0.0')] });
    expect(res.status).toBe(409);
    expect(res.body.error).toMatchObject({ code: 'run_id_conflict', details: { status: 'completed' } });
    const refused = await h.client.get('/audit', {
      token: operator,
      query: { run_id: runId, event_type: 'run.rejected' },
    });
    expect(refused.body.items).toEqual([
      expect.objectContaining({
        actor: `agent:${AGENT}`,
        agent_id: AGENT,
        status: 'denied',
        reason_code: 'run_id_conflict',
        details: { status: 'completed', message: res.body.error.message },
      }),
    ]);
  });

  it('gives the owner 409 for its run while it executes, on record', async () => {
    await registerTool(h.client, { id: 'slow.echo', backendUrl: `${backend.url}/gate`, allowed_agents: [AGENT] });
    await grantTool(h.client, { tenant: T, agent: AGENT, tool: 'slow.echo' });
    const runId = newRunId();
    const body = { run_id: runId, plan: [step('slow.echo')] };
    const gated = backend.hitsOn('/gate').length;
    const running = execute(h.client, agent, body);
    await backend.waitForHits('/gate', gated + 1);
    const busy = await execute(h.client, agent, body);
    expect(busy.status).toBe(409);
    expect(busy.body.error).toMatchObject({ code: 'run_id_conflict', details: { status: 'running' } });
    backend.openGate();
    expect((await running).status).toBe(200);
    const refused = await h.client.get('/audit', {
      token: operator,
      query: { run_id: runId, event_type: 'run.rejected' },
    });
    expect(refused.body.items).toEqual([
      expect.objectContaining({
        actor: `agent:${AGENT}`,
        status: 'denied',
        reason_code: 'run_id_conflict',
        details: { status: 'running', message: busy.body.error.message },
      }),
    ]);
  });

  it('lets the owner and its tenant’s operators read the run, and no one else', async () => {
    const runId = newRunId();
    await execute(h.client, agent, { run_id: runId, plan: [step('echo', 'read me', '1.0.0')] });
    const own = await h.client.get(`/runs/${runId}`, { token: agent });
    expect(own.body).toMatchObject({ run_id: runId, agent_id: AGENT, tenant_id: T, status: 'completed' });
    expect((await h.client.get(`/runs/${runId}`, { token: operator })).status).toBe(200);
    expect((await h.client.get(`/runs/${runId}`, { token: tokens.agent('other.agent', { tenant: T }) })).status).toBe(
      404,
    );
    expect((await h.client.get(`/runs/${runId}`, { token: tokens.tenantOperator('another-tenant') })).status).toBe(404);
    // Naming the run's tenant does not widen another tenant's operator, and the attempt is recorded.
    const reach = await h.client.get(`/runs/${runId}`, {
      token: tokens.tenantOperator('another-tenant', 'mallory.runs'),
      query: { tenant_id: T },
    });
    expect(reach.status).toBe(404);
    const attempts = await h.client.get('/audit', {
      token: tokens.platform(),
      query: { event_type: 'security.cross_tenant_attempt', tenant_id: 'another-tenant' },
    });
    expect(attempts.body.items[0]).toMatchObject({
      actor: 'operator:mallory.runs',
      details: { requested_tenant_id: T, run_id: runId },
    });
    // An agent's attempt names the agent, so that the audit's agent filter finds it.
    expect(
      (
        await h.client.get(`/runs/${runId}`, {
          token: tokens.agent('roaming.agent', { tenant: 'another-tenant' }),
          query: { tenant_id: T },
        })
      ).status,
    ).toBe(404);
    const byAgent = await h.client.get('/audit', {
      token: tokens.platform(),
      query: { event_type: 'security.cross_tenant_attempt', agent_id: 'roaming.agent' },
    });
    expect(byAgent.body.items).toHaveLength(1);
    const list = await h.client.get('/runs', { token: operator, query: { agent_id: AGENT, limit: 2 } });
    expect(list.body.items).toHaveLength(2);
    expect(list.body.next_cursor).toEqual(expect.any(String));
    const next = await h.client.get('/runs', {
      token: operator,
      query: { agent_id: AGENT, limit: 2, cursor: list.body.next_cursor },
    });
    expect(next.body.items[0].run_id).not.toBe(list.body.items[1].run_id);
  });
});
