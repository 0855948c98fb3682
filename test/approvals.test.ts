import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { payloadHash } from '../src/audit/audit-hash.js';
import { TestBackend } from './helpers/backend.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { ManualClock } from './helpers/manual-clock.js';
import { execute, step } from './helpers/runs.js';
import { tokens } from './helpers/tokens.js';
import { createBudget, grantTool, newRunId, registerTool } from './helpers/world.js';

// SPEC §6 step 8: a tool that requires approval runs only what an operator approved.
const T = 'tenant-approvals';
const AGENT = 'veritas.drafter';
const agent = tokens.agent(AGENT, { tenant: T });
const operator = tokens.tenantOperator(T, 'alice');
const otherOperator = tokens.tenantOperator(T, 'bob');
const outsider = tokens.tenantOperator('tenant-elsewhere', 'mallory');

let h: Harness;
let backend: TestBackend;

const resume = (runId: string, token = agent) => h.client.post(`/runs/${runId}/resume`, { token, body: {} });
const approve = (id: string, token = operator, rationale = 'checked the draft') =>
  h.client.post(`/approvals/${id}/approve`, { token, body: { rationale } });
const hitsOf = (runId: string) => backend.hitsOfRun(runId).map((hit) => (hit.body as { q: string }).q);
const auditOf = async (runId: string) =>
  (
    await h.client.get('/audit', { token: operator, query: { run_id: runId, limit: 100 } })
  ).body.items.reverse() as Array<Record<string, any>>;

beforeAll(async () => {
  h = await startHarness();
  backend = await new TestBackend().start();
  const base = { allowed_agents: [AGENT], category: 'draft_write' };
  await registerTool(h.client, { id: 'plain', backendUrl: `${backend.url}/echo`, ...base, cost_units: 1 });
  await registerTool(h.client, { id: 'held', backendUrl: `${backend.url}/gate`, ...base, cost_units: 0 });
  for (const id of ['publish.draft', 'versioned.draft', 'revocable.draft', 'switchable.draft']) {
    await registerTool(h.client, {
      id,
      backendUrl: `${backend.url}/echo`,
      ...base,
      cost_units: 3,
      requires_approval: true,
      rate_limit: { capacity: 100, refill_per_second: 1 },
    });
  }
  // One token, refilled every ~17 minutes: a call held for approval must not take it.
  await registerTool(h.client, {
    id: 'scarce.draft',
    backendUrl: `${backend.url}/echo`,
    ...base,
    requires_approval: true,
    rate_limit: { capacity: 1, refill_per_second: 0.001 },
  });
  for (const tool of [
    'plain',
    'held',
    'publish.draft',
    'versioned.draft',
    'revocable.draft',
    'switchable.draft',
    'scarce.draft',
  ])
    await grantTool(h.client, { tenant: T, agent: AGENT, tool });
  await createBudget(h.client, { tenant: T, scope: 'agent', agent_id: AGENT, limit_units: 1000, warn_ratio: 1 });
});

afterAll(async () => {
  await backend?.close();
  await h?.close();
});

