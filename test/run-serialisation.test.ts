import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { payloadHash } from '../src/audit/audit-hash.js';
import { TestBackend } from './helpers/backend.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { execute, step } from './helpers/runs.js';
import { tokens } from './helpers/tokens.js';
import { grantTool, newRunId, registerTool } from './helpers/world.js';

/** What a run stores of its request and envelope, each serialised once: docs/design/call-path.md#serialised-once. */

const T = 'tenant-run-serialisation';
const AGENT = 'veritas.fact-checker';
const agent = tokens.agent(AGENT, { tenant: T, family: 'veritas', scope: 'scf:read' });
const operator = tokens.tenantOperator(T);

let h: Harness;
let backend: TestBackend;

/** The run's row as stored: its request and envelope as JSON values, and the transaction that last wrote it. */
const rowOf = async (runId: string) =>
  (
    await sql<{
      status: string;
      busy: boolean;
      request: unknown;
      request_sha256: string;
      envelope: unknown;
      xid: string;
    }>`
      select status, busy, request, request_sha256, envelope, xmin::text as xid from runs
      where tenant_id = ${T} and run_id = ${runId}`.execute(h.db.database.control)
  ).rows[0]!;

const resume = (runId: string) => h.client.post(`/runs/${runId}/resume`, { token: operator, body: {} });

beforeAll(async () => {
  h = await startHarness();
  backend = await new TestBackend().start();
  const base = { allowed_agents: [AGENT], input_schema: { type: 'object' } };
  await registerTool(h.client, { id: 'echo', backendUrl: `${backend.url}/echo`, ...base });
  await registerTool(h.client, { id: 'gated', backendUrl: `${backend.url}/gate`, ...base });
  await registerTool(h.client, { id: 'fails', backendUrl: `${backend.url}/status/500`, ...base });
  await registerTool(h.client, { id: 'wrong.shape', backendUrl: `${backend.url}/wrong-shape`, ...base });
  await registerTool(h.client, { id: 'ungranted', backendUrl: `${backend.url}/echo`, ...base });
  await registerTool(h.client, {
    id: 'publish.draft',
    backendUrl: `${backend.url}/echo`,
    ...base,
    category: 'draft_write',
    requires_approval: true,
  });
  for (const tool of ['echo', 'gated', 'fails', 'wrong.shape', 'publish.draft'])
    await grantTool(h.client, { tenant: T, agent: AGENT, tool });
});

afterAll(async () => {
  await backend?.close();
  await h?.close();
});

describe('the request', () => {
  it('is stored as it was hashed while its run may go on: a run paused mid-call resumes from it, and drops it at its end', async () => {
    const runId = newRunId();
    // Keys out of order at every level: the row holds the same value, and the hash is over its canonical JSON.
    const body = {
      run_id: runId,
      context: { zone: 'b', assessment: { year: 2026, area: 'a' } },
      plan: [{ tool_id: 'gated', input: { q: 'slow', b: { z: 1, a: [2, 1] } } }],
    };
    const gateHits = backend.hitsOn('/gate').length;
    const running = execute(h.client, agent, body);
    await backend.waitForHits('/gate', gateHits + 1);
    const busy = await rowOf(runId);
    expect(busy).toMatchObject({ status: 'running', busy: true, request: body, request_sha256: payloadHash(body) });

    // A run of one call can still be paused while that call is out: it is resumed from its stored request.
    expect((await h.client.post(`/runs/${runId}/pause`, { token: operator, body: {} })).body.status).toBe('paused');
    backend.openGate();
    const paused = await running;
    expect(paused.status).toBe(202);
    expect(paused.body.steps.map((s: { status: string }) => s.status)).toEqual(['completed']);
    expect((await rowOf(runId)).request).toEqual(body);
    const resumed = await resume(runId);
    expect(resumed.status, JSON.stringify(resumed.body)).toBe(200);
    expect(resumed.body.status).toBe('completed');
    expect(await rowOf(runId)).toMatchObject({ status: 'completed', request: null, request_sha256: payloadHash(body) });

    // The same request (its keys in another order) replays; another is a conflict.
    const reordered = { plan: body.plan, context: body.context, run_id: runId };
    expect((await execute(h.client, agent, reordered)).headers['x-toolgate-replayed']).toBe('true');
    expect((await execute(h.client, agent, { ...body, plan: [step('echo')] })).status).toBe(409);
  });

  it('is never stored for a run that cannot resume: one ended by its first call’s refusal is created without it', async () => {
    const runId = newRunId();
    const res = await execute(h.client, agent, { run_id: runId, plan: [step('ungranted'), step('echo')] });
    expect(res.status).toBe(403);
    const [record] = (
      await sql<{ xid: string }>`select xmin::text as xid from audit_events
        where tenant_id = ${T} and run_id = ${runId}`.execute(h.db.database.control)
    ).rows;
    // Created by the refusal's own record, in one transaction: its row never held the request.
    expect(await rowOf(runId)).toMatchObject({ status: 'failed', busy: false, request: null, xid: record!.xid });
  });

  it('is kept by a run waiting for an approval, which resumes from it', async () => {
    const runId = newRunId();
    const body = { run_id: runId, context: {}, plan: [step('echo', 'one'), step('publish.draft', 'the text')] };
    const held = await execute(h.client, agent, body);
    expect(held.status).toBe(202);
    expect(await rowOf(runId)).toMatchObject({ status: 'awaiting_approval', busy: false, request: body });
    const approved = await h.client.post(`/approvals/${held.body.steps[1].approval_id}/approve`, {
      token: tokens.tenantOperator(T, 'alice'),
      body: { rationale: 'checked' },
    });
    expect(approved.status).toBe(200);
    const res = await resume(runId);
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.steps[1].output).toEqual({ echo: { q: 'the text' } });
    expect((await rowOf(runId)).request).toBeNull();
  });
});

describe('the envelope', () => {
  it('is written once: the first answer is byte for byte its replay, and the stored envelope is that answer', async () => {
    // Ended with its last record, refused at its start, left at rest open, held for an approval.
    for (const run of [
      { plan: [step('echo')] },
      { plan: [step('echo'), step('echo')] },
      { plan: [step('fails')] },
      { plan: [step('ungranted'), step('echo')] },
      { plan: [step('echo'), step('wrong.shape'), step('echo')] },
      { plan: [step('echo')], keep_open: true },
      { plan: [step('echo'), step('publish.draft'), step('echo')] },
    ]) {
      const body = { run_id: newRunId(), ...run };
      const first = await execute(h.client, agent, body);
      const replay = await execute(h.client, agent, body);
      expect(replay.headers['x-toolgate-replayed']).toBe('true');
      expect(first.headers['content-type']).toBe('application/json; charset=utf-8');
      expect(replay.headers['content-type']).toBe(first.headers['content-type']);
      expect(first.text).toBe(replay.text);
      expect((await rowOf(body.run_id)).envelope).toEqual(first.body);
    }
  });
});
