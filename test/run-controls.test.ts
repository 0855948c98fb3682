import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../src/db/database.js';
import { TestBackend } from './helpers/backend.js';
import { hasPostgresServer, openPool } from './helpers/database.js';
import { AppClient, startHarness, type Harness } from './helpers/harness.js';
import { ManualClock, startClient } from './helpers/manual-clock.js';
import { execute, step } from './helpers/runs.js';
import { tokens } from './helpers/tokens.js';
import { egressSchemas, grantTool, newRunId, registerTool } from './helpers/world.js';
import { until } from './helpers/waits.js';

// SPEC §6 run controls, and the cascades of SPEC §3–§4 that stop runs when authority is pulled.
const T = 'tenant-controls';
const OTHER_T = 'tenant-controls-b';
const OWNER = 'control.owner';
const [A, B, C] = ['cascade.root', 'cascade.middle', 'cascade.leaf'];
const operator = tokens.tenantOperator(T);
const as = (agentId: string, tenant = T) => tokens.agent(agentId, { tenant });

let h: Harness;
let backend: TestBackend;

const hitsOf = (runId: string) => backend.hitsOfRun(runId).map((hit) => (hit.body as { q: string }).q);
const statusOf = async (client: AppClient, runId: string, tenant = T) =>
  (await client.get(`/runs/${runId}`, { token: tokens.platform(), query: { tenant_id: tenant } })).body
    .status as string;
const audit = async (query: Record<string, string>) =>
  (await h.client.get('/audit', { token: tokens.platform(), query: { limit: 200, ...query } })).body.items as Array<
    Record<string, any>
  >;

beforeAll(async () => {
  h = await startHarness({ TOOLGATE_GRANT_EXPIRY_SWEEP_MS: '100' });
  backend = await new TestBackend().start();
  const everyone = { allowed_agents: [OWNER, A, B, C, 'expiring.agent', 'feeds.agent'] };
  await registerTool(h.client, { id: 'search', backendUrl: `${backend.url}/echo`, ...everyone });
  await registerTool(h.client, { id: 'held', backendUrl: `${backend.url}/gate`, ...everyone });
  await registerTool(h.client, {
    id: 'trickle',
    backendUrl: `${backend.url}/echo`,
    rate_limit: { capacity: 1, refill_per_second: 0.001 },
    ...everyone,
  });
  await registerTool(h.client, {
    id: 'feeds.publish',
    category: 'draft_write',
    backendUrl: `${backend.url}/echo`,
    requires_approval: true,
    ...everyone,
  });
  for (const agentId of [OWNER, A, B, C])
    for (const tool of ['search', 'held', 'trickle']) await grantTool(h.client, { tenant: T, agent: agentId, tool });
});

afterAll(async () => {
  await backend?.close();
  await h?.close();
});

