import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TestBackend } from './helpers/backend.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';
import { grantTool, newRunId, registerTool, toolBody } from './helpers/world.js';

/**
 * `Idempotency-Key` on the creating routes: a retry with the same key and request answers what the
 * first did and creates nothing; the same key with another request is 422; keys are the caller's.
 */

const T = 'tenant-idempotency';
const operator = tokens.tenantOperator(T, 'carol');
const ROOT = 'idem.root';
const SUB = 'idem.sub';

let h: Harness;
let backend: TestBackend;
let keyCounter = 0;
const newKey = () => `key-${process.pid}-${++keyCounter}`;
const inHours = (hours: number) => new Date(Date.now() + hours * 3600_000).toISOString();

function post(path: string, body: unknown, key: string | undefined, token = operator) {
  return h.client.post(path, { token, body, ...(key !== undefined ? { headers: { 'idempotency-key': key } } : {}) });
}

async function count(eventType: string): Promise<number> {
  const res = await h.client.get('/audit', { token: tokens.platform(), query: { event_type: eventType, limit: 500 } });
  return res.body.items.length;
}

beforeAll(async () => {
  h = await startHarness();
  backend = await new TestBackend().start();
  await registerTool(h.client, { id: 'idem.tool', allowed_agents: [ROOT, SUB], backendUrl: `${backend.url}/echo` });
});

afterAll(async () => {
  await backend?.close();
  await h?.close();
});

