import pg from 'pg';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BudgetLedger } from '../src/budgets/budget-ledger.js';
import { TestBackend } from './helpers/backend.js';
import { hasPostgresServer } from './helpers/database.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { execute, step } from './helpers/runs.js';
import { tokens } from './helpers/tokens.js';
import { createBudget, grantTool, newRunId, registerTool } from './helpers/world.js';
import { blockedBy, lockWaits, until } from './helpers/waits.js';

// SPEC §6 hand-offs: a running agent hands a sub-agent part of its budget and a narrower authority.
const T = 'tenant-handoffs';
const ROOT = 'veritas.orchestrator';
const SUB = 'sophia.researcher';
const WRITER = 'isis.writer';
/** A sub-agent with a budget of its own (see `courierBudgetWithCounter`). */
const COURIER = 'nuru.courier';
const CHAIN = ['chain.a0', 'chain.a1', 'chain.a2', 'chain.a3', 'chain.a4', 'chain.a5'];
const operator = tokens.tenantOperator(T);
const as = (agentId: string) => tokens.agent(agentId, { tenant: T });

let h: Harness;
let backend: TestBackend;

const handoff = (agentId: string, parentRunId: string, body: Record<string, unknown>) =>
  h.client.post(`/runs/${parentRunId}/handoffs`, {
    token: as(agentId),
    body: {
      sub_agent_id: SUB,
      sub_run_id: newRunId('sub'),
      budget_units: 10,
      delegable_tool_ids: ['search'],
      max_fanout: 0,
      ...body,
    },
  });
const hitsOf = (runId: string) => backend.hitsOfRun(runId).map((hit) => (hit.body as { q: string }).q);
const auditOf = async (query: Record<string, string>) =>
  (await h.client.get('/audit', { token: operator, query: { limit: 200, ...query } })).body.items as Array<
    Record<string, any>
  >;
const allowance = async (runId: string, agentId: string) =>
  (await h.client.get(`/runs/${runId}`, { token: as(agentId) })).body.budget;

/** COURIER's own budget, its counter made by a first call: a test holds it to keep a call at its reservation. */
async function courierBudgetWithCounter(): Promise<{ id: string }> {
  const made = (await h.client.get('/budgets', { token: operator })).body.items.find(
    (b: { agent_id: string | null }) => b.agent_id === COURIER,
  ) as { id: string } | undefined;
  const budget =
    made ??
    (await createBudget(h.client, { tenant: T, scope: 'agent', agent_id: COURIER, limit_units: 1000, warn_ratio: 1 }));
  expect(
    (
      await execute(h.client, as(COURIER), {
        run_id: newRunId('warm'),
        plan: [step('courier.fetch', 'makes the counter')],
      })
    ).status,
  ).toBe(200);
  return budget;
}

/** A root run of ROOT kept open, with a budget and one completed call to `search` (2 units). */
async function openRoot(budget: number | null = 100, agentId = ROOT): Promise<string> {
  const runId = newRunId('root');
  const res = await execute(h.client, as(agentId), {
    run_id: runId,
    keep_open: true,
    ...(budget === null ? {} : { budget_units: budget }),
    plan: [step('search', 'root work')],
  });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  expect(res.body.status).toBe('running');
  return runId;
}

beforeAll(async () => {
  h = await startHarness({ TOOLGATE_HANDOFF_MAX_FANOUT: '3' });
  backend = await new TestBackend().start();
  const everyone = { allowed_agents: [ROOT, SUB, WRITER, ...CHAIN] };
  await registerTool(h.client, { id: 'search', backendUrl: `${backend.url}/echo`, cost_units: 2, ...everyone });
  await registerTool(h.client, { id: 'summarize', backendUrl: `${backend.url}/echo`, cost_units: 1, ...everyone });
  await registerTool(h.client, { id: 'secret', backendUrl: `${backend.url}/echo`, cost_units: 1, ...everyone });
  await registerTool(h.client, { id: 'pricey', backendUrl: `${backend.url}/cost/7`, cost_units: 1, ...everyone });
  // Calls held at the backend until `openGate()`, which then reports their cost.
  await registerTool(h.client, {
    id: 'held.pricey',
    backendUrl: `${backend.url}/gate/cost/7`,
    cost_units: 1,
    allowed_agents: [ROOT, SUB, WRITER],
  });
  await registerTool(h.client, {
    id: 'held.cheap',
    backendUrl: `${backend.url}/gate/cost/0.25`,
    cost_units: 1,
    allowed_agents: [ROOT, SUB],
  });
  for (const agent of [ROOT, SUB])
    for (const tool of ['held.pricey', 'held.cheap']) await grantTool(h.client, { tenant: T, agent, tool });
  await grantTool(h.client, { tenant: T, agent: WRITER, tool: 'held.pricey' });
  for (const tool of ['search', 'summarize', 'pricey']) await grantTool(h.client, { tenant: T, agent: ROOT, tool });
  for (const tool of ['search', 'summarize', 'secret', 'pricey'])
    await grantTool(h.client, { tenant: T, agent: SUB, tool });
  await grantTool(h.client, { tenant: T, agent: WRITER, tool: 'search' });
  for (const agentId of CHAIN) await grantTool(h.client, { tenant: T, agent: agentId, tool: 'search' });
  // ROOT may not spend more than 2 units a call on `capped` (it costs 3); SUB's own grant is unlimited.
  await registerTool(h.client, { id: 'capped', backendUrl: `${backend.url}/echo`, cost_units: 3, ...everyone });
  await grantTool(h.client, { tenant: T, agent: ROOT, tool: 'capped', capability_modifiers: { max_cost_units: 2 } });
  await grantTool(h.client, { tenant: T, agent: SUB, tool: 'capped' });
  await registerTool(h.client, {
    id: 'courier.fetch',
    backendUrl: `${backend.url}/echo`,
    cost_units: 1,
    allowed_agents: [ROOT, COURIER],
  });
  await registerTool(h.client, {
    id: 'courier.pricey',
    backendUrl: `${backend.url}/cost/7`,
    cost_units: 1,
    allowed_agents: [ROOT, COURIER],
  });
  for (const agent of [ROOT, COURIER])
    for (const tool of ['courier.fetch', 'courier.pricey']) await grantTool(h.client, { tenant: T, agent, tool });
});

afterAll(async () => {
  await backend?.close();
  await h?.close();
});

