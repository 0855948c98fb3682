import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeCursor } from '../src/http/cursor.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';
import { grantTool, newRunId, registerTool, toolBody } from './helpers/world.js';

// Input no route could store or hash, and amounts or dates the API could not write back, are
// refused with 400 naming the field — never a 500, a generic database error, or stored garbage.
// A backend's answer that no record could hold is the backend's failure, not the caller's.
const T = 'tenant-hostile';
const AGENT = 'hostile.agent';
const agent = tokens.agent(AGENT, { tenant: T });
const operator = tokens.tenantOperator(T);
const platform = tokens.platform();

let h: Harness;
let raw: Server;
let rawUrl: string;
const deep = (levels: number) => '['.repeat(levels) + ']'.repeat(levels);

beforeAll(async () => {
  h = await startHarness();
  // A backend answering JSON text as given: what JSON allows but no record can hold.
  const answers: Record<string, string> = {
    '/nul': '{"echo":"a\\u0000b"}',
    '/surrogate': '{"echo":"\\ud800"}',
    '/nul-key': '{"echo":{"a\\u0000":1}}',
    '/deep': `{"echo":${deep(5000)}}`,
  };
  raw = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(answers[req.url ?? ''] ?? '{"echo":null}');
    });
  });
  await new Promise<void>((resolve) => raw.listen(0, '127.0.0.1', resolve));
  rawUrl = `http://127.0.0.1:${(raw.address() as AddressInfo).port}`;
  for (const path of Object.keys(answers)) {
    const id = `odd.${path.slice(1).replace('-', '_')}`;
    await registerTool(h.client, { id, backendUrl: `${rawUrl}${path}`, allowed_agents: [AGENT], cost_units: 1 });
    await grantTool(h.client, { tenant: T, agent: AGENT, tool: id });
  }
  await registerTool(h.client, { id: 'plain', backendUrl: `${rawUrl}/plain`, allowed_agents: [AGENT] });
  await grantTool(h.client, { tenant: T, agent: AGENT, tool: 'plain' });
});

afterAll(async () => {
  await new Promise<void>((resolve) => raw?.close(() => resolve()));
  await h?.close();
});

/** A raw request (JSON text as given), answered without the contract check. */
async function send(method: 'GET' | 'POST', url: string, token: string, payload?: string) {
  const res = await h.client.app.inject({
    method,
    url,
    headers: {
      authorization: `Bearer ${token}`,
      ...(payload !== undefined ? { 'content-type': 'application/json' } : {}),
    },
    ...(payload !== undefined ? { payload } : {}),
  });
  return { status: res.statusCode, body: JSON.parse(res.body) };
}

function expectInvalid(res: { status: number; body: any }, field: string) {
  expect(res.status, JSON.stringify(res.body)).toBe(400);
  expect(res.body.error.code).toBe('invalid_request');
  expect(res.body.error.details.issues.map((issue: { field: string }) => issue.field)).toContain(field);
}

