import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TestBackend } from './helpers/backend.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';
import { grantTool, newRunId, registerTool, toolBody } from './helpers/world.js';

/**
 * Tool schemas come from whoever wrote the contract: no schema may let a value hold the event
 * loop. Patterns run on a linear-time engine, `uniqueItems` is linear, and a validation that
 * branches without end is cut off and refused.
 */

const T = 'tenant-schema-bounds';
const AGENT = 'bounds.agent';
const agent = tokens.agent(AGENT, { tenant: T });

let h: Harness;
let backend: TestBackend;

const backtracking = '^(a+)+$';
// Three branches, each recursing through every item: exponential in the depth of a nested array.
const branchy = {
  $defs: {
    n: {
      anyOf: [
        { type: 'array', items: { $ref: '#/$defs/n' }, minItems: 2 },
        { type: 'array', items: { $ref: '#/$defs/n' }, maxItems: 0 },
        { type: 'array', items: { $ref: '#/$defs/n' }, contains: { type: 'string' } },
      ],
    },
  },
  type: 'object',
  properties: { q: { $ref: '#/$defs/n' } },
};
const open = { type: 'object', properties: { echo: {} } };

async function register(id: string, schemas: { input_schema?: unknown; output_schema?: unknown }): Promise<void> {
  await registerTool(h.client, { id, allowed_agents: [AGENT], backendUrl: `${backend.url}/echo`, ...schemas });
  await grantTool(h.client, { tenant: T, agent: AGENT, tool: id });
}

function call(tool: string, input: unknown) {
  return h.client.post('/runs/execute', {
    token: agent,
    body: { run_id: newRunId(), context: {}, plan: [{ tool_id: tool, input }] },
  });
}

beforeAll(async () => {
  h = await startHarness();
  backend = await new TestBackend().start();
  await register('bounds.input_pattern', {
    input_schema: { type: 'object', properties: { q: { type: 'string', pattern: backtracking } } },
    output_schema: open,
  });
  await register('bounds.output_pattern', {
    input_schema: { type: 'object', properties: { q: { type: 'string' } } },
    output_schema: {
      type: 'object',
      properties: { echo: { type: 'object', properties: { q: { type: 'string', pattern: backtracking } } } },
    },
  });
  await register('bounds.branchy', { input_schema: branchy, output_schema: open });
  await register('bounds.unique', {
    input_schema: { type: 'object', properties: { q: { type: 'array', uniqueItems: true } } },
    output_schema: open,
  });
});

afterAll(async () => {
  await backend?.close();
  await h?.close();
});

describe('a hostile schema cannot stall the gateway', () => {
  it('keeps /health answering while hostile inputs and a hostile backend answer are validated', async () => {
    let nested: unknown = 0;
    for (let depth = 0; depth < 60; depth += 1) nested = [nested];
    const hostile = 'a'.repeat(64) + '!';
    const dispatchedBefore = backend.hitsOn('/echo').length;
    const calls = Promise.all([
      call('bounds.input_pattern', { q: hostile }),
      call('bounds.output_pattern', { q: hostile }),
      call('bounds.branchy', { q: nested }),
      call('bounds.unique', { q: Array.from({ length: 10_000 }, (_, i) => ({ i, pad: 'x'.repeat(8) })) }),
    ]);
    const slowest = { ms: 0 };
    let settled = false;
    void calls.finally(() => (settled = true));
    while (!settled) {
      const started = performance.now();
      expect((await h.client.get('/health')).status).toBe(200);
      slowest.ms = Math.max(slowest.ms, performance.now() - started);
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    const [inputPattern, outputPattern, branching, unique] = await calls;

    // A backtracking engine took seconds for 33 characters, doubling with each one more.
    expect(slowest.ms).toBeLessThan(2_000);
    expect(inputPattern.status).toBe(422);
    expect(inputPattern.body.steps[0].error.code).toBe('tool_input_schema_invalid');
    expect(outputPattern.status).toBe(502);
    expect(outputPattern.body.steps[0].error.code).toBe('tool_output_schema_invalid');
    expect(branching.status).toBe(422);
    expect(branching.body.steps[0].error.details.errors).toEqual([
      { path: '/', message: expect.stringContaining('ms of CPU to check against the schema') },
    ]);
    expect(unique.status).toBe(200);
    // Only the call whose input passed reached a backend.
    expect(backend.hitsOn('/echo').length - dispatchedBefore).toBe(2);
  });

  it('still applies the patterns, uniqueItems and recursion it bounds', async () => {
    expect((await call('bounds.input_pattern', { q: 'aaaa' })).status).toBe(200);
    expect((await call('bounds.input_pattern', { q: 'aab' })).status).toBe(422);
    expect((await call('bounds.branchy', { q: [[], []] })).status).toBe(200);
    const duplicate = await call('bounds.unique', {
      q: [
        { a: 1, b: [2] },
        { b: [2], a: 1 },
      ],
    });
    expect(duplicate.status).toBe(422);
    expect(duplicate.body.steps[0].error.details.errors).toEqual([
      { path: '/q', message: 'must NOT have duplicate items' },
    ]);
    expect((await call('bounds.unique', { q: [1, '1', [1], { a: 1 }] })).status).toBe(200);
  });

  it('refuses at registration a pattern the linear engine cannot run, naming the field', async () => {
    for (const pattern of ['^(?=a)a$', '^(a)\\1$']) {
      const body = toolBody({
        id: 'bounds.lookaround',
        input_schema: { type: 'object', properties: { q: { type: 'string', pattern } } },
      });
      const res = await h.client.post('/tools', { token: tokens.platform(), body });
      expect(res.status, pattern).toBe(400);
      expect(res.body.error).toMatchObject({
        code: 'invalid_request',
        details: { issues: [{ field: 'body.input_schema', message: expect.stringContaining('RE2') }] },
      });
    }
  });

  it('exports the event loop lag', async () => {
    const metrics = await h.client.get('/metrics');
    expect(metrics.text).toMatch(/^nodejs_eventloop_lag_p99_seconds \d/m);
    expect(metrics.text).toMatch(/^nodejs_eventloop_lag_max_seconds \d/m);
  });
});