describe('POST /runs/{run_id}/handoffs refuses, with a typed reason, in SPEC order', () => {
  const reasonOf = (res: { status: number; body: any }) => {
    expect(res.status, JSON.stringify(res.body)).toBe(403);
    expect(res.body.error.code).toBe('handoff_rejected');
    return res.body.error.details.reason as string;
  };

  it('cycle_detected: the sub-agent is already in the trace', async () => {
    const root = await openRoot();
    expect(reasonOf(await handoff(ROOT, root, { sub_agent_id: ROOT }))).toBe('cycle_detected');
    const sub = (await handoff(ROOT, root, {})).body.sub_run_id as string;
    expect(reasonOf(await handoff(SUB, sub, { sub_agent_id: ROOT }))).toBe('cycle_detected');
  });

  it('depth_cap_exceeded: a trace of five agents hands off no further', async () => {
    let runId = await openRoot(100, CHAIN[0]);
    for (let depth = 1; depth <= 4; depth += 1) {
      const res = await handoff(CHAIN[depth - 1]!, runId, {
        sub_agent_id: CHAIN[depth],
        budget_units: 50 - depth * 5,
        max_fanout: 3,
      });
      expect(res.status, JSON.stringify(res.body)).toBe(201);
      expect(res.body.depth).toBe(depth);
      runId = res.body.sub_run_id;
    }
    const refused = await handoff(CHAIN[4]!, runId, { sub_agent_id: CHAIN[5], budget_units: 1 });
    expect(reasonOf(refused)).toBe('depth_cap_exceeded');
    expect(refused.body.error.details).toMatchObject({ depth: 5, max_depth: 5 });
  });

  it('authority_widening_rejected: tools, fan-out, modifiers or approval wider than the parent’s', async () => {
    const root = await openRoot();
    // `secret` is one the root holds no grant for (its sub-agent does, which changes nothing).
    const tools = await handoff(ROOT, root, { delegable_tool_ids: ['search', 'secret'] });
    expect(reasonOf(tools)).toBe('authority_widening_rejected');
    expect(tools.body.error.details).toMatchObject({ field: 'delegable_tool_ids', tool_ids: ['secret'] });
    expect(reasonOf(await handoff(ROOT, root, { max_fanout: 4 }))).toBe('authority_widening_rejected');

    const narrowed = await handoff(ROOT, root, {
      capability_modifiers: { max_cost_units: 2 },
      max_fanout: 2,
      approval_requirement: 'operator',
    });
    expect(narrowed.status).toBe(201);
    const sub = narrowed.body.sub_run_id as string;
    const wider = await handoff(SUB, sub, {
      sub_agent_id: WRITER,
      budget_units: 1,
      capability_modifiers: { max_cost_units: 5 },
      approval_requirement: 'operator',
    });
    expect(reasonOf(wider)).toBe('authority_widening_rejected');
    expect(wider.body.error.details.field).toBe('capability_modifiers.max_cost_units');
    expect(
      reasonOf(await handoff(SUB, sub, { sub_agent_id: WRITER, budget_units: 1, approval_requirement: 'operator' })),
    ).toBe('authority_widening_rejected');
    const weaker = await handoff(SUB, sub, {
      sub_agent_id: WRITER,
      budget_units: 1,
      capability_modifiers: { max_cost_units: 1 },
      approval_requirement: 'none',
    });
    expect(weaker.body.error.details.field).toBe('approval_requirement');
    expect(
      reasonOf(
        await handoff(SUB, sub, {
          sub_agent_id: WRITER,
          budget_units: 1,
          max_fanout: 3,
          capability_modifiers: { max_cost_units: 1 },
          approval_requirement: 'operator',
        }),
      ),
    ).toBe('authority_widening_rejected');
  });

  it('authority_widening_rejected: an envelope that drops or raises a limit the parent’s own grant sets on a tool it hands on', async () => {
    const root = await openRoot();
    const own = await execute(h.client, as(ROOT), {
      run_id: newRunId('capped'),
      plan: [step('capped', 'the root itself')],
    });
    expect(own.body.steps[0].error).toMatchObject({ code: 'budget_exceeded', details: { max_cost_units: 2 } });
    // Handing `capped` on without the limit would let the sub-agent make the call its parent may not.
    for (const capability_modifiers of [{}, { max_cost_units: 3 }]) {
      const refused = await handoff(ROOT, root, { delegable_tool_ids: ['search', 'capped'], capability_modifiers });
      expect(reasonOf(refused)).toBe('authority_widening_rejected');
      expect(refused.body.error.details).toMatchObject({
        field: 'capability_modifiers.max_cost_units',
        tool_id: 'capped',
      });
    }
    const kept = await handoff(ROOT, root, {
      delegable_tool_ids: ['search', 'capped'],
      capability_modifiers: { max_cost_units: 2 },
    });
    expect(kept.status, JSON.stringify(kept.body)).toBe(201);
    const res = await execute(h.client, as(SUB), {
      run_id: kept.body.sub_run_id,
      parent_run_id: root,
      plan: [step('capped', 'the sub-agent'), step('search', 'after')],
    });
    expect(res.body.steps[0]).toMatchObject({
      status: 'denied',
      error: { code: 'budget_exceeded', details: { max_cost_units: 2 } },
    });
    expect(hitsOf(kept.body.sub_run_id)).toEqual([]);
  });

  it('authority_widening_rejected: a hand-off beyond the parent’s fan-out', async () => {
    const root = await openRoot();
    for (let i = 0; i < 3; i += 1) expect((await handoff(ROOT, root, { budget_units: 1 })).status).toBe(201);
    const fourth = await handoff(ROOT, root, { budget_units: 1 });
    expect(reasonOf(fourth)).toBe('authority_widening_rejected');
    expect(fourth.body.error.details).toMatchObject({ field: 'fanout', parent_max_fanout: 3, handoffs_made: 3 });
  });

  it('budget_non_positive, then budget_exceeds_parent', async () => {
    const root = await openRoot(20);
    expect(reasonOf(await handoff(ROOT, root, { budget_units: 0 }))).toBe('budget_non_positive');
    expect(reasonOf(await handoff(ROOT, root, { budget_units: -3 }))).toBe('budget_non_positive');
    // Units have six decimal places: an amount that rounds to zero is none.
    expect(reasonOf(await handoff(ROOT, root, { budget_units: 1e-7 }))).toBe('budget_non_positive');
    const over = await handoff(ROOT, root, { budget_units: 18.5 });
    expect(reasonOf(over)).toBe('budget_exceeds_parent');
    expect(over.body.error.details).toMatchObject({ parent_remaining_units: 18 });
    expect((await handoff(ROOT, root, { budget_units: 18 })).status).toBe(201);
    // A run without budget_units has nothing to hand on.
    expect(reasonOf(await handoff(ROOT, await openRoot(null), { budget_units: 1 }))).toBe('budget_exceeds_parent');
  });

  it('reports the first reason that applies, and audits each refusal', async () => {
    const root = await openRoot();
    const res = await handoff(ROOT, root, { sub_agent_id: ROOT, delegable_tool_ids: ['secret'], budget_units: -1 });
    expect(reasonOf(res)).toBe('cycle_detected');
    expect(reasonOf(await handoff(ROOT, root, { delegable_tool_ids: ['secret'], budget_units: -1 }))).toBe(
      'authority_widening_rejected',
    );
    const events = await auditOf({ run_id: root, event_type: 'handoff.rejected' });
    expect(events.map((e) => e.details.reason)).toEqual(['authority_widening_rejected', 'cycle_detected']);
    expect(events[0]).toMatchObject({ status: 'denied', reason_code: 'handoff_rejected', actor: `agent:${ROOT}` });
  });

  it('refuses a max_fanout above 1000 as invalid, with one message however far above it is', async () => {
    const root = await openRoot();
    for (const max_fanout of [1001, 1e308]) {
      const res = await handoff(ROOT, root, { max_fanout });
      expect(res.status, String(max_fanout)).toBe(400);
      expect(res.body.error.code).toBe('invalid_request');
      expect(res.body.error.details.issues).toEqual([
        { field: 'body.max_fanout', message: expect.stringContaining('<=1000') },
      ]);
    }
  });

  it('is for the agent owning a run that has not ended, and a sub-run id nobody uses', async () => {
    const root = await openRoot();
    expect((await handoff(SUB, root, { sub_agent_id: WRITER })).status).toBe(404);
    expect((await h.client.post(`/runs/${root}/handoffs`, { token: operator, body: {} })).status).toBe(403);
    const taken = await handoff(ROOT, root, { sub_run_id: root });
    expect(taken.status).toBe(409);
    expect(taken.body.error.code).toBe('run_id_conflict');
    // Refused as the other hand-off refusals are: on record under the parent run.
    expect(await auditOf({ run_id: root, event_type: 'handoff.rejected' })).toEqual([
      expect.objectContaining({
        actor: `agent:${ROOT}`,
        agent_id: ROOT,
        status: 'denied',
        reason_code: 'run_id_conflict',
        details: expect.objectContaining({ sub_run_id: root, sub_agent_id: SUB }),
      }),
    ]);
    const finished = newRunId();
    await execute(h.client, as(ROOT), { run_id: finished, budget_units: 10, plan: [step('search', 'done')] });
    const late = await handoff(ROOT, finished, {});
    expect(late.status).toBe(409);
    expect(late.body.error.code).toBe('run_not_resumable');
    // An ended parent's refusal is on record too, and it relied on no grant for it.
    expect(await auditOf({ run_id: finished, event_type: 'handoff.rejected' })).toEqual([
      expect.objectContaining({
        actor: `agent:${ROOT}`,
        status: 'denied',
        reason_code: 'run_not_resumable',
        details: expect.objectContaining({ status: 'completed', sub_agent_id: SUB, message: late.body.error.message }),
      }),
    ]);
  });
});