describe('a call that requires approval', () => {
  it('takes no rate-limit token while it waits', async () => {
    const runId = newRunId();
    const held = await execute(h.client, agent, { run_id: runId, plan: [step('scarce.draft', 'the only call')] });
    expect(held.status).toBe(202);
    await approve(held.body.steps[0].approval_id);
    const res = await resume(runId);
    expect(res.status).toBe(200);
    expect(hitsOf(runId)).toEqual(['the only call']);
  });

  it('holds the run (202) and dispatches and reserves nothing until approved', async () => {
    const runId = newRunId();
    const budgetBefore = (await h.client.get('/budgets', { token: operator })).body.items[0];
    const res = await execute(h.client, agent, {
      run_id: runId,
      plan: [step('plain', 'before'), step('publish.draft', 'publish me'), step('plain', 'after')],
    });
    expect(res.status).toBe(202);
    expect(res.body.status).toBe('awaiting_approval');
    expect(res.body.steps.map((s: { status: string }) => s.status)).toEqual([
      'completed',
      'awaiting_approval',
      'pending',
    ]);
    const approvalId = res.body.steps[1].approval_id as string;
    expect(approvalId).toMatch(/^apr_/);
    expect(hitsOf(runId)).toEqual(['before']);
    const budgetAfter = (await h.client.get('/budgets', { token: operator })).body.items[0];
    expect(budgetAfter.spent_units - budgetBefore.spent_units).toBe(1);
    expect(budgetAfter.reserved_units).toBe(0);

    const pending = await h.client.get('/approvals', { token: operator, query: { status: 'pending', run_id: runId } });
    expect(pending.status).toBe(200);
    expect(pending.body.items).toEqual([
      expect.objectContaining({
        id: approvalId,
        kind: 'tool_call',
        run_id: runId,
        agent_id: AGENT,
        step_index: 1,
        tool_id: 'publish.draft',
        tool_version: '1.0.0',
        input: { q: 'publish me' },
        input_sha256: payloadHash({ q: 'publish me' }),
        proposed_by: `agent:${AGENT}`,
        status: 'pending',
      }),
    ]);
    expect((await h.client.get(`/approvals/${approvalId}`, { token: operator })).body.input).toEqual({
      q: 'publish me',
    });
    expect((await h.client.get(`/runs/${runId}`, { token: agent })).body.status).toBe('awaiting_approval');

    const early = await resume(runId);
    expect(early.status).toBe(409);
    expect(early.body.error).toMatchObject({ code: 'run_not_resumable', details: { approval_status: 'pending' } });
    expect(hitsOf(runId)).toEqual(['before']);

    const requested = (await auditOf(runId)).find((e) => e.event_type === 'approval.requested');
    expect(requested).toMatchObject({
      status: 'awaiting_approval',
      tool_id: 'publish.draft',
      input_sha256: payloadHash({ q: 'publish me' }),
      details: { approval_id: approvalId },
    });
  });

  it('once approved, resumes with every stage again and dispatches exactly the approved input', async () => {
    const runId = newRunId();
    const held = await execute(h.client, agent, {
      run_id: runId,
      plan: [step('plain', 'one'), step('publish.draft', 'the approved text'), step('plain', 'three')],
    });
    const approvalId = held.body.steps[1].approval_id as string;
    const approved = await approve(approvalId);
    expect(approved.status).toBe(200);
    expect(approved.body).toMatchObject({
      status: 'approved',
      decided_by: 'operator:alice',
      rationale: 'checked the draft',
    });
    expect(hitsOf(runId)).toEqual(['one']);

    const res = await resume(runId);
    expect(res.status).toBe(200);
    expect(res.body.status).toBe('completed');
    expect(res.body.steps.map((s: { status: string }) => s.status)).toEqual(['completed', 'completed', 'completed']);
    expect(res.body.steps[1].output).toEqual({ echo: { q: 'the approved text' } });
    expect(hitsOf(runId)).toEqual(['one', 'the approved text', 'three']);

    const events = await auditOf(runId);
    expect(events.map((e) => e.event_type)).toEqual([
      'run.step.dispatching',
      'run.step.completed',
      'approval.requested',
      'approval.approved',
      'run.resumed',
      'run.step.dispatching',
      'run.step.completed',
      'run.step.dispatching',
      'run.step.completed',
    ]);
    expect(events[5]).toMatchObject({
      tool_id: 'publish.draft',
      input_sha256: payloadHash({ q: 'the approved text' }),
      details: { approval_id: approvalId },
    });
    // The approval is spent on this step: resuming again has nothing to resume.
    expect((await resume(runId)).status).toBe(409);
  });

  it('binds an approval to its exact input and tool version: anything else needs a new one', async () => {
    const first = newRunId();
    const held = await execute(h.client, agent, { run_id: first, plan: [step('versioned.draft', 'text A')] });
    await approve(held.body.steps[0].approval_id);
    // The same run id with another input is another request.
    const changed = await execute(h.client, agent, { run_id: first, plan: [step('versioned.draft', 'text B')] });
    expect(changed.status).toBe(409);
    expect(changed.body.error.code).toBe('run_id_conflict');
    // Another run with another input waits for its own approval.
    const second = newRunId();
    const other = await execute(h.client, agent, { run_id: second, plan: [step('versioned.draft', 'text B')] });
    expect(other.status).toBe(202);
    expect(other.body.steps[0].approval_id).not.toBe(held.body.steps[0].approval_id);

    // A newer version registered meanwhile is not what was approved: the resume proposes again.
    await registerTool(h.client, {
      id: 'versioned.draft',
      version: '1.1.0',
      backendUrl: `${backend.url}/echo`,
      allowed_agents: [AGENT],
      category: 'draft_write',
      requires_approval: true,
    });
    const again = await resume(first);
    expect(again.status).toBe(202);
    expect(again.body.steps[0]).toMatchObject({ status: 'awaiting_approval', version: '1.1.0' });
    expect(again.body.steps[0].approval_id).not.toBe(held.body.steps[0].approval_id);
    expect(hitsOf(first)).toEqual([]);
    const proposals = await h.client.get('/approvals', { token: operator, query: { run_id: first } });
    expect(
      proposals.body.items.map((a: { tool_version: string; status: string }) => [a.tool_version, a.status]),
    ).toEqual([
      ['1.1.0', 'pending'],
      ['1.0.0', 'approved'],
    ]);
  });

  it('a rejection cancels the run, and nothing of it runs', async () => {
    const runId = newRunId();
    const held = await execute(h.client, agent, {
      run_id: runId,
      plan: [step('publish.draft', 'not this'), step('plain', 'nor this')],
    });
    const rejected = await h.client.post(`/approvals/${held.body.steps[0].approval_id}/reject`, {
      token: operator,
      body: { rationale: 'off-brand' },
    });
    expect(rejected.status).toBe(200);
    expect(rejected.body).toMatchObject({ status: 'rejected', rationale: 'off-brand' });
    const run = await h.client.get(`/runs/${runId}`, { token: agent });
    expect(run.body.status).toBe('cancelled');
    expect(run.body.steps.map((s: { status: string }) => s.status)).toEqual(['denied', 'skipped']);
    const res = await resume(runId);
    expect(res.status).toBe(409);
    expect(res.body.error.code).toBe('run_not_resumable');
    expect(hitsOf(runId)).toEqual([]);
    // A decided approval cannot be decided again.
    expect((await approve(held.body.steps[0].approval_id)).status).toBe(409);
  });

  it('needs a rationale, and is a matter for operators of the tenant only', async () => {
    const runId = newRunId();
    const held = await execute(h.client, agent, { run_id: runId, plan: [step('publish.draft', 'guarded')] });
    const id = held.body.steps[0].approval_id as string;
    expect(
      (await h.client.post(`/approvals/${id}/approve`, { token: operator, body: { rationale: '   ' } })).status,
    ).toBe(400);
    expect((await h.client.post(`/approvals/${id}/approve`, { token: operator, body: {} })).status).toBe(400);

    for (const res of [
      await h.client.get('/approvals', { token: agent }),
      await h.client.post(`/approvals/${id}/approve`, { token: agent, body: { rationale: 'me' } }),
    ]) {
      expect(res.status).toBe(403);
      expect(res.body.error.code).toBe('agent_forbidden');
    }
    expect((await h.client.get(`/approvals/${id}`, { token: outsider })).status).toBe(404);
    expect(
      (await h.client.post(`/approvals/${id}/approve`, { token: outsider, body: { rationale: 'not mine' } })).status,
    ).toBe(404);
    expect((await h.client.get('/approvals', { token: outsider, query: { tenant_id: T } })).status).toBe(404);
    expect((await h.client.get('/approvals', { token: outsider })).body.items).toEqual([]);
    const attempts = await h.client.get('/audit', {
      token: tokens.platform(),
      query: { event_type: 'security.cross_tenant_attempt', limit: 500 },
    });
    const onThis = attempts.body.items.filter(
      (e: { details: { approval_id?: string } }) => e.details.approval_id === id,
    );
    expect(onThis.map((e: { tenant_id: string | null; details: object }) => [e.tenant_id, e.details])).toEqual([
      [null, { route: 'POST /approvals/{id}/approve', caller_tenant_id: 'tenant-elsewhere', approval_id: id }],
      [null, { route: 'GET /approvals/{id}', caller_tenant_id: 'tenant-elsewhere', approval_id: id }],
    ]);
    expect((await h.client.get(`/approvals/${id}`, { token: tokens.platform() })).status).toBe(200);
    expect((await h.client.get('/approvals/apr_nope', { token: operator })).status).toBe(404);
  });

  it('an operator cannot approve the proposal its own resume made on the agent’s behalf', async () => {
    const runId = newRunId();
    const gateHits = backend.hitsOn('/gate').length;
    const running = execute(h.client, agent, {
      run_id: runId,
      plan: [step('held', 'slow'), step('publish.draft', 'after the pause')],
    });
    await backend.waitForHits('/gate', gateHits + 1);
    const paused = await h.client.post(`/runs/${runId}/pause`, { token: operator, body: { reason: 'look first' } });
    expect(paused.status).toBe(200);
    expect(paused.body.status).toBe('paused');
    backend.openGate();
    const stopped = await running;
    expect(stopped.status).toBe(202);
    expect(stopped.body.status).toBe('paused');
    expect(stopped.body.steps.map((s: { status: string }) => s.status)).toEqual(['completed', 'pending']);

    // Only an operator resumes a paused run; the agent's attempt is an escalation attempt.
    const byAgent = await resume(runId);
    expect(byAgent.status).toBe(403);
    expect(byAgent.body.error.code).toBe('agent_forbidden');
    expect((await auditOf(runId)).filter((e) => e.event_type === 'security.escalation_attempt')).toHaveLength(1);
    const resumed = await resume(runId, operator);
    expect(resumed.status).toBe(202);
    const approvalId = resumed.body.steps[1].approval_id as string;
    expect((await h.client.get(`/approvals/${approvalId}`, { token: operator })).body.proposed_by).toBe(
      'operator:alice',
    );

    const self = await approve(approvalId, operator);
    expect(self.status).toBe(403);
    expect(self.body.error.code).toBe('forbidden');
    // The same person under another spelling of the id is still the proposer.
    const shouted = await approve(approvalId, tokens.tenantOperator(T, 'ALICE'));
    expect(shouted.status).toBe(403);
    expect(shouted.body.error.code).toBe('forbidden');
    const attempts = await h.client.get('/audit', {
      token: operator,
      query: { event_type: 'security.self_approval_attempt', run_id: runId },
    });
    expect(attempts.body.items).toHaveLength(2);

    expect((await approve(approvalId, otherOperator)).status).toBe(200);
    const done = await resume(runId);
    expect(done.status).toBe(200);
    expect(done.body.status).toBe('completed');
    expect(hitsOf(runId)).toEqual(['slow', 'after the pause']);
  });

  it('a run paused while it waits keeps its proposal: resumed, it waits for the same one, which any other operator may still approve', async () => {
    const runId = newRunId();
    const held = await execute(h.client, agent, {
      run_id: runId,
      plan: [step('publish.draft', 'paused while waiting'), step('plain', 'after')],
    });
    const approvalId = held.body.steps[0].approval_id as string;
    const paused = await h.client.post(`/runs/${runId}/pause`, { token: operator, body: {} });
    expect(paused.body.status).toBe('paused');
    expect(paused.body.steps[0]).toMatchObject({
      status: 'pending',
      approval_id: approvalId,
      audit_id: held.body.steps[0].audit_id,
    });

    const resumed = await resume(runId, operator);
    expect(resumed.status).toBe(202);
    expect(resumed.body.status).toBe('awaiting_approval');
    expect(resumed.body.steps.map((s: { status: string }) => s.status)).toEqual(['awaiting_approval', 'pending']);
    expect(resumed.body.steps[0]).toMatchObject({ approval_id: approvalId, audit_id: held.body.steps[0].audit_id });
    const proposals = await h.client.get('/approvals', { token: operator, query: { run_id: runId } });
    expect(
      proposals.body.items.map((a: { id: string; status: string; proposed_by: string }) => [
        a.id,
        a.status,
        a.proposed_by,
      ]),
    ).toEqual([[approvalId, 'pending', `agent:${AGENT}`]]);
    expect((await h.client.get(`/runs/${runId}`, { token: agent })).body.status).toBe('awaiting_approval');

    // The operator who paused and resumed it did not propose it: it may approve it.
    expect((await approve(approvalId, operator)).status).toBe(200);
    const done = await resume(runId);
    expect(done.status).toBe(200);
    expect(hitsOf(runId)).toEqual(['paused while waiting', 'after']);
  });

  it('a grant revoked while waiting makes the resume fail with grant_revoked, dispatching nothing', async () => {
    const grants = await h.client.get('/grants', {
      token: operator,
      query: { tool_id: 'revocable.draft', agent_id: AGENT },
    });
    const grantId = grants.body.items[0].id as string;
    const runId = newRunId();
    const held = await execute(h.client, agent, { run_id: runId, plan: [step('revocable.draft', 'risky')] });
    await approve(held.body.steps[0].approval_id);
    expect(
      (await h.client.post(`/grants/${grantId}/revoke`, { token: operator, body: { reason: 'agent misbehaved' } }))
        .status,
    ).toBe(200);

    const res = await resume(runId);
    expect(res.status).toBe(403);
    expect(res.body.error).toMatchObject({ code: 'grant_revoked', details: { grant_id: grantId, status: 'failed' } });
    expect(hitsOf(runId)).toEqual([]);
    const stopped = (await auditOf(runId)).find((e) => e.event_type === 'run.stopped');
    expect(stopped).toMatchObject({
      reason_code: 'grant_revoked',
      actor: 'operator:alice',
      details: { cascade_depth: 0, previous_status: 'awaiting_approval' },
    });
  });

  it('a kill switch armed while waiting stops the run; the resume says kill_switch_active', async () => {
    const runId = newRunId();
    const held = await execute(h.client, agent, { run_id: runId, plan: [step('switchable.draft', 'halt me')] });
    await approve(held.body.steps[0].approval_id);
    const armed = await h.client.post('/kill-switches', {
      token: operator,
      body: {
        scope: 'tool',
        target: 'switchable.draft',
        reason: 'incident',
        user_visible_status_copy: 'Drafting is paused',
      },
    });
    expect(armed.status).toBe(201);
    const res = await resume(runId);
    expect(res.status).toBe(403);
    expect(res.body.error).toMatchObject({ code: 'kill_switch_active', message: 'Drafting is paused' });
    expect(hitsOf(runId)).toEqual([]);
    await h.client.post(`/kill-switches/${armed.body.id}/disarm`, { token: operator, body: { reason: 'over' } });
  });

  it('shows the hold in a dry run, proposing nothing', async () => {
    const runId = newRunId();
    const res = await execute(h.client, agent, {
      run_id: runId,
      dry_run: true,
      plan: [step('plain', 'a'), step('publish.draft', 'b')],
    });
    expect(res.status).toBe(200);
    expect(res.body.status).toBe('awaiting_approval');
    expect(res.body.steps[1]).toMatchObject({ status: 'awaiting_approval' });
    expect(res.body.steps[1].verdicts.at(-1)).toEqual({ stage: 'approval', ok: false, code: 'awaiting_approval' });
    expect((await h.client.get('/approvals', { token: operator, query: { run_id: runId } })).body.items).toEqual([]);
  });

  it('replays a waiting run to its owner’s identical resubmission', async () => {
    const runId = newRunId();
    const body = { run_id: runId, plan: [step('publish.draft', 'same')] };
    const first = await execute(h.client, agent, body);
    const second = await execute(h.client, agent, body);
    expect(second.status).toBe(202);
    expect(second.headers['x-toolgate-replayed']).toBe('true');
    expect(second.body).toEqual(first.body);
    expect((await h.client.get('/approvals', { token: operator, query: { run_id: runId } })).body.items).toHaveLength(
      1,
    );
  });
});