describe('Idempotency-Key', () => {
  const bodies: Array<[string, string, () => Record<string, unknown>, string]> = [
    [
      'POST /grants',
      '/grants',
      () => ({
        agent_id: `a${keyCounter}.agent`,
        tool_id: 'idem.tool',
        scope: 'per-tenant',
        expires_at: inHours(1),
        rationale: 'idempotency',
      }),
      'grant.created',
    ],
    [
      'POST /kill-switches',
      '/kill-switches',
      () => ({ scope: 'agent', target: `k${keyCounter}.agent`, reason: 'test', user_visible_status_copy: 'Paused' }),
      'kill_switch.armed',
    ],
    [
      'POST /budgets',
      '/budgets',
      () => ({
        scope: 'agent',
        agent_id: `b${keyCounter}.agent`,
        period: 'day',
        limit_units: 10,
        warn_ratio: 0.8,
        grace_units: 0,
      }),
      'budget.created',
    ],
  ];

  it.each(bodies)('%s: a retry answers the first answer and creates nothing', async (_name, path, body, eventType) => {
    const key = newKey();
    const request = body();
    const before = await count(eventType);
    const first = await post(path, request, key);
    expect(first.status, JSON.stringify(first.body)).toBe(201);
    const again = await post(path, request, key);
    expect(again.status).toBe(201);
    expect(again.body).toEqual(first.body);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(await count(eventType)).toBe(before + 1);
  });

  it.each(bodies)('%s: the same key with another request is 422 idempotency_key_reused', async (_name, path, body) => {
    const key = newKey();
    expect((await post(path, body(), key)).status).toBe(201);
    keyCounter += 1; // another subject: another request
    const other = await post(path, body(), key);
    expect(other.status).toBe(422);
    expect(other.body.error).toMatchObject({
      code: 'idempotency_key_reused',
      details: { field: 'header.idempotency-key' },
    });
  });

  it('POST /tools: a retry answers the first answer, another contract under the key is 422', async () => {
    const key = newKey();
    const body = toolBody({ id: 'idem.registered', backendUrl: `${backend.url}/echo` });
    const first = await post('/tools', body, key, tokens.platform());
    const again = await post('/tools', body, key, tokens.platform());
    expect([first.status, again.status]).toEqual([201, 201]);
    expect(again.body).toEqual(first.body);
    const other = await post('/tools', { ...body, version: '1.0.1' }, key, tokens.platform());
    expect(other.status).toBe(422);
    expect(other.body.error.code).toBe('idempotency_key_reused');
  });

  it('keeps keys apart per caller: another operator may use the same key for its own request', async () => {
    const key = newKey();
    const mine = await post(
      '/kill-switches',
      { scope: 'agent', target: 'mine.agent', reason: 'r', user_visible_status_copy: 'c' },
      key,
    );
    const theirs = await post(
      '/kill-switches',
      { scope: 'agent', target: 'theirs.agent', reason: 'r', user_visible_status_copy: 'c' },
      key,
      tokens.tenantOperator(T, 'dave'),
    );
    expect([mine.status, theirs.status]).toEqual([201, 201]);
    expect(theirs.body.id).not.toBe(mine.body.id);
  });

  it("keeps keys apart per role: a tenant-operator with a platform-operator's sub does not replay its answer", async () => {
    const key = newKey();
    // Platform-wide: a platform-operator may arm it, a tenant-operator may not.
    const body = {
      scope: 'tool',
      target: 'idem.nowhere',
      tenant_id: null,
      reason: 'r',
      user_visible_status_copy: 'c',
    };
    const platform = await post('/kill-switches', body, key, tokens.platform('same.sub', T));
    expect(platform.status).toBe(201);
    const tenantOperator = await post('/kill-switches', body, key, tokens.tenantOperator(T, 'same.sub'));
    expect(tenantOperator.status).toBe(403);
    expect(tenantOperator.headers['idempotent-replayed']).toBeUndefined();
    expect(tenantOperator.body.error.code).toBe('forbidden');
    // The platform-operator's retry is still answered what it was.
    const again = await post('/kill-switches', body, key, tokens.platform('same.sub', T));
    expect([again.status, again.headers['idempotent-replayed'], again.body.id]).toEqual([
      201,
      'true',
      platform.body.id,
    ]);
  });

  it('does not keep a refusal: a retry after fixing the cause runs again', async () => {
    const key = newKey();
    const body = {
      agent_id: 'late.agent',
      tool_id: 'idem.unknown',
      scope: 'per-tenant',
      expires_at: inHours(1),
      rationale: 'r',
    };
    const refused = await post('/grants', body, key);
    expect(refused.status).toBe(404);
    await registerTool(h.client, {
      id: 'idem.unknown',
      allowed_agents: ['late.agent'],
      backendUrl: `${backend.url}/echo`,
    });
    const granted = await post('/grants', body, key);
    expect(granted.status).toBe(201);
  });

  it('makes one object of concurrent requests under one key, each answered the same', async () => {
    const key = newKey();
    const body = { scope: 'agent', target: 'together.agent', reason: 'r', user_visible_status_copy: 'c' };
    const results = await Promise.all(Array.from({ length: 5 }, () => post('/kill-switches', body, key)));
    expect(results.map((r) => r.status)).toEqual([201, 201, 201, 201, 201]);
    expect(new Set(results.map((r) => r.body.id)).size).toBe(1);
  });

  it('refuses a malformed key with 400 naming the header', async () => {
    for (const key of ['', 'x'.repeat(256), 'caf\u00e9']) {
      const res = await h.client.post('/kill-switches', {
        token: operator,
        headers: { 'idempotency-key': key },
        body: { scope: 'agent', target: 'bad.key', reason: 'r', user_visible_status_copy: 'c' },
      });
      expect(res.status, JSON.stringify(key)).toBe(400);
      expect(res.body.error).toMatchObject({
        code: 'invalid_request',
        details: { issues: [{ field: 'header.idempotency-key' }] },
      });
    }
  });

  it('POST /runs/{run_id}/handoffs: a retry answers the first hand-off', async () => {
    await grantTool(h.client, { tenant: T, agent: ROOT, tool: 'idem.tool' });
    const root = tokens.agent(ROOT, { tenant: T });
    const runId = newRunId();
    const gate = backend.hitsOn('/echo').length;
    // A run that is still going: its step waits at the gate.
    await registerTool(h.client, { id: 'idem.gated', allowed_agents: [ROOT], backendUrl: `${backend.url}/gate` });
    await grantTool(h.client, { tenant: T, agent: ROOT, tool: 'idem.gated' });
    const running = h.client.post('/runs/execute', {
      token: root,
      body: { run_id: runId, context: {}, budget_units: 10, plan: [{ tool_id: 'idem.gated', input: { q: 'hold' } }] },
    });
    await backend.waitForHits('/gate', 1);
    const key = newKey();
    const body = {
      sub_agent_id: SUB,
      sub_run_id: newRunId('sub'),
      budget_units: 1,
      delegable_tool_ids: ['idem.tool'],
      max_fanout: 0,
    };
    const first = await post(`/runs/${runId}/handoffs`, body, key, root);
    expect(first.status, JSON.stringify(first.body)).toBe(201);
    const again = await post(`/runs/${runId}/handoffs`, body, key, root);
    expect([again.status, again.body]).toEqual([201, first.body]);
    backend.openGate();
    expect((await running).status).toBe(200);
    expect(backend.hitsOn('/echo').length).toBe(gate);
  });
});