describe('run controls', () => {
  it('cancel: by the owning agent or an operator; an ended run refuses with 409 run_not_resumable', async () => {
    const mine = newRunId();
    await execute(h.client, as(OWNER), { run_id: mine, keep_open: true, plan: [step('search', 'a')] });
    expect((await h.client.post(`/runs/${mine}/cancel`, { token: as(A), body: {} })).status).toBe(404);
    expect(
      (await h.client.post(`/runs/${mine}/cancel`, { token: tokens.tenantOperator(OTHER_T), body: {} })).status,
    ).toBe(404);
    const cancelled = await h.client.post(`/runs/${mine}/cancel`, {
      token: as(OWNER),
      body: { reason: 'changed my mind' },
    });
    expect(cancelled.status).toBe(200);
    expect(cancelled.body.status).toBe('cancelled');
    const again = await h.client.post(`/runs/${mine}/cancel`, { token: operator, body: {} });
    expect(again.status).toBe(409);
    expect(again.body.error.code).toBe('run_not_resumable');
    for (const control of ['kill', 'pause', 'resume']) {
      expect((await h.client.post(`/runs/${mine}/${control}`, { token: operator, body: {} })).body.error.code).toBe(
        'run_not_resumable',
      );
    }
    const [event] = await audit({ run_id: mine, event_type: 'run.cancelled' });
    expect(event).toMatchObject({
      actor: `agent:${OWNER}`,
      status: 'cancelled',
      details: { reason: 'changed my mind', previous_status: 'running', cascade_depth: 0 },
    });

    const theirs = newRunId();
    await execute(h.client, as(OWNER), { run_id: theirs, keep_open: true, plan: [step('search', 'b')] });
    expect((await h.client.post(`/runs/${theirs}/cancel`, { token: operator, body: {} })).body.status).toBe(
      'cancelled',
    );
  });

  it('kill and pause are operators’: an agent gets 403 agent_forbidden', async () => {
    const runId = newRunId();
    await execute(h.client, as(OWNER), { run_id: runId, keep_open: true, plan: [step('search', 'c')] });
    for (const control of ['kill', 'pause']) {
      const res = await h.client.post(`/runs/${runId}/${control}`, { token: as(OWNER), body: {} });
      expect(res.status).toBe(403);
      expect(res.body.error.code).toBe('agent_forbidden');
    }
    const killed = await h.client.post(`/runs/${runId}/kill`, { token: operator, body: { reason: 'runaway' } });
    expect(killed.body.status).toBe('killed');
    expect((await audit({ run_id: runId, event_type: 'run.killed' }))[0]).toMatchObject({
      actor: `operator:ops.${T}`,
      status: 'killed',
    });
  });

  it('a cancel reaches an executing run at its next call: the rest is never dispatched', async () => {
    const runId = newRunId();
    const gate = backend.hitsOn('/gate').length;
    const answer = execute(h.client, as(OWNER), {
      run_id: runId,
      plan: [step('held', 'in flight'), step('search', 'never'), step('search', 'never either')],
    });
    await backend.waitForHits('/gate', gate + 1);
    expect((await h.client.post(`/runs/${runId}/cancel`, { token: operator, body: {} })).body.status).toBe('cancelled');
    backend.openGate();
    const res = await answer;
    expect(res.status).toBe(409);
    expect(res.body.status).toBe('cancelled');
    expect(res.body.steps.map((s: { status: string }) => s.status)).toEqual(['completed', 'denied', 'skipped']);
    expect(res.body.steps[1].error.code).toBe('run_not_resumable');
    expect(hitsOf(runId)).toEqual(['in flight']);
    expect(
      (await h.client.get(`/runs/${runId}`, { token: as(OWNER) })).body.steps.map((s: { status: string }) => s.status),
    ).toEqual(['completed', 'denied', 'skipped']);
  });

  it('resume continues a throttled run after its completed steps, every stage again', async () => {
    const runId = newRunId();
    const throttled = await execute(h.client, as(OWNER), {
      run_id: runId,
      plan: [step('trickle', 'first'), step('trickle', 'second')],
    });
    expect(throttled.status).toBe(429);
    expect(throttled.body.status).toBe('throttled');
    const again = await h.client.post(`/runs/${runId}/resume`, { token: as(OWNER), body: {} });
    expect(again.status).toBe(429);
    expect(again.body.steps.map((s: { status: string }) => s.status)).toEqual(['completed', 'denied']);
    expect(Number(again.headers['retry-after'])).toBeGreaterThan(1);
    expect(hitsOf(runId)).toEqual(['first']);
  });

  it('pause holds a run where it is; an operator’s resume takes it on; resuming twice is refused', async () => {
    const runId = newRunId();
    await execute(h.client, as(OWNER), { run_id: runId, keep_open: true, plan: [step('search', 'd')] });
    const paused = await h.client.post(`/runs/${runId}/pause`, { token: operator, body: {} });
    expect(paused.body.status).toBe('paused');
    expect((await h.client.post(`/runs/${runId}/pause`, { token: operator, body: {} })).body.status).toBe('paused');
    const resumed = await h.client.post(`/runs/${runId}/resume`, { token: operator, body: {} });
    expect(resumed.status).toBe(200);
    expect(resumed.body.status).toBe('running');
    const twice = await h.client.post(`/runs/${runId}/resume`, { token: operator, body: {} });
    expect(twice.status).toBe(409);
    expect(twice.body.error.code).toBe('run_not_resumable');
    const types = (await audit({ run_id: runId })).map((e) => e.event_type).reverse();
    expect(types.slice(-3)).toEqual(['run.paused', 'run.resumed', 'run.control_rejected']);
  });

  it('a control refused for the run’s state is on record as run.control_rejected, under the run and whoever asked', async () => {
    const runId = newRunId();
    await execute(h.client, as(OWNER), { run_id: runId, keep_open: true, plan: [step('search', 'e')] });
    const refused: Array<{
      control: string;
      actor: string;
      error: { code: string; message: string; details: Record<string, unknown> };
    }> = [];
    // One platform token, compared by value below: a token signed a second later differs (its iat).
    const platform = tokens.platform();
    const control = async (name: string, token: string, actor: string, body: Record<string, unknown> = {}) => {
      const res = await h.client.post(`/runs/${runId}/${name}`, {
        token,
        body,
        query: token === platform ? { tenant_id: T } : {},
      });
      if (res.status >= 400) refused.push({ control: name, actor, error: res.body.error });
      return res;
    };
    const opActor = `operator:ops.${T}`;

    // A run at rest, still running: nothing to resume. Paused: not an open run at rest to complete.
    expect((await control('resume', operator, opActor)).status).toBe(409);
    expect((await control('pause', operator, opActor, { reason: 'look first' })).body.status).toBe('paused');
    expect((await control('complete', as(OWNER), `agent:${OWNER}`)).status).toBe(409);
    expect((await control('kill', platform, 'operator:ops.platform', { reason: 'enough' })).body.status).toBe('killed');
    // Ended: every control is refused, for an operator of the tenant, the platform's or the owner.
    for (const [name, token, actor] of [
      ['cancel', as(OWNER), `agent:${OWNER}`],
      ['kill', operator, opActor],
      ['pause', platform, 'operator:ops.platform'],
      ['resume', as(OWNER), `agent:${OWNER}`],
      ['complete', as(OWNER), `agent:${OWNER}`],
    ] as const) {
      const res = await control(name, token, actor);
      expect(res.status).toBe(409);
      expect(res.body.error).toMatchObject({ code: 'run_not_resumable', details: { status: 'killed' } });
    }
    // A run the caller may not see stays a run that does not exist: its 404 records nothing under it.
    expect((await h.client.post(`/runs/${runId}/cancel`, { token: as(A), body: {} })).status).toBe(404);
    expect(
      (await h.client.post(`/runs/${runId}/cancel`, { token: tokens.tenantOperator(OTHER_T), body: {} })).status,
    ).toBe(404);

    expect(refused.map((r) => r.control)).toEqual([
      'resume',
      'complete',
      'cancel',
      'kill',
      'pause',
      'resume',
      'complete',
    ]);
    const events = (await audit({ run_id: runId, event_type: 'run.control_rejected' })).reverse();
    expect(events).toEqual(
      refused.map(({ control, actor, error }) =>
        expect.objectContaining({
          tenant_id: T,
          agent_id: OWNER,
          run_id: runId,
          actor,
          status: 'denied',
          reason_code: error.code,
          details: {
            ...error.details,
            message: error.message,
            control,
            run_depth: 0,
            attribution: [{ run_id: runId, agent_id: OWNER }],
          },
        }),
      ),
    );
    expect(events.slice(0, 2).map((e) => e.details.status)).toEqual(['running', 'paused']);
    // The controls that succeeded recorded what they did, and no rejection.
    const types = (await audit({ run_id: runId })).map((e) => e.event_type).reverse();
    expect(types.slice(-9)).toEqual([
      'run.control_rejected',
      'run.paused',
      'run.control_rejected',
      'run.killed',
      ...Array(5).fill('run.control_rejected'),
    ]);
  });

  it('a successful control records its transition and no rejection', async () => {
    const runId = newRunId();
    await execute(h.client, as(OWNER), { run_id: runId, keep_open: true, plan: [step('search', 'f')] });
    expect((await h.client.post(`/runs/${runId}/complete`, { token: as(OWNER), body: {} })).body.status).toBe(
      'completed',
    );
    const types = (await audit({ run_id: runId })).map((e) => e.event_type);
    expect(types[0]).toBe('run.completed');
    expect(types).not.toContain('run.control_rejected');
  });

  it('a refusal that cannot be recorded is 503 gateway_unavailable, not the refusal', async () => {
    const db = h.db.database.control;
    const runId = newRunId('unrecorded');
    await execute(h.client, as(OWNER), { run_id: runId, keep_open: true, plan: [step('search', 'g')] });
    expect((await h.client.post(`/runs/${runId}/cancel`, { token: operator, body: {} })).body.status).toBe('cancelled');
    // The database fails this run's rejection record alone, as a dropped connection would.
    await sql`create function test_unrecorded_refusal() returns trigger language plpgsql as $$ begin raise exception 'connection lost' using errcode = '08006'; end $$`.execute(
      db,
    );
    await sql`create trigger test_unrecorded_refusal before insert on audit_events for each row when (new.event_type = 'run.control_rejected' and new.run_id = ${sql.lit(runId)}) execute function test_unrecorded_refusal()`.execute(
      db,
    );
    try {
      for (const name of ['cancel', 'kill', 'pause', 'resume']) {
        const res = await h.client.post(`/runs/${runId}/${name}`, { token: operator, body: {} });
        expect(res.status, name).toBe(503);
        expect(res.body.error.code).toBe('gateway_unavailable');
      }
    } finally {
      await sql`drop trigger test_unrecorded_refusal on audit_events`.execute(db);
      await sql`drop function test_unrecorded_refusal()`.execute(db);
    }
    expect(await audit({ run_id: runId, event_type: 'run.control_rejected' })).toEqual([]);
    expect((await h.client.post(`/runs/${runId}/cancel`, { token: operator, body: {} })).status).toBe(409);
    expect(await audit({ run_id: runId, event_type: 'run.control_rejected' })).toHaveLength(1);
  });
});