describe('approvals expire', () => {
  const clock = new ManualClock(new Date());
  const TTL_MS = 3600_000;
  const SUB = 'veritas.checker';
  let x: Harness;
  let echo: TestBackend;

  beforeAll(async () => {
    x = await startHarness({ TOOLGATE_APPROVAL_TTL_SECONDS: '3600' }, { now: clock.now });
    echo = await new TestBackend().start();
    const base = { backendUrl: `${echo.url}/echo`, allowed_agents: [AGENT, SUB], category: 'draft_write' };
    await registerTool(x.client, { id: 'publish.draft', ...base, requires_approval: true });
    // One token, refilled far slower than approvals expire.
    await registerTool(x.client, {
      id: 'scarce.draft',
      ...base,
      requires_approval: true,
      rate_limit: { capacity: 1, refill_per_second: 0.0001 },
    });
    await registerTool(x.client, { id: 'search', ...base });
    const expires_at = new Date(Date.now() + 30 * 86_400_000).toISOString();
    for (const tool of ['publish.draft', 'scarce.draft', 'search'])
      await grantTool(x.client, { tenant: T, agent: AGENT, tool, expires_at });
    await grantTool(x.client, { tenant: T, agent: SUB, tool: 'search', expires_at });
  });
  afterAll(async () => {
    await echo?.close();
    await x?.close();
  });

  /** A root kept open, and a sub-run handed off from it that waits for an operator to approve the hand-off. */
  const handoffAwaitingApproval = async () => {
    const root = newRunId('root');
    const started = await x.client.post('/runs/execute', {
      token: agent,
      body: { run_id: root, keep_open: true, budget_units: 10, context: {}, plan: [step('search', 'root')] },
    });
    expect(started.body.status).toBe('running');
    const sub = newRunId('sub');
    const created = await x.client.post(`/runs/${root}/handoffs`, {
      token: agent,
      body: {
        sub_agent_id: SUB,
        sub_run_id: sub,
        budget_units: 5,
        delegable_tool_ids: ['search'],
        max_fanout: 0,
        approval_requirement: 'operator',
      },
    });
    expect(created.status).toBe(201);
    return { root, sub, approvalId: created.body.approval_id as string };
  };

  const held = async (toolId = 'publish.draft') => {
    const runId = newRunId();
    const res = await x.client.post('/runs/execute', {
      token: agent,
      body: { run_id: runId, context: {}, plan: [step(toolId, 'stale')] },
    });
    expect(res.status).toBe(202);
    return { runId, approvalId: res.body.steps[0].approval_id as string };
  };
  const decide = (id: string, verdict: 'approve' | 'reject', token = operator) =>
    x.client.post(`/approvals/${id}/${verdict}`, { token, body: { rationale: 'looked at it' } });
  const statusOfApproval = async (id: string) =>
    (await x.client.get(`/approvals/${id}`, { token: operator })).body.status as string;
  const listed = async (runId: string, status?: string) =>
    (
      await x.client.get('/approvals', { token: operator, query: { run_id: runId, ...(status ? { status } : {}) } })
    ).body.items.map((a: { id: string; status: string }) => [a.id, a.status]);
  const runStatus = async (runId: string) =>
    (await x.client.get(`/runs/${runId}`, { token: agent })).body.status as string;
  /** The answer to going on with an approval that lapsed: 409, naming it as expired. */
  const expectLapsed = (res: { status: number; body: any }, approvalId: string) => {
    expect(res.status).toBe(409);
    expect(res.body.error).toMatchObject({
      code: 'run_not_resumable',
      details: { approval_id: approvalId, approval_status: 'expired' },
    });
  };
  const expiries = async (runId: string) =>
    (await x.client.get('/audit', { token: operator, query: { run_id: runId, event_type: 'approval.expired' } })).body
      .items as Array<Record<string, any>>;

  it('a proposal nobody decided in time cannot be approved, and its run is cancelled', async () => {
    const { runId, approvalId } = await held();
    clock.advance(3600_000 + 1);
    expect(
      (await x.client.get('/approvals', { token: operator, query: { status: 'pending', run_id: runId } })).body.items,
    ).toEqual([]);
    expect(
      (await x.client.get('/approvals', { token: operator, query: { status: 'expired', run_id: runId } })).body.items,
    ).toHaveLength(1);
    const res = await x.client.post(`/approvals/${approvalId}/approve`, {
      token: operator,
      body: { rationale: 'too late' },
    });
    expect(res.status).toBe(409);
    expect(res.body.error.details).toMatchObject({ approval_status: 'expired' });
    expect((await x.client.get(`/runs/${runId}`, { token: agent })).body.status).toBe('cancelled');
    expect((await x.client.get(`/approvals/${approvalId}`, { token: operator })).body.status).toBe('expired');
  });

  it('an approval not used in time lapses too: the resume cancels the run', async () => {
    const { runId, approvalId } = await held();
    expect(
      (await x.client.post(`/approvals/${approvalId}/approve`, { token: operator, body: { rationale: 'fine' } }))
        .status,
    ).toBe(200);
    clock.advance(3600_000 + 1);
    const res = await x.client.post(`/runs/${runId}/resume`, { token: agent, body: {} });
    expect(res.status).toBe(409);
    expect(res.body.error.details).toMatchObject({ approval_status: 'expired' });
    expect((await x.client.get(`/runs/${runId}`, { token: agent })).body.status).toBe('cancelled');
    expect(echo.hits).toEqual([]);
  });

  it('an approval nobody used in time reads expired, and the next decision records it and cancels its run', async () => {
    const { runId, approvalId } = await held();
    expect((await decide(approvalId, 'approve')).status).toBe(200);
    clock.advance(TTL_MS + 1);
    expect(await statusOfApproval(approvalId)).toBe('expired');
    expect(await listed(runId)).toEqual([[approvalId, 'expired']]);
    expect(await listed(runId, 'expired')).toEqual([[approvalId, 'expired']]);
    expect(await listed(runId, 'approved')).toEqual([]);

    const res = await decide(approvalId, 'reject', otherOperator);
    expect(res.status).toBe(409);
    expect(res.body.error).toMatchObject({ code: 'run_not_resumable', details: { approval_status: 'expired' } });
    expect(await runStatus(runId)).toBe('cancelled');
    expect(await expiries(runId)).toEqual([
      expect.objectContaining({
        actor: 'system.expiry',
        details: expect.objectContaining({ approval_id: approvalId, noticed_by: 'operator:bob' }),
      }),
    ]);
    expect(await statusOfApproval(approvalId)).toBe('expired');
  });

  it('an approval that was used stays approved after its time', async () => {
    const { runId, approvalId } = await held();
    expect((await decide(approvalId, 'approve')).status).toBe(200);
    expect((await x.client.post(`/runs/${runId}/resume`, { token: agent, body: {} })).status).toBe(200);
    clock.advance(TTL_MS + 1);
    expect(await statusOfApproval(approvalId)).toBe('approved');
    expect(await listed(runId)).toEqual([[approvalId, 'approved']]);
    expect(await listed(runId, 'approved')).toEqual([[approvalId, 'approved']]);
    expect(await listed(runId, 'expired')).toEqual([]);
    const res = await decide(approvalId, 'reject');
    expect(res.status).toBe(409);
    expect(res.body.error.details).toMatchObject({ approval_status: 'approved' });
    expect(await runStatus(runId)).toBe('completed');
    expect(await expiries(runId)).toEqual([]);
  });

  it('a proposal that lapsed while its run was paused expires on resume, instead of being proposed again', async () => {
    const { runId, approvalId } = await held();
    expect((await x.client.post(`/runs/${runId}/pause`, { token: operator, body: {} })).body.status).toBe('paused');
    clock.advance(TTL_MS + 1);
    const res = await x.client.post(`/runs/${runId}/resume`, { token: otherOperator, body: {} });
    expectLapsed(res, approvalId);
    expect(await runStatus(runId)).toBe('cancelled');
    expect(await listed(runId)).toEqual([[approvalId, 'expired']]);
    expect(await expiries(runId)).toHaveLength(1);
  });

  it('an approval unused while its run was paused, or throttled, expires on resume', async () => {
    const paused = await held();
    expect((await decide(paused.approvalId, 'approve')).status).toBe(200);
    expect((await x.client.post(`/runs/${paused.runId}/pause`, { token: operator, body: {} })).body.status).toBe(
      'paused',
    );

    // The first call takes the only token; the second, approved, is throttled before dispatch.
    const first = await held('scarce.draft');
    await decide(first.approvalId, 'approve');
    expect((await x.client.post(`/runs/${first.runId}/resume`, { token: agent, body: {} })).status).toBe(200);
    const throttled = await held('scarce.draft');
    await decide(throttled.approvalId, 'approve');
    expect((await x.client.post(`/runs/${throttled.runId}/resume`, { token: agent, body: {} })).body.status).toBe(
      'throttled',
    );

    clock.advance(TTL_MS + 1);
    for (const [{ runId, approvalId }, token] of [
      [paused, otherOperator],
      [throttled, agent],
    ] as const) {
      const res = await x.client.post(`/runs/${runId}/resume`, { token, body: {} });
      expectLapsed(res, approvalId);
      expect(await runStatus(runId)).toBe('cancelled');
      expect(await listed(runId)).toEqual([[approvalId, 'expired']]);
      expect(await expiries(runId)).toHaveLength(1);
    }
    expect(
      echo.hits.filter((hit) => [paused.runId, throttled.runId].includes(hit.headers['x-toolgate-run-id'] as string)),
    ).toEqual([]);
  });

  it('an approval unused while its run was throttled expires on its owner’s resubmission too, instead of being proposed again', async () => {
    const first = await held('scarce.draft');
    await decide(first.approvalId, 'approve');
    await x.client.post(`/runs/${first.runId}/resume`, { token: agent, body: {} });
    const throttled = await held('scarce.draft');
    await decide(throttled.approvalId, 'approve');
    expect((await x.client.post(`/runs/${throttled.runId}/resume`, { token: agent, body: {} })).body.status).toBe(
      'throttled',
    );

    clock.advance(TTL_MS + 1);
    // The identical request, resubmitted after Retry-After: it resumes the throttled run.
    const res = await x.client.post('/runs/execute', {
      token: agent,
      body: { run_id: throttled.runId, context: {}, plan: [step('scarce.draft', 'stale')] },
    });
    expectLapsed(res, throttled.approvalId);
    expect(await runStatus(throttled.runId)).toBe('cancelled');
    expect(await listed(throttled.runId)).toEqual([[throttled.approvalId, 'expired']]);
    expect(await expiries(throttled.runId)).toEqual([
      expect.objectContaining({
        details: expect.objectContaining({ approval_id: throttled.approvalId, noticed_by: `agent:${AGENT}` }),
      }),
    ]);
    expect(echo.hitsOfRun(throttled.runId)).toEqual([]);
  });

  it('a hand-off proposal that lapsed expires on a resume of its waiting sub-run, as on a decision', async () => {
    const { sub, approvalId } = await handoffAwaitingApproval();
    const early = await x.client.post(`/runs/${sub}/resume`, { token: operator, body: {} });
    expect(early.body.error).toMatchObject({
      code: 'run_not_resumable',
      details: { reason: 'handoff_awaiting_approval' },
    });
    clock.advance(TTL_MS + 1);

    const res = await x.client.post(`/runs/${sub}/resume`, { token: operator, body: {} });
    expectLapsed(res, approvalId);
    expect(await statusOfApproval(approvalId)).toBe('expired');
    expect(await expiries(sub)).toHaveLength(1);
    expect((await x.client.get(`/runs/${sub}`, { token: operator })).body.status).toBe('cancelled');
  });

  it('a hand-off proposal that lapsed expires when its sub-agent tries to start the sub-run, as on a resume', async () => {
    const { root, sub, approvalId } = await handoffAwaitingApproval();
    const start = () =>
      x.client.post('/runs/execute', {
        token: tokens.agent(SUB, { tenant: T }),
        body: { run_id: sub, parent_run_id: root, context: {}, plan: [step('search', 'sub')] },
      });
    const early = await start();
    expect(early.status).toBe(409);
    expect(early.body.error.details).toEqual({ status: 'awaiting_approval' });
    clock.advance(TTL_MS + 1);

    const res = await start();
    expectLapsed(res, approvalId);
    expect(await statusOfApproval(approvalId)).toBe('expired');
    expect(await expiries(sub)).toEqual([
      expect.objectContaining({
        details: expect.objectContaining({ approval_id: approvalId, noticed_by: `agent:${SUB}` }),
      }),
    ]);
    expect((await x.client.get(`/runs/${sub}`, { token: operator })).body.status).toBe('cancelled');
    expect(echo.hitsOfRun(sub)).toEqual([]);
  });

  it('a hand-off proposal that lapsed while its sub-run was paused expires on resume: the sub-run never starts', async () => {
    const { root, sub, approvalId } = await handoffAwaitingApproval();
    expect((await x.client.post(`/runs/${sub}/pause`, { token: operator, body: {} })).body.status).toBe('paused');
    clock.advance(TTL_MS + 1);

    const res = await x.client.post(`/runs/${sub}/resume`, { token: operator, body: {} });
    expectLapsed(res, approvalId);
    expect(await statusOfApproval(approvalId)).toBe('expired');
    expect(await expiries(sub)).toHaveLength(1);
    const start = await x.client.post('/runs/execute', {
      token: tokens.agent(SUB, { tenant: T }),
      body: { run_id: sub, parent_run_id: root, context: {}, plan: [step('search', 'unapproved')] },
    });
    expect(start.status).toBe(409);
    expect(echo.hitsOfRun(sub)).toEqual([]);
  });
});
