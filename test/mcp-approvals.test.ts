import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TestBackend } from './helpers/backend.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { ManualClock } from './helpers/manual-clock.js';
import { tokens } from './helpers/tokens.js';
import { grantTool, newRunId, registerTool } from './helpers/world.js';

/**
 * Approvals bound to the exact call over MCP (SPEC §12.1): clients whose wrappers mint a fresh run
 * per call (LangChain, Vercel AI SDK) resume an approved call by making it again.
 */
const T = 'tenant-mcp-approvals';
const AGENT = 'mcp.approving-agent';
const OTHER = 'mcp.other-agent';
const TTL_SECONDS = 600;
const operator = tokens.tenantOperator(T);

let h: Harness;
let backend: TestBackend;
let base: string;
const clock = new ManualClock(new Date());

interface CallAnswer {
  isError: boolean;
  meta: { run_id: string; status: string; code?: string; approval_id?: string };
}

async function call(
  agent: string,
  args: Record<string, unknown>,
  options: { runId?: string; context?: Record<string, unknown> } = {},
): Promise<CallAnswer> {
  const res = await fetch(`${base}/mcp`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      authorization: `Bearer ${tokens.agent(agent, { tenant: T })}`,
      ...(options.context ? { 'toolgate-context': JSON.stringify(options.context) } : {}),
      ...(options.runId ? { 'toolgate-run-id': options.runId } : {}),
    },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'gated', arguments: args } }),
  });
  expect(res.status).toBe(200);
  const body = (await res.json()) as {
    result: { isError: boolean; _meta: { 'dev.toolgate/result': CallAnswer['meta'] } };
  };
  return { isError: body.result.isError, meta: body.result._meta['dev.toolgate/result'] };
}

async function approve(id: string): Promise<void> {
  const res = await h.client.post(`/approvals/${id}/approve`, {
    token: operator,
    body: { rationale: 'looks right' },
  });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
}

async function pendingCount(): Promise<number> {
  const res = await h.client.get('/approvals', { token: operator, query: { status: 'pending', limit: 100 } });
  return (res.body.items as unknown[]).length;
}

const hitsFor = (marker: string) => backend.hits.filter((hit) => JSON.stringify(hit.body).includes(marker)).length;

beforeAll(async () => {
  h = await startHarness({ TOOLGATE_APPROVAL_TTL_SECONDS: String(TTL_SECONDS) }, { now: clock.now });
  backend = await new TestBackend().start();
  await h.client.app.listen({ port: 0, host: '127.0.0.1' });
  base = `http://127.0.0.1:${(h.client.app.server.address() as { port: number }).port}`;
  await registerTool(h.client, {
    id: 'gated',
    backendUrl: `${backend.url}/echo`,
    requires_approval: true,
    risk_level: 'high',
    allowed_agents: [AGENT, OTHER],
  });
  for (const agent of [AGENT, OTHER]) await grantTool(h.client, { tenant: T, agent, tool: 'gated' });
});

afterAll(async () => {
  await backend?.close();
  await h?.close();
});

describe('an approval bound to the exact call', () => {
  it('answers an identical call while pending with the same approval, and opens no other', async () => {
    const first = await call(AGENT, { q: 'same-pending' });
    expect(first).toMatchObject({ isError: true, meta: { code: 'awaiting_approval' } });
    const before = await pendingCount();
    const again = await call(AGENT, { q: 'same-pending' });
    const withRunId = await call(AGENT, { q: 'same-pending' }, { runId: newRunId('other') });
    expect(again.meta).toEqual(first.meta);
    expect(withRunId.meta).toMatchObject({ approval_id: first.meta.approval_id, run_id: first.meta.run_id });
    expect(await pendingCount()).toBe(before);
  });

  it('opens a new approval for a different input, context or agent', async () => {
    const first = await call(AGENT, { q: 'distinct' });
    const otherInput = await call(AGENT, { q: 'distinct-2' });
    const otherContext = await call(AGENT, { q: 'distinct' }, { context: { ticket: 'T-1' } });
    const otherAgent = await call(OTHER, { q: 'distinct' });
    const ids = [first, otherInput, otherContext, otherAgent].map((answer) => answer.meta.approval_id);
    expect(ids.every((id) => /^apr_/.test(id ?? ''))).toBe(true);
    expect(new Set(ids).size).toBe(4);
  });

  it('once approved, runs the next identical call, whatever its run id, exactly once', async () => {
    const held = await call(AGENT, { q: 'approved-once' }, { context: { ticket: 'T-2' } });
    // Another agent's identical call is not the approved one.
    const othersHeld = await call(OTHER, { q: 'approved-once' }, { context: { ticket: 'T-2' } });
    await approve(held.meta.approval_id!);

    const ran = await call(AGENT, { q: 'approved-once' }, { runId: newRunId('fresh'), context: { ticket: 'T-2' } });
    expect(ran).toMatchObject({ isError: false, meta: { run_id: held.meta.run_id, status: 'completed' } });
    expect(hitsFor('approved-once')).toBe(1);

    const others = await call(OTHER, { q: 'approved-once' }, { context: { ticket: 'T-2' } });
    expect(others.meta).toMatchObject({ code: 'awaiting_approval', approval_id: othersHeld.meta.approval_id });

    // Used: the same call again needs an approval of its own.
    const next = await call(AGENT, { q: 'approved-once' }, { context: { ticket: 'T-2' } });
    expect(next.meta.code).toBe('awaiting_approval');
    expect(next.meta.approval_id).not.toBe(held.meta.approval_id);
    expect(hitsFor('approved-once')).toBe(1);
  });

  it('binds the approval to the context: a call with another context does not use it', async () => {
    const held = await call(AGENT, { q: 'context-bound' }, { context: { ticket: 'T-3' } });
    await approve(held.meta.approval_id!);
    const other = await call(AGENT, { q: 'context-bound' }, { context: { ticket: 'T-4' } });
    expect(other.meta.code).toBe('awaiting_approval');
    expect(hitsFor('context-bound')).toBe(0);
  });

  it('still resumes by the same run id, as before', async () => {
    const runId = newRunId('by-run');
    const held = await call(AGENT, { q: 'by-run-id' }, { runId });
    await approve(held.meta.approval_id!);
    const ran = await call(AGENT, { q: 'by-run-id' }, { runId });
    expect(ran).toMatchObject({ isError: false, meta: { run_id: runId, status: 'completed' } });
    expect(hitsFor('by-run-id')).toBe(1);
  });

  it('lets an approval past its lifetime go: the call is held anew, nothing runs', async () => {
    const held = await call(AGENT, { q: 'too-late' });
    await approve(held.meta.approval_id!);
    clock.advance((TTL_SECONDS + 1) * 1000);
    const late = await call(AGENT, { q: 'too-late' });
    expect(late.isError).toBe(true);
    expect(late.meta.approval_id).not.toBe(held.meta.approval_id);
    expect(hitsFor('too-late')).toBe(0);
  });
});