describe('input no route can keep is refused, naming where it is', () => {
  it('refuses JSON nested deeper than 64 levels, in any body', async () => {
    const run = await send(
      'POST',
      '/runs/execute',
      agent,
      `{"run_id":"${newRunId()}","context":{},"plan":[{"tool_id":"plain","input":{"q":${deep(5000)}}}]}`,
    );
    expect(run.status).toBe(400);
    expect(run.body.error.message).toMatch(/^body\.plan\.0\.input\.q(\.0)+: nested deeper than 64 levels$/);
    const grant = await send(
      'POST',
      '/grants',
      operator,
      `{"agent_id":"${AGENT}","tool_id":"plain","scope":"per-tenant","rationale":"x","expires_at":"2099-01-01T00:00:00Z","capability_modifiers":{"x":${deep(100)}}}`,
    );
    expect(grant.status).toBe(400);
    expect(grant.body.error.message).toContain('nested deeper than 64 levels');
    // Sixty levels are still fine for a run's input.
    const fine = await send(
      'POST',
      '/runs/execute',
      agent,
      `{"run_id":"${newRunId()}","dry_run":true,"context":{"n":${deep(60)}},"plan":[{"tool_id":"plain","input":{"q":"ok"}}]}`,
    );
    expect(fine.status).toBe(200);
  });

  it('refuses a NUL character or a lone surrogate in a body, a key, a query or a path, and stores nothing', async () => {
    const before = await h.client.get('/grants', { token: operator });
    expectInvalid(
      await send(
        'POST',
        '/grants',
        operator,
        `{"agent_id":"${AGENT}","tool_id":"plain","scope":"per-tenant","rationale":"a\\u0000b","expires_at":"2099-01-01T00:00:00Z"}`,
      ),
      'body.rationale',
    );
    expectInvalid(
      await send(
        'POST',
        '/grants',
        operator,
        `{"agent_id":"${AGENT}","tool_id":"plain","scope":"per-tenant","rationale":"\\udc00 alone","expires_at":"2099-01-01T00:00:00Z"}`,
      ),
      'body.rationale',
    );
    expect((await h.client.get('/grants', { token: operator })).body.items).toHaveLength(before.body.items.length);
    expectInvalid(
      await send(
        'POST',
        '/runs/execute',
        agent,
        `{"run_id":"${newRunId()}","context":{"a\\u0000":1},"plan":[{"tool_id":"plain","input":{"q":"x"}}]}`,
      ),
      'body.context.a\\u0000',
    );
    expectInvalid(await send('GET', '/runs?agent_id=a%00b', operator), 'query.agent_id');
    expectInvalid(await send('GET', '/grants/grt_a%00b', operator), 'params.id');
  });

  it('refuses amounts that round to zero units, and dates the API could not write back', async () => {
    expectInvalid(
      await send(
        'POST',
        '/runs/execute',
        agent,
        `{"run_id":"${newRunId()}","context":{},"budget_units":1e-7,"plan":[{"tool_id":"plain","input":{"q":"x"}}]}`,
      ),
      'body.budget_units',
    );
    expectInvalid(
      await send('POST', '/tools', platform, JSON.stringify(toolBody({ id: 'almost.free', cost_units: 1e-9 }))),
      'body.cost_units',
    );
    expectInvalid(
      await send(
        'POST',
        '/tools',
        platform,
        JSON.stringify(toolBody({ id: 'slow.bucket', rate_limit: { capacity: 1, refill_per_second: 1e-300 } })),
      ),
      'body.rate_limit.refill_per_second',
    );
    expectInvalid(
      await send(
        'POST',
        '/grants',
        operator,
        `{"agent_id":"${AGENT}","tool_id":"plain","scope":"per-tenant","rationale":"x","expires_at":"9999-12-31T23:59:59-01:00"}`,
      ),
      'body.expires_at',
    );
    expectInvalid(
      await send(
        'POST',
        '/tools/plain/versions/1.0.0/deprecate',
        platform,
        '{"deprecated_at":"0000-01-01T00:00:00+01:00"}',
      ),
      'body.deprecated_at',
    );
    expectInvalid(await send('GET', '/tools/deprecations?within=P300000Y', platform), 'query.within');
    expect((await send('GET', '/tools/deprecations?within=P100Y', platform)).status).toBe(200);
  });

  it('refuses a kill switch that could match nothing', async () => {
    const arm = (body: Record<string, unknown>) =>
      send('POST', '/kill-switches', operator, JSON.stringify({ reason: 'r', user_visible_status_copy: 'c', ...body }));
    expectInvalid(await arm({ scope: 'agent', target: '*' }), 'body.target');
    expectInvalid(await arm({ scope: 'tool', target: 'Not.A.Tool' }), 'body.target');
    expect((await h.client.get('/kill-switches', { token: operator })).body.items).toEqual([]);
  });

  it('refuses a listing cursor it did not issue, naming the cursor', async () => {
    const forged = encodeCursor({ created_at: 'garbage', tenant_id: T, run_id: 'r' });
    const res = await send('GET', `/runs?cursor=${encodeURIComponent(forged)}`, operator);
    expect(res.status).toBe(400);
    expect(res.body.error).toMatchObject({ code: 'invalid_request', details: { field: 'query.cursor' } });
  });

  it('refuses a cursor that decodes to text no cursor it issued holds, before the database sees it', async () => {
    const at = '2024-01-01T00:00:00.000Z';
    const forgeries = {
      'a NUL character': encodeCursor([at, 'a\u0000b']),
      'a lone surrogate': encodeCursor([at, 'a\ud800']),
      'a NUL character in a key': encodeCursor({ created_at: at, id: 'a', 'x\u0000': 1 }),
      'JSON spelled otherwise': Buffer.from(` ${JSON.stringify([at, 'a'])}`).toString('base64url'),
    };
    for (const path of ['/grants', '/budgets', '/kill-switches', '/approvals']) {
      for (const [what, cursor] of Object.entries(forgeries)) {
        const res = await send('GET', `${path}?cursor=${encodeURIComponent(cursor)}`, operator);
        expect(res.status, `${path}, ${what}: ${JSON.stringify(res.body)}`).toBe(400);
        expect(res.body.error).toMatchObject({
          code: 'invalid_request',
          message: 'query.cursor: not a cursor this API issued',
          details: { field: 'query.cursor' },
        });
      }
    }
  });
});

describe('a backend answer no record can hold', () => {
  for (const [tool, what] of [
    ['odd.nul', 'a NUL character'],
    ['odd.surrogate', 'a lone surrogate'],
    ['odd.nul_key', 'a key with a NUL character'],
    ['odd.deep', 'JSON nested 5,000 levels deep'],
  ] as const) {
    it(`is the backend's failure (502, output withheld, audited, replayable): ${what}`, async () => {
      const runId = newRunId();
      const body = { run_id: runId, context: {}, plan: [{ tool_id: tool, input: { q: 'x' } }] };
      const res = await h.client.post('/runs/execute', { token: agent, body });
      expect(res.status, JSON.stringify(res.body)).toBe(502);
      expect(res.body.status).toBe('failed');
      expect(res.body.steps[0]).toMatchObject({
        status: 'failed',
        cost_units: 1,
        error: { code: 'tool_backend_failed', details: { reason: 'output_not_storable' } },
      });
      expect(res.body.steps[0].output).toBeUndefined();
      const outcome = (
        await h.client.get('/audit', { token: operator, query: { run_id: runId, event_type: 'run.step.failed' } })
      ).body.items;
      expect(outcome).toHaveLength(1);
      expect(outcome[0]).toMatchObject({ reason_code: 'tool_backend_failed', output_sha256: null });
      const again = await h.client.post('/runs/execute', { token: agent, body });
      expect(again.headers['x-toolgate-replayed']).toBe('true');
      expect(again.body).toEqual(res.body);
    });
  }
});