describe('a sub-run', () => {
  it('acts within the intersection of its own grants and the envelope', async () => {
    const root = await openRoot();
    const created = await handoff(ROOT, root, { delegable_tool_ids: ['search', 'summarize'] });
    expect(created.status).toBe(201);
    expect(created.body).toMatchObject({
      id: expect.stringMatching(/^hof_/),
      parent_run_id: root,
      sub_agent_id: SUB,
      status: 'open',
      depth: 1,
      approval_id: null,
    });
    const sub = created.body.sub_run_id as string;
    const queued = await h.client.get(`/runs/${sub}`, { token: as(SUB) });
    expect(queued.body).toMatchObject({ status: 'queued', parent_run_id: root, depth: 1, agent_id: SUB });

    // `secret` is granted to the sub-agent itself, but was not handed to this sub-run.
    const res = await execute(h.client, as(SUB), {
      run_id: sub,
      parent_run_id: root,
      plan: [step('search', 'allowed'), step('secret', 'not in the envelope')],
    });
    expect(res.status).toBe(403);
    expect(res.body.steps.map((s: { status: string }) => s.status)).toEqual(['completed', 'denied']);
    expect(res.body.steps[1].error).toMatchObject({
      code: 'unauthorized_tool_access',
      details: { reason: 'outside_delegation' },
    });
    expect(hitsOf(sub)).toEqual(['allowed']);

    // Within the envelope, a tool its agent holds no grant for is still refused.
    const writer = (await handoff(ROOT, root, { sub_agent_id: WRITER, delegable_tool_ids: ['search', 'summarize'] }))
      .body.sub_run_id;
    const ungranted = await execute(h.client, as(WRITER), {
      run_id: writer,
      parent_run_id: root,
      plan: [step('summarize', 'x')],
    });
    expect(ungranted.body.steps[0].error.code).toBe('grant_missing');
  });

  it('is executed only as the hand-off made it: its agent, its parent', async () => {
    const root = await openRoot();
    const sub = (await handoff(ROOT, root, {})).body.sub_run_id as string;
    expect(
      (await execute(h.client, as(WRITER), { run_id: sub, parent_run_id: root, plan: [step('search', 'x')] })).status,
    ).toBe(409);
    // Another agent learns nothing of how runs are made: their ids are conflicts, whatever it names
    // as their parent, run or dry run.
    for (const dry_run of [false, true]) {
      for (const run_id of [root, sub]) {
        const res = await execute(h.client, as(WRITER), {
          run_id,
          parent_run_id: 'made-up',
          dry_run,
          plan: [step('search', 'x')],
        });
        expect(res.status).toBe(409);
        expect(res.body.error).toMatchObject({ code: 'run_id_conflict', details: {} });
      }
    }
    expect((await execute(h.client, as(SUB), { run_id: sub, plan: [step('search', 'x')] })).status).toBe(409);
    const invented = await execute(h.client, as(SUB), {
      run_id: newRunId(),
      parent_run_id: root,
      plan: [step('search', 'x')],
    });
    expect(invented.status).toBe(403);
    expect(invented.body.error).toMatchObject({ code: 'handoff_rejected', details: { reason: 'handoff_missing' } });
    expect(hitsOf(sub)).toEqual([]);
  });

  it('has each refusal of a run no hand-off gave, or of another agent’s run id, on record', async () => {
    const root = await openRoot();
    const sub = (await handoff(ROOT, root, {})).body.sub_run_id as string;
    const invented = newRunId();
    expect(
      (await execute(h.client, as(SUB), { run_id: invented, parent_run_id: root, plan: [step('search', 'x')] })).status,
    ).toBe(403);
    const [missing, ...more] = await auditOf({ run_id: invented });
    expect(more).toEqual([]);
    expect(missing).toMatchObject({
      event_type: 'handoff.rejected',
      actor: `agent:${SUB}`,
      agent_id: SUB,
      status: 'denied',
      reason_code: 'handoff_rejected',
      details: { reason: 'handoff_missing', parent_run_id: root },
    });
    const taken = await execute(h.client, as(WRITER), {
      run_id: sub,
      parent_run_id: 'made-up',
      plan: [step('search', 'x')],
    });
    expect(taken.body.error).toMatchObject({ code: 'run_id_conflict', details: {} });
    const conflicts = await auditOf({ run_id: sub, agent_id: WRITER });
    expect(conflicts).toEqual([
      expect.objectContaining({
        event_type: 'run.rejected',
        actor: `agent:${WRITER}`,
        status: 'denied',
        reason_code: 'run_id_conflict',
        details: expect.objectContaining({ parent_run_id: 'made-up' }),
      }),
    ]);
  });

  it('has each of its own agent’s refusals on record: the wrong parent, none, a run it cannot start', async () => {
    const root = await openRoot();
    const other = await openRoot();
    const sub = (await handoff(ROOT, root, {})).body.sub_run_id as string;
    const wrong = await execute(h.client, as(SUB), { run_id: sub, parent_run_id: other, plan: [step('search', 'x')] });
    expect(wrong.status).toBe(409);
    expect(wrong.body.error).toMatchObject({ code: 'run_id_conflict', details: { parent_run_id: root } });
    const none = await execute(h.client, as(SUB), { run_id: sub, plan: [step('search', 'x')] });
    expect(none.body.error).toMatchObject({ code: 'run_id_conflict', details: { parent_run_id: root } });
    const held = (await handoff(ROOT, root, { approval_requirement: 'operator' })).body.sub_run_id as string;
    const early = await execute(h.client, as(SUB), { run_id: held, parent_run_id: root, plan: [step('search', 'x')] });
    expect(early.body.error).toMatchObject({ code: 'run_not_resumable', details: { status: 'awaiting_approval' } });
    const refusal = { event_type: 'run.rejected', actor: `agent:${SUB}`, agent_id: SUB, status: 'denied' };
    expect(await auditOf({ run_id: sub, event_type: 'run.rejected' })).toEqual([
      expect.objectContaining({
        ...refusal,
        reason_code: 'run_id_conflict',
        details: { parent_run_id: root, message: none.body.error.message },
      }),
      expect.objectContaining({
        ...refusal,
        reason_code: 'run_id_conflict',
        details: { parent_run_id: root, requested_parent_run_id: other, message: wrong.body.error.message },
      }),
    ]);
    expect(await auditOf({ run_id: held, event_type: 'run.rejected' })).toEqual([
      expect.objectContaining({
        ...refusal,
        reason_code: 'run_not_resumable',
        details: { status: 'awaiting_approval', parent_run_id: root, message: early.body.error.message },
      }),
    ]);
    expect(hitsOf(sub)).toEqual([]);
  });

  it('is dry-run within its hand-off: its envelope, its budget, and only from the parent that made it', async () => {
    const root = await openRoot();
    const dry = (agentId: string, body: Record<string, unknown>) =>
      execute(h.client, as(agentId), { dry_run: true, ...body });
    const narrow = (await handoff(ROOT, root, { budget_units: 1 })).body.sub_run_id as string;
    // SUB's own grants cover `secret`, but its hand-off does not; one unit does not pay for `search`.
    const outside = await dry(SUB, { run_id: narrow, parent_run_id: root, plan: [step('secret', 'x')] });
    expect(outside.body.steps[0]).toMatchObject({ status: 'denied', error: { code: 'unauthorized_tool_access' } });
    const costly = await dry(SUB, { run_id: narrow, parent_run_id: root, plan: [step('search', 'x')] });
    expect(costly.body.steps[0]).toMatchObject({ status: 'denied', error: { code: 'budget_exceeded' } });
    const roomy = (await handoff(ROOT, root, { budget_units: 10 })).body.sub_run_id as string;
    const fine = await dry(SUB, { run_id: roomy, parent_run_id: root, plan: [step('search', 'x')] });
    expect(fine.body.steps[0]).toMatchObject({ status: 'admissible' });
    // The request's budget only lowers the hand-off's.
    const lowered = await dry(SUB, {
      run_id: roomy,
      parent_run_id: root,
      budget_units: 1,
      plan: [step('search', 'x')],
    });
    expect(lowered.body.steps[0]).toMatchObject({ status: 'denied', error: { code: 'budget_exceeded' } });
    // As execution is, a dry run is refused for a parent no hand-off names, or by another agent.
    const invented = await dry(SUB, { run_id: newRunId(), parent_run_id: root, plan: [step('search', 'x')] });
    expect(invented.status).toBe(403);
    expect(invented.body.error).toMatchObject({ code: 'handoff_rejected', details: { reason: 'handoff_missing' } });
    expect((await dry(WRITER, { run_id: roomy, parent_run_id: root, plan: [step('search', 'x')] })).status).toBe(409);
    expect(hitsOf(narrow)).toEqual([]);
    expect(hitsOf(roomy)).toEqual([]);
  });

  it('records its attribution chain on its dispatches and on its end', async () => {
    const root = await openRoot();
    const sub = (await handoff(ROOT, root, {})).body.sub_run_id as string;
    await execute(h.client, as(SUB), { run_id: sub, parent_run_id: root, plan: [step('search', 'attributed')] });
    const chain = [
      { run_id: root, agent_id: ROOT },
      { run_id: sub, agent_id: SUB },
    ];
    const events = await auditOf({ run_id: sub });
    const byType = (type: string) => events.find((e) => e.event_type === type);
    expect(byType('handoff.dispatched')).toMatchObject({
      actor: `agent:${ROOT}`,
      details: { attribution: chain, budget_units: 10 },
    });
    expect(byType('run.step.dispatching')).toMatchObject({ details: { attribution: chain } });
    expect(byType('run.step.completed')).toMatchObject({ details: { attribution: chain } });
    expect(byType('handoff.closed')).toMatchObject({ status: 'completed', details: { attribution: chain } });
  });

  it('spends from the budget held for it, and the unused part returns to the parent when it ends', async () => {
    const root = await openRoot(100);
    expect(await allowance(root, ROOT)).toMatchObject({ budget_units: 100, spent_units: 2, remaining_units: 98 });
    const created = await handoff(ROOT, root, { budget_units: 30 });
    const sub = created.body.sub_run_id as string;
    expect(await allowance(root, ROOT)).toMatchObject({ reserved_units: 30, remaining_units: 68 });
    const over = await handoff(ROOT, root, { sub_agent_id: WRITER, budget_units: 69 });
    expect(over.body.error.details).toMatchObject({ reason: 'budget_exceeds_parent', parent_remaining_units: 68 });

    const res = await execute(h.client, as(SUB), {
      run_id: sub,
      parent_run_id: root,
      plan: [step('search', 'one'), step('search', 'two')],
    });
    expect(res.status).toBe(200);
    expect(await allowance(root, ROOT)).toMatchObject({ spent_units: 6, reserved_units: 0, remaining_units: 94 });
    const handoffs = await h.client.get(`/runs/${root}/handoffs`, { token: as(ROOT) });
    expect(handoffs.body.items).toEqual([
      expect.objectContaining({
        id: created.body.id,
        status: 'closed',
        budget_units: 30,
        spent_units: 4,
        returned_units: 26,
      }),
    ]);
    expect((await auditOf({ run_id: sub, event_type: 'handoff.closed' }))[0]).toMatchObject({
      cost_units: 4,
      details: { returned_units: 26, overshoot_units: 0 },
    });
    // Now the parent can hand on what came back.
    expect((await handoff(ROOT, root, { sub_agent_id: WRITER, budget_units: 94 })).status).toBe(201);
  });

  it('stops at a call its budget cannot pay for: an audited subagent_budget_exceeded', async () => {
    const root = await openRoot(100);
    const sub = (await handoff(ROOT, root, { budget_units: 3 })).body.sub_run_id as string;
    const res = await execute(h.client, as(SUB), {
      run_id: sub,
      parent_run_id: root,
      plan: [step('search', 'fits'), step('search', 'does not fit'), step('search', 'never')],
    });
    expect(res.status).toBe(402);
    expect(res.body.status).toBe('killed');
    expect(res.body.steps.map((s: { status: string }) => s.status)).toEqual(['completed', 'denied', 'skipped']);
    expect(res.body.steps[1].error).toMatchObject({
      code: 'budget_exceeded',
      details: { reason: 'subagent_budget_exceeded' },
    });
    expect(hitsOf(sub)).toEqual(['fits']);
    const [overshoot] = await auditOf({ run_id: sub, event_type: 'run.subagent_budget_exceeded' });
    expect(overshoot).toMatchObject({
      status: 'killed',
      reason_code: 'budget_exceeded',
      details: { parent_run_id: root, handed_units: 3 },
    });
    expect((await h.client.get(`/runs/${root}/handoffs`, { token: as(ROOT) })).body.items[0]).toMatchObject({
      spent_units: 2,
      returned_units: 1,
    });
  });

  it('stops when a call costs more than its budget after the fact; the parent bears the overshoot', async () => {
    const root = await openRoot(100);
    const sub = (await handoff(ROOT, root, { budget_units: 5, delegable_tool_ids: ['pricey', 'search'] })).body
      .sub_run_id as string;
    const res = await execute(h.client, as(SUB), {
      run_id: sub,
      parent_run_id: root,
      plan: [step('pricey', 'reports 7'), step('search', 'never')],
    });
    expect(res.status).toBe(402);
    expect(res.body.status).toBe('killed');
    expect(res.body.steps.map((s: { status: string }) => s.status)).toEqual(['completed', 'skipped']);
    expect(res.body.warnings).toContain('subagent_budget_exceeded');
    const [overshoot] = await auditOf({ run_id: sub, event_type: 'run.subagent_budget_exceeded' });
    expect(overshoot!.details).toMatchObject({ used_units: 7, budget_units: 5 });
    // Recorded in the commit that kills the sub-run and closes its hand-off.
    const [closed] = await auditOf({ run_id: sub, event_type: 'handoff.closed' });
    expect(closed).toMatchObject({ seq: overshoot!.seq + 1, occurred_at: overshoot!.occurred_at, status: 'killed' });
    expect((await h.client.get(`/runs/${root}/handoffs`, { token: as(ROOT) })).body.items[0]).toMatchObject({
      spent_units: 7,
      returned_units: 0,
    });
    expect(await allowance(root, ROOT)).toMatchObject({ spent_units: 9, remaining_units: 91 });
  });

  it('records an overshoot with the kill it causes, in one commit: a run stopped meanwhile was not killed by it', async () => {
    await registerTool(h.client, {
      id: 'slow.pricey',
      backendUrl: `${backend.url}/gate/cost/7`,
      cost_units: 1,
      allowed_agents: [ROOT, SUB],
    });
    for (const agentId of [ROOT, SUB]) await grantTool(h.client, { tenant: T, agent: agentId, tool: 'slow.pricey' });
    const root = await openRoot(100);
    const sub = (await handoff(ROOT, root, { budget_units: 5, delegable_tool_ids: ['slow.pricey'] })).body
      .sub_run_id as string;
    const gateHits = backend.hitsOn('/gate/cost/7').length;
    const running = execute(h.client, as(SUB), {
      run_id: sub,
      parent_run_id: root,
      plan: [step('slow.pricey', 'reports 7'), step('slow.pricey', 'never')],
    });
    await backend.waitForHits('/gate/cost/7', gateHits + 1);
    // Cancelled while its call is in flight: the call's cost passes its budget after the fact.
    expect((await h.client.post(`/runs/${sub}/cancel`, { token: operator, body: {} })).status).toBe(200);
    backend.openGate();
    const res = await running;
    expect(res.body.status).toBe('cancelled');
    expect((await h.client.get(`/runs/${sub}`, { token: as(SUB) })).body.status).toBe('cancelled');
    expect(await auditOf({ run_id: sub, event_type: 'run.subagent_budget_exceeded' })).toEqual([]);
  });

  it('cancelled with a call in flight: the parent bears what the call really cost, more or less than it reserved', async () => {
    const root = await openRoot(100);
    for (const [tool, cost] of [
      ['held.pricey', 7],
      ['held.cheap', 0.25],
    ] as const) {
      const before = (await allowance(root, ROOT)).spent_units as number;
      const sub = (await handoff(ROOT, root, { budget_units: 5, delegable_tool_ids: [tool] })).body
        .sub_run_id as string;
      const gateHits = backend.hitsOn(`/gate/cost/${cost}`).length;
      const running = execute(h.client, as(SUB), { run_id: sub, parent_run_id: root, plan: [step(tool, 'in flight')] });
      await backend.waitForHits(`/gate/cost/${cost}`, gateHits + 1);
      expect((await h.client.post(`/runs/${sub}/cancel`, { token: operator, body: { reason: 'enough' } })).status).toBe(
        200,
      );
      // The hand-off closed with the call still in flight: it is counted at what it reserved.
      const [closed] = (await h.client.get(`/runs/${root}/handoffs`, { token: as(ROOT) })).body.items.filter(
        (item: { sub_run_id: string }) => item.sub_run_id === sub,
      );
      expect(closed).toMatchObject({ status: 'closed', spent_units: 1, returned_units: 4 });
      expect(await allowance(root, ROOT)).toMatchObject({ spent_units: before, reserved_units: 1 });
      backend.openGate();
      await running;
      expect(await allowance(root, ROOT)).toMatchObject({ spent_units: before + cost, reserved_units: 0 });
    }
  });

  it('ended after its call in flight outlived its reservation: the parent bears what the call cost when it settles late', async () => {
    const root = await openRoot(100);
    const before = (await allowance(root, ROOT)).spent_units as number;
    const sub = (await handoff(ROOT, root, { budget_units: 5, delegable_tool_ids: ['held.pricey'] })).body
      .sub_run_id as string;
    const gateHits = backend.hitsOn('/gate/cost/7').length;
    const running = execute(h.client, as(SUB), {
      run_id: sub,
      parent_run_id: root,
      plan: [step('held.pricey', 'outlives its reservation')],
    });
    await backend.waitForHits('/gate/cost/7', gateHits + 1);
    // A sweep an hour on (another replica's clock) releases the call's reservation as abandoned.
    const later = new Date(Date.now() + 3_600_000);
    const sweeper = new BudgetLedger(h.db.database, {
      now: () => later,
      registry: new Registry(),
      reservationTtlMs: h.client.app.services.config.budgetReservationTtlSeconds * 1000,
      sweepIntervalMs: 0,
    });
    expect(await sweeper.releaseExpired()).toBeGreaterThanOrEqual(1);
    await sweeper.close();
    expect((await h.client.post(`/runs/${sub}/cancel`, { token: operator, body: { reason: 'enough' } })).status).toBe(
      200,
    );
    expect(await allowance(root, ROOT)).toMatchObject({ spent_units: before, reserved_units: 0 });
    backend.openGate();
    await running;
    // The call happened: settled late, it is charged to the sub-run and to its parent alike.
    expect(await allowance(sub, SUB)).toMatchObject({ spent_units: 7, reserved_units: 0 });
    expect(await allowance(root, ROOT)).toMatchObject({ spent_units: before + 7, reserved_units: 0 });
  });

  it('ended with a call in flight below it: every run up the chain bears what the call really cost', async () => {
    const root = await openRoot(100);
    const sub = (
      await handoff(ROOT, root, { budget_units: 20, delegable_tool_ids: ['search', 'held.pricey'], max_fanout: 1 })
    ).body.sub_run_id as string;
    expect(
      (
        await execute(h.client, as(SUB), {
          run_id: sub,
          parent_run_id: root,
          keep_open: true,
          plan: [step('search', 'sub work')],
        })
      ).body.status,
    ).toBe('running');
    const created = await handoff(SUB, sub, {
      sub_agent_id: WRITER,
      budget_units: 5,
      delegable_tool_ids: ['held.pricey'],
    });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const deep = created.body.sub_run_id as string;
    const hits = backend.hitsOn('/gate/cost/7').length;
    const running = execute(h.client, as(WRITER), {
      run_id: deep,
      parent_run_id: sub,
      plan: [step('held.pricey', 'deep, in flight')],
    });
    await backend.waitForHits('/gate/cost/7', hits + 1);
    // Cancelling the sub-run ends the one below it too: both hand-offs close with the call in flight.
    expect((await h.client.post(`/runs/${sub}/cancel`, { token: operator, body: { reason: 'enough' } })).status).toBe(
      200,
    );
    expect(await allowance(root, ROOT)).toMatchObject({ spent_units: 4, reserved_units: 1 });
    backend.openGate();
    await running;
    expect(await allowance(root, ROOT)).toMatchObject({ spent_units: 11, reserved_units: 0 });
    expect(await allowance(sub, SUB)).toMatchObject({ spent_units: 9, reserved_units: 0 });
  });

  it.skipIf(!hasPostgresServer)(
    'stopped while its call is being admitted sends nothing: the hand-off closed without it, so nothing could charge the parent (needs a PostgreSQL server)',
    async () => {
      // Its own agent's budget counter, held by another client, keeps the call between its claim of
      // the run and its reservation while an operator cancels the sub-run and its hand-off closes.
      const courierBudget = await courierBudgetWithCounter();
      const root = await openRoot(100);
      const before = (await allowance(root, ROOT)).spent_units as number;
      const sub = (
        await handoff(ROOT, root, { sub_agent_id: COURIER, budget_units: 5, delegable_tool_ids: ['courier.fetch'] })
      ).body.sub_run_id as string;
      const counters = new pg.Client({ connectionString: h.db.url });
      const watcher = new pg.Client({ connectionString: h.db.url });
      await Promise.all([counters.connect(), watcher.connect()]);
      try {
        await counters.query('begin');
        await counters.query('select * from budget_counters where counter_key = $1 for update', [courierBudget.id]);
        const running = execute(h.client, as(COURIER), {
          run_id: sub,
          parent_run_id: root,
          plan: [step('courier.fetch', 'admitted while cancelled')],
        });
        await until('the call to wait for the counter', async () => (await lockWaits(watcher)) > 0);
        expect(
          (await h.client.post(`/runs/${sub}/cancel`, { token: operator, body: { reason: 'enough' } })).status,
        ).toBe(200);
        await counters.query('commit');
        const res = await running;
        expect(res.body.status).toBe('cancelled');
        expect(hitsOf(sub)).toEqual([]);
        const reservations = await watcher.query(
          'select status from budget_reservations where tenant_id = $1 and run_id = $2',
          [T, sub],
        );
        expect(reservations.rows.map((r) => r.status)).toEqual(['released']);
        expect(await allowance(sub, COURIER)).toMatchObject({ spent_units: 0, reserved_units: 0 });
        expect(await allowance(root, ROOT)).toMatchObject({ spent_units: before, reserved_units: 0 });
      } finally {
        await counters.query('rollback').catch(() => undefined);
        await Promise.all([counters.end(), watcher.end()]);
      }
    },
  );

  it.skipIf(!hasPostgresServer)(
    'reserving while a cancel is closing its hand-off sends nothing: the parent keeps what the call reserved, not less than it would cost (needs a PostgreSQL server)',
    async () => {
      // The call is kept at its reservation (its agent's budget counter held) until the cancel has
      // locked the sub-run and looked for its calls in flight, and is let go while the cancel waits
      // for the parent's counter (held too): its reservation lands between the two.
      const courierBudget = await courierBudgetWithCounter();
      const root = await openRoot(100);
      const before = (await allowance(root, ROOT)).spent_units as number;
      const sub = (
        await handoff(ROOT, root, { sub_agent_id: COURIER, budget_units: 5, delegable_tool_ids: ['courier.pricey'] })
      ).body.sub_run_id as string;
      const [agentCounter, parentCounter, watcher] = [1, 2, 3].map(() => new pg.Client({ connectionString: h.db.url }));
      await Promise.all([agentCounter!.connect(), parentCounter!.connect(), watcher!.connect()]);
      try {
        await agentCounter!.query('begin');
        await agentCounter!.query('select * from budget_counters where counter_key = $1 for update', [
          courierBudget.id,
        ]);
        const running = execute(h.client, as(COURIER), {
          run_id: sub,
          parent_run_id: root,
          plan: [step('courier.pricey', 'reserved mid-close')],
        });
        await until('the call to wait for its agent’s counter', async () => (await lockWaits(watcher!)) === 1);
        await parentCounter!.query('begin');
        await parentCounter!.query('select * from budget_counters where counter_key = $1 for update', [
          `run/${T}/${root}`,
        ]);
        const cancelled = h.client.post(`/runs/${sub}/cancel`, { token: operator, body: { reason: 'enough' } });
        await until('the cancel to wait for the parent’s counter', async () => (await lockWaits(watcher!)) === 2);
        await agentCounter!.query('commit');
        // The reservation commits; the call then waits for the cancel (or, read around it, is sent).
        await until(
          'the call to be sent or to wait',
          async () => hitsOf(sub).length > 0 || (await lockWaits(watcher!)) === 2,
        );
        await parentCounter!.query('commit');
        expect((await cancelled).status).toBe(200);
        expect((await running).body.status).toBe('cancelled');
        expect(hitsOf(sub)).toEqual([]);
        const reservations = await watcher!.query(
          'select status from budget_reservations where tenant_id = $1 and run_id = $2',
          [T, sub],
        );
        expect(reservations.rows.map((r) => r.status)).toEqual(['released']);
        // The close counted the reservation as used: the parent bears it, on the strict side.
        expect(await allowance(root, ROOT)).toMatchObject({ spent_units: before + 1, reserved_units: 0 });
      } finally {
        for (const client of [agentCounter, parentCounter]) await client!.query('rollback').catch(() => undefined);
        await Promise.all([agentCounter!.end(), parentCounter!.end(), watcher!.end()]);
      }
    },
  );

  it('is killed for an overshoot when resumed, if it was paused while the call that passed its budget was in flight', async () => {
    await registerTool(h.client, {
      id: 'slow.pricey.last',
      backendUrl: `${backend.url}/gate/cost/7`,
      cost_units: 1,
      allowed_agents: [ROOT, SUB],
    });
    for (const agentId of [ROOT, SUB])
      await grantTool(h.client, { tenant: T, agent: agentId, tool: 'slow.pricey.last' });
    const root = await openRoot(100);
    const sub = (await handoff(ROOT, root, { budget_units: 5, delegable_tool_ids: ['slow.pricey.last'] })).body
      .sub_run_id as string;
    const gateHits = backend.hitsOn('/gate/cost/7').length;
    // Its only call: nothing after it would meet the cost stage and notice the overshoot.
    const running = execute(h.client, as(SUB), {
      run_id: sub,
      parent_run_id: root,
      plan: [step('slow.pricey.last', 'reports 7')],
    });
    await backend.waitForHits('/gate/cost/7', gateHits + 1);
    expect((await h.client.post(`/runs/${sub}/pause`, { token: operator, body: {} })).status).toBe(200);
    backend.openGate();
    expect((await running).body.status).toBe('paused');
    expect(await auditOf({ run_id: sub, event_type: 'run.subagent_budget_exceeded' })).toEqual([]);

    const resumed = await h.client.post(`/runs/${sub}/resume`, { token: operator, body: {} });
    expect(resumed.status).toBe(402);
    expect(resumed.body).toMatchObject({ status: 'killed', warnings: ['subagent_budget_exceeded'] });
    expect(resumed.body.steps.map((s: { status: string }) => s.status)).toEqual(['completed']);
    const [overshoot, ...more] = await auditOf({ run_id: sub, event_type: 'run.subagent_budget_exceeded' });
    expect(more).toEqual([]);
    expect(overshoot!.details).toMatchObject({ used_units: 7, budget_units: 5, after_step: 0 });
    const [closed] = await auditOf({ run_id: sub, event_type: 'handoff.closed' });
    expect(closed).toMatchObject({ seq: overshoot!.seq + 1, status: 'killed' });
  });

  it('waits for an operator to approve its hand-off when the parent asks for it', async () => {
    const root = await openRoot();
    const created = await handoff(ROOT, root, { approval_requirement: 'operator' });
    expect(created.status).toBe(201);
    const sub = created.body.sub_run_id as string;
    expect(created.body.approval_id).toMatch(/^apr_/);
    expect((await h.client.get(`/runs/${sub}`, { token: as(SUB) })).body.status).toBe('awaiting_approval');
    const early = await execute(h.client, as(SUB), { run_id: sub, parent_run_id: root, plan: [step('search', 'x')] });
    expect(early.status).toBe(409);
    expect(early.body.error.code).toBe('run_not_resumable');

    const pending = await h.client.get('/approvals', {
      token: operator,
      query: { status: 'pending', kind: 'handoff', run_id: sub },
    });
    expect(pending.body.items).toEqual([
      expect.objectContaining({
        id: created.body.approval_id,
        handoff_id: created.body.id,
        proposed_by: `agent:${ROOT}`,
        agent_id: SUB,
      }),
    ]);
    // The proposal is on record, as a held call's is, in the hand-off's commit.
    const [requested, ...more] = await auditOf({ run_id: sub, event_type: 'approval.requested' });
    expect(more).toEqual([]);
    const [dispatched] = await auditOf({ run_id: sub, event_type: 'handoff.dispatched' });
    expect(requested).toMatchObject({
      actor: `agent:${ROOT}`,
      agent_id: SUB,
      status: 'awaiting_approval',
      seq: dispatched!.seq + 1,
      occurred_at: dispatched!.occurred_at,
      details: {
        approval_id: created.body.approval_id,
        handoff_id: created.body.id,
        proposed_by: `agent:${ROOT}`,
        expires_at: pending.body.items[0].expires_at,
        attribution: [
          { run_id: root, agent_id: ROOT },
          { run_id: sub, agent_id: SUB },
        ],
      },
    });
    expect(
      (
        await h.client.post(`/approvals/${created.body.approval_id}/approve`, {
          token: operator,
          body: { rationale: 'scope is fine' },
        })
      ).status,
    ).toBe(200);
    expect((await h.client.get(`/runs/${sub}`, { token: as(SUB) })).body.status).toBe('queued');
    expect(
      (await execute(h.client, as(SUB), { run_id: sub, parent_run_id: root, plan: [step('search', 'approved start')] }))
        .status,
    ).toBe(200);
  });
});