describe('a kill switch stops the runs whose next calls it would stop, resolved as the agent’s calls resolve', () => {
  const DRIFT = 'drift.agent';
  const region = (name: string) => ({ family: 'test', provider: 'loopback', region: name });

  beforeAll(async () => {
    await registerTool(h.client, {
      id: 'drift.approve',
      category: 'draft_write',
      backendUrl: `${backend.url}/echo`,
      requires_approval: true,
      allowed_agents: [DRIFT],
    });
    // A newer version on another allowlist, in another region.
    await registerTool(h.client, {
      id: 'drift.allow',
      version: '1.0.0',
      allowed_agents: [DRIFT],
      target: region('eu-drift'),
      backendUrl: `${backend.url}/echo`,
    });
    await registerTool(h.client, {
      id: 'drift.allow',
      version: '2.0.0',
      allowed_agents: ['someone.else'],
      target: region('us-drift'),
      backendUrl: `${backend.url}/echo`,
    });
    // A newer external_call version, which the tenant (external calls off) does not get.
    await registerTool(h.client, {
      id: 'drift.reach',
      version: '1.0.0',
      allowed_agents: [DRIFT],
      target: region('eu-reach'),
      backendUrl: `${backend.url}/echo`,
    });
    await registerTool(h.client, {
      id: 'drift.reach',
      version: '2.0.0',
      category: 'external_call',
      risk_level: 'medium',
      allowed_agents: [DRIFT],
      target: region('us-reach'),
      egress: { allowed_hosts: ['api.example.test'] },
      ...egressSchemas,
    });
    await grantTool(h.client, { tenant: T, agent: DRIFT, tool: 'drift.approve' });
  });

  /** A run of the drift agent waiting for approval at its first step, with `next` still to call. */
  const waitingBefore = async (next: string) => {
    const runId = newRunId('drift');
    const res = await h.client.post('/runs/execute', {
      token: as(DRIFT),
      body: { run_id: runId, context: {}, plan: [step('drift.approve', 'x'), step(next, 'y')] },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(202);
    return runId;
  };
  const armRegion = async (target: string) => {
    const res = await h.client.post('/kill-switches', {
      token: tokens.platform(),
      body: { scope: 'region', target, reason: `region ${target} down`, user_visible_status_copy: 'Paused' },
    });
    expect(res.status).toBe(201);
    return res.body.id as string;
  };
  const disarm = (id: string) =>
    h.client.post(`/kill-switches/${id}/disarm`, { token: tokens.platform(), body: { reason: 'over' } });

  it.each([
    ['a newer version on another allowlist', 'drift.allow', 'us-drift', 'eu-drift'],
    ['a newer external_call version its tenant has not enabled', 'drift.reach', 'us-reach', 'eu-reach'],
  ])(
    '%s: a switch on the version the agent would not call leaves the run; one on the version it would call stops it',
    async (_name, tool, notCalled, called) => {
      const runId = await waitingBefore(tool);
      const armed: string[] = [];
      try {
        armed.push(await armRegion(notCalled));
        expect(await statusOf(h.client, runId)).toBe('awaiting_approval');
        armed.push(await armRegion(called));
        expect(await statusOf(h.client, runId)).toBe('killed');
        const [stop] = await audit({ run_id: runId, event_type: 'run.stopped' });
        expect(stop).toMatchObject({
          reason_code: 'kill_switch_active',
          details: { kill_switch_id: armed[1], scope: 'region', target: called },
        });
        // Resuming it is refused with the reason it was stopped, and that refusal is on record too.
        const resumed = await h.client.post(`/runs/${runId}/resume`, { token: operator, body: {} });
        expect(resumed.body.error).toMatchObject({ code: 'kill_switch_active', details: { kill_switch_id: armed[1] } });
        const [rejected] = await audit({ run_id: runId, event_type: 'run.control_rejected' });
        expect(rejected).toMatchObject({
          actor: `operator:ops.${T}`,
          status: 'denied',
          reason_code: 'kill_switch_active',
          details: { control: 'resume', kill_switch_id: armed[1], status: 'killed' },
        });
      } finally {
        for (const id of armed) await disarm(id);
      }
    },
  );
});

describe.skipIf(!hasPostgresServer)('cascades on every replica (needs a PostgreSQL server)', () => {
  let database: Database;
  let second: AppClient;

  beforeAll(async () => {
    database = await openPool(h.db.url, 5);
    second = await AppClient.start(database, { TOOLGATE_GRANT_EXPIRY_SWEEP_MS: '100' });
  });
  afterAll(async () => {
    await second?.close();
    await database?.close();
  });

  it('a revocation at depth 0 stops a depth-2 sub-run mid-plan on another replica, and everything in between', async () => {
    const rootGrant = await grantTool(h.client, {
      tenant: T,
      agent: A,
      tool: 'search',
      scope: 'per-session',
      scope_ref: 'session-cascade',
    });
    const root = newRunId('root');
    const started = await h.client.post('/runs/execute', {
      token: as(A),
      body: {
        run_id: root,
        session_id: 'session-cascade',
        keep_open: true,
        budget_units: 100,
        context: {},
        plan: [step('search', 'root')],
      },
    });
    expect(started.body.status).toBe('running');
    const handOff = (
      client: AppClient,
      agentId: string,
      parent: string,
      sub: string,
      subAgent: string,
      budget: number,
    ) =>
      client.post(`/runs/${parent}/handoffs`, {
        token: as(agentId),
        body: {
          sub_agent_id: subAgent,
          sub_run_id: sub,
          budget_units: budget,
          delegable_tool_ids: ['search', 'held'],
          max_fanout: 2,
        },
      });
    // A's grant for `held` is its per-tenant one; the per-session grant is what backs `search`.
    const middle = newRunId('middle');
    expect((await handOff(h.client, A, root, middle, B, 50)).status).toBe(201);
    const queued = newRunId('queued');
    expect((await handOff(h.client, A, root, queued, C, 5)).status).toBe(201);
    expect(
      (
        await second.post('/runs/execute', {
          token: as(B),
          body: { run_id: middle, parent_run_id: root, keep_open: true, context: {}, plan: [step('search', 'middle')] },
        })
      ).body.status,
    ).toBe('running');
    const leaf = newRunId('leaf');
    expect((await handOff(second, B, middle, leaf, C, 20)).status).toBe(201);

    const gate = backend.hitsOn('/gate').length;
    const leafRun = second.post('/runs/execute', {
      token: as(C),
      body: {
        run_id: leaf,
        parent_run_id: middle,
        context: {},
        plan: [step('held', 'leaf in flight'), step('search', 'leaf never')],
      },
    });
    await backend.waitForHits('/gate', gate + 1);
    const revoked = await h.client.post(`/grants/${rootGrant.id}/revoke`, {
      token: operator,
      body: { reason: 'root agent compromised' },
    });
    expect(revoked.status).toBe(200);
    backend.openGate();
    const res = await leafRun;
    expect(res.status).toBe(403);
    expect(res.body.status).toBe('failed');
    expect(res.body.steps.map((s: { status: string }) => s.status)).toEqual(['completed', 'denied']);
    expect(res.body.steps[1].error).toMatchObject({
      code: 'grant_revoked',
      details: { grant_id: rootGrant.id, cascade_depth: 2 },
    });
    expect(hitsOf(leaf)).toEqual(['leaf in flight']);

    for (const runId of [root, middle, queued, leaf]) expect(await statusOf(second, runId)).toBe('failed');
    const stops = await audit({ event_type: 'run.stopped', since: new Date(Date.now() - 60_000).toISOString() });
    const depthOf = (runId: string) => stops.find((e) => e.run_id === runId)?.details;
    expect(depthOf(root)).toMatchObject({
      cascade_depth: 0,
      cause: 'grant_revoked',
      grant_id: rootGrant.id,
      previous_status: 'running',
    });
    expect(depthOf(middle)).toMatchObject({ cascade_depth: 1, via_run_id: root });
    expect(depthOf(queued)).toMatchObject({ cascade_depth: 1, previous_status: 'queued' });
    expect(depthOf(leaf)).toMatchObject({
      cascade_depth: 2,
      via_run_id: middle,
      attribution: [
        { run_id: root, agent_id: A },
        { run_id: middle, agent_id: B },
        { run_id: leaf, agent_id: C },
      ],
    });
    for (const runId of [root, middle, queued, leaf])
      expect(stops.find((e) => e.run_id === runId)?.actor).toBe(`operator:ops.${T}`);
  });

  it('stops paused and waiting runs that relied on a revoked grant, not the others', async () => {
    const grant = await grantTool(h.client, {
      tenant: T,
      agent: OWNER,
      tool: 'search',
      scope: 'per-session',
      scope_ref: 'session-idle',
    });
    const paused = newRunId('paused');
    await h.client.post('/runs/execute', {
      token: as(OWNER),
      body: { run_id: paused, session_id: 'session-idle', keep_open: true, context: {}, plan: [step('search', 'p')] },
    });
    await h.client.post(`/runs/${paused}/pause`, { token: operator, body: {} });
    // Without the session, the same agent's calls rest on its per-tenant grant instead.
    const bystander = newRunId('bystander');
    await h.client.post('/runs/execute', {
      token: as(OWNER),
      body: { run_id: bystander, keep_open: true, context: {}, plan: [step('search', 'b')] },
    });
    await second.post(`/grants/${grant.id}/revoke`, { token: operator, body: { reason: 'session over' } });
    expect(await statusOf(h.client, paused)).toBe('failed');
    expect(await statusOf(h.client, bystander)).toBe('running');
    const res = await h.client.post(`/runs/${paused}/resume`, { token: operator, body: {} });
    expect(res.status).toBe(403);
    expect(res.body.error.code).toBe('grant_revoked');
  });

  it('an expiry stops the runs that relied on the grant, recorded by system.expiry', async () => {
    // The grant lapses on the clock of a replica whose time the test moves: its sweeper records the lapse.
    const clock = new ManualClock(new Date());
    const clocked = await startClient(database, clock, { TOOLGATE_GRANT_EXPIRY_SWEEP_MS: '100' });
    try {
      const agentId = 'expiring.agent';
      await grantTool(h.client, {
        tenant: T,
        agent: agentId,
        tool: 'search',
        expires_at: new Date(clock.now().getTime() + 60_000).toISOString(),
      });
      const runId = newRunId('expiring');
      await execute(h.client, as(agentId), {
        run_id: runId,
        keep_open: true,
        budget_units: 10,
        plan: [step('search', 'e')],
      });
      const sub = newRunId('expiring-sub');
      expect(
        (
          await h.client.post(`/runs/${runId}/handoffs`, {
            token: as(agentId),
            body: { sub_agent_id: C, sub_run_id: sub, budget_units: 5, delegable_tool_ids: ['search'], max_fanout: 0 },
          })
        ).status,
      ).toBe(201);
      clock.advance(60_001);
      await until('the sweep to stop the sub-run', async () => (await statusOf(h.client, sub)) === 'failed', {
        intervalMs: 25,
      });
      expect(await statusOf(h.client, runId)).toBe('failed');
      const [stop] = await audit({ run_id: sub, event_type: 'run.stopped' });
      expect(stop).toMatchObject({
        actor: 'system.expiry',
        reason_code: 'grant_expired',
        details: { cascade_depth: 1 },
      });
      expect((await h.client.get(`/runs/${runId}/handoffs`, { token: operator })).body.items[0]).toMatchObject({
        status: 'closed',
        returned_units: 5,
      });
    } finally {
      await clocked.close();
    }
  });

  it('a platform-wide tool kill switch stops runs of every tenant; a tenant-scoped one only its tenant’s', async () => {
    const agentId = 'feeds.agent';
    for (const tenant of [T, OTHER_T]) await grantTool(h.client, { tenant, agent: agentId, tool: 'feeds.publish' });
    await grantTool(h.client, { tenant: OTHER_T, agent: agentId, tool: 'search' });
    const waiting = async (client: AppClient, tenant: string) => {
      const runId = newRunId(tenant);
      const res = await client.post('/runs/execute', {
        token: as(agentId, tenant),
        body: { run_id: runId, keep_open: true, budget_units: 10, context: {}, plan: [step('feeds.publish', 'news')] },
      });
      expect(res.status).toBe(202);
      return runId;
    };
    const ours = await waiting(h.client, T);
    const theirs = await waiting(second, OTHER_T);
    const theirSub = newRunId('sub');
    expect(
      (
        await second.post(`/runs/${theirs}/handoffs`, {
          token: as(agentId, OTHER_T),
          body: { sub_agent_id: C, sub_run_id: theirSub, budget_units: 2, delegable_tool_ids: [], max_fanout: 0 },
        })
      ).status,
    ).toBe(201);
    const unrelated = newRunId('unrelated');
    await second.post('/runs/execute', {
      token: as(agentId, OTHER_T),
      body: { run_id: unrelated, keep_open: true, context: {}, plan: [step('search', 'other tool')] },
    });

    const tenantSwitch = await h.client.post('/kill-switches', {
      token: operator,
      body: {
        scope: 'tool',
        target: 'feeds.publish',
        reason: 'bad feed in this tenant',
        user_visible_status_copy: 'Publishing paused here',
      },
    });
    expect(tenantSwitch.status).toBe(201);
    expect(await statusOf(h.client, ours)).toBe('killed');
    expect(await statusOf(second, theirs, OTHER_T)).toBe('awaiting_approval');

    const platformSwitch = await second.post('/kill-switches', {
      token: tokens.platform(),
      body: {
        scope: 'tool',
        target: 'feeds.publish',
        reason: 'bad feed everywhere',
        user_visible_status_copy: 'Publishing paused',
      },
    });
    expect(platformSwitch.status).toBe(201);
    expect(await statusOf(second, theirs, OTHER_T)).toBe('killed');
    expect(await statusOf(second, theirSub, OTHER_T)).toBe('killed');
    expect(await statusOf(second, unrelated, OTHER_T)).toBe('running');
    const [stop] = await audit({ run_id: theirSub, event_type: 'run.stopped' });
    expect(stop).toMatchObject({
      reason_code: 'kill_switch_active',
      details: { cascade_depth: 1, kill_switch_id: platformSwitch.body.id, platform_wide: true },
    });
    const res = await second.post(`/runs/${theirs}/resume`, { token: as(agentId, OTHER_T), body: {} });
    expect(res.status).toBe(403);
    expect(res.body.error).toMatchObject({ code: 'kill_switch_active', message: 'Publishing paused' });

    await h.client.post(`/kill-switches/${tenantSwitch.body.id}/disarm`, { token: operator, body: { reason: 'over' } });
    await h.client.post(`/kill-switches/${platformSwitch.body.id}/disarm`, {
      token: tokens.platform(),
      body: { reason: 'over' },
    });
  });
});