describe('a parent kept open', () => {
  it('stays running after its plan until its owner completes it; open sub-runs are cancelled then', async () => {
    const root = await openRoot(50);
    const created = await handoff(ROOT, root, { budget_units: 20 });
    const sub = created.body.sub_run_id as string;
    expect((await h.client.post(`/runs/${root}/complete`, { token: as(SUB), body: {} })).status).toBe(404);
    const done = await h.client.post(`/runs/${root}/complete`, { token: as(ROOT), body: {} });
    expect(done.status).toBe(200);
    expect(done.body.status).toBe('completed');
    expect((await h.client.get(`/runs/${sub}`, { token: as(SUB) })).body.status).toBe('cancelled');
    expect((await h.client.get(`/runs/${root}/handoffs`, { token: operator })).body.items[0]).toMatchObject({
      status: 'closed',
      spent_units: 0,
      returned_units: 20,
    });
    const [stopped] = await auditOf({ run_id: sub, event_type: 'run.stopped' });
    expect(stopped).toMatchObject({
      status: 'cancelled',
      reason_code: 'run_not_resumable',
      details: { cascade_depth: 1, via_run_id: root },
    });
    expect((await h.client.post(`/runs/${root}/complete`, { token: as(ROOT), body: {} })).status).toBe(409);
  });

  it.skipIf(!hasPostgresServer)(
    'ends with its parent even when the hand-off commits while the parent is ending (needs a PostgreSQL server)',
    async () => {
      // The parent's last call answers while a hand-off, holding the audit chain and the parent's
      // row, waits for the sub-run's id: the call's outcome record, which carries the parent's end,
      // waits for the chain. Once the hand-off commits, the record goes in, but the parent has a
      // sub-run now and does not end with it: it ends under the chain's lock, and takes the sub-run.
      await registerTool(h.client, {
        id: 'held',
        backendUrl: `${backend.url}/gate`,
        cost_units: 1,
        allowed_agents: [ROOT],
      });
      await grantTool(h.client, { tenant: T, agent: ROOT, tool: 'held' });
      const parent = newRunId('ending');
      const sub = newRunId('sub');
      const subRunId = new pg.Client({ connectionString: h.db.url });
      const watcher = new pg.Client({ connectionString: h.db.url });
      await Promise.all([subRunId.connect(), watcher.connect()]);
      try {
        const running = execute(h.client, as(ROOT), { run_id: parent, budget_units: 50, plan: [step('held', 'slow')] });
        await until('the parent’s call to reach its backend', () => hitsOf(parent).length === 1);
        // `subRunId` holds the sub-run's id: the hand-off, once it has locked the parent, waits for it.
        await subRunId.query('begin');
        await subRunId.query(
          `insert into runs (tenant_id, run_id, owner_agent_id, status, request_sha256) values ($1, $2, 'nobody', 'queued', null)`,
          [T, sub],
        );
        const subRunIdPid = (await subRunId.query('select pg_backend_pid() as pid')).rows[0].pid;
        const handedOff = handoff(ROOT, parent, { sub_run_id: sub, budget_units: 5 });
        let handOffPid = 0;
        await until('the hand-off to wait for the sub-run’s id', async () => {
          [handOffPid = 0] = await blockedBy(watcher, subRunIdPid);
          return handOffPid !== 0;
        });
        backend.openGate();
        // The outcome record (with the parent's end) waits for the hand-off.
        await until(
          'the outcome record to wait for the hand-off',
          async () => (await blockedBy(watcher, handOffPid)).length >= 1,
        );
        await subRunId.query('rollback');
        expect((await handedOff).status).toBe(201);
        const ended = await running;
        expect(ended.status).toBe(200);
        expect(ended.body.status).toBe('completed');
        expect((await h.client.get(`/runs/${sub}`, { token: as(SUB) })).body.status).toBe('cancelled');
        expect((await h.client.get(`/runs/${parent}/handoffs`, { token: operator })).body.items[0]).toMatchObject({
          status: 'closed',
          returned_units: 5,
        });
        const refused = await execute(h.client, as(SUB), {
          run_id: sub,
          parent_run_id: parent,
          plan: [step('search', 'too late')],
        });
        expect(refused.status).toBe(409);
        expect(hitsOf(sub)).toEqual([]);
        const [outcome] = await auditOf({ run_id: parent, event_type: 'run.step.completed' });
        expect(outcome).toMatchObject({ status: 'completed' });
      } finally {
        await Promise.all([subRunId.end(), watcher.end()]);
      }
    },
  );

  it('cannot be completed unless it was kept open', async () => {
    const runId = newRunId();
    const throttled = await execute(h.client, as(ROOT), { run_id: runId, plan: [step('search', 'x')] });
    expect(throttled.body.status).toBe('completed');
    expect((await h.client.post(`/runs/${runId}/complete`, { token: as(ROOT), body: {} })).status).toBe(409);
  });
});
