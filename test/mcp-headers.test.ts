import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TestBackend } from './helpers/backend.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';
import { grantTool, newRunId, registerTool } from './helpers/world.js';

/**
 * What the MCP door reads from the HTTP request itself (SPEC §12.1): run fields in `Toolgate-*`
 * headers, browser origins (CORS, judged before the token), and the errors a client can act on.
 */
const T = 'tenant-mcp-headers';
const AGENT = 'mcp.header-agent';
const ALLOWED = 'https://app.example.com';
const agent = tokens.agent(AGENT, { tenant: T });

let h: Harness;
let backend: TestBackend;
let base: string;

interface RpcAnswer {
  status: number;
  headers: Headers;
  body: {
    result?: {
      isError?: boolean;
      content?: Array<{ text: string }>;
      structuredContent?: Record<string, unknown>;
      _meta?: Record<string, Record<string, unknown>>;
    };
    error?: { code: number; message: string };
    id?: unknown;
  };
}

async function rpc(
  method: string,
  params: Record<string, unknown>,
  headers: Record<string, string> = {},
  token: string | null = agent,
): Promise<RpcAnswer> {
  const res = await fetch(`${base}/mcp`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      ...(token ? { authorization: `Bearer ${token}` } : {}),
      ...headers,
    },
    body: JSON.stringify({ jsonrpc: '2.0', id: 7, method, params }),
  });
  return { status: res.status, headers: res.headers, body: (await res.json()) as RpcAnswer['body'] };
}

const call = (name: string, args: unknown, headers: Record<string, string> = {}, meta?: unknown) =>
  rpc('tools/call', { name, arguments: args, ...(meta ? { _meta: { 'dev.toolgate/run': meta } } : {}) }, headers);
const resultMeta = (answer: RpcAnswer) => answer.body.result?._meta?.['dev.toolgate/result'] ?? {};

beforeAll(async () => {
  h = await startHarness({ TOOLGATE_MCP_ALLOWED_ORIGINS: `${ALLOWED},http://localhost:5173` });
  backend = await new TestBackend().start();
  await h.client.app.listen({ port: 0, host: '127.0.0.1' });
  base = `http://127.0.0.1:${(h.client.app.server.address() as { port: number }).port}`;
  const echo = `${backend.url}/echo`;
  await registerTool(h.client, { id: 'echo', backendUrl: echo, allowed_agents: [AGENT] });
  await registerTool(h.client, {
    id: 'contextual',
    backendUrl: echo,
    allowed_agents: [AGENT],
    required_context: ['user_id', 'ticket'],
  });
  await registerTool(h.client, {
    id: 'loose',
    backendUrl: echo,
    allowed_agents: [AGENT],
    output_schema: { type: 'string' },
  });
  for (const tool of ['echo', 'contextual', 'loose']) await grantTool(h.client, { tenant: T, agent: AGENT, tool });
});

afterAll(async () => {
  await backend?.close();
  await h?.close();
});

describe('run fields in Toolgate-* headers', () => {
  it('carry the context a tool requires; without them the call is refused', async () => {
    const without = await call('contextual', { q: 'no context' });
    expect(without.body.result?.isError).toBe(true);
    expect(resultMeta(without).code).toBe('missing_required_context');

    const withHeaders = await call(
      'contextual',
      { q: 'header context' },
      {
        'toolgate-context': JSON.stringify({ user_id: 'u-1', ticket: 'T-9' }),
      },
    );
    expect(withHeaders.body.result).toMatchObject({
      isError: false,
      structuredContent: { echo: { q: 'header context' } },
    });
  });

  it('merge with _meta: the header context and _meta context join, _meta winning field by field', async () => {
    const runId = newRunId();
    const merged = await call(
      'contextual',
      { q: 'merged' },
      { 'toolgate-context': JSON.stringify({ user_id: 'from-header' }), 'toolgate-run-id': 'header-run-ignored' },
      { run_id: runId, context: { ticket: 'T-1' } },
    );
    // Both required keys arrived: one from each.
    expect(merged.body.result?.isError).toBe(false);
    expect(resultMeta(merged).run_id).toBe(runId);

    const foreign = JSON.stringify({ tenant_id: 'someone-else' });
    const metaWins = await call(
      'echo',
      { q: 'meta wins' },
      { 'toolgate-context': foreign },
      { context: { tenant_id: T } },
    );
    expect(metaWins.body.result?.isError).toBe(false);
    const headerLoses = await call(
      'echo',
      { q: 'header loses' },
      { 'toolgate-context': JSON.stringify({ tenant_id: T }) },
      { context: { tenant_id: 'someone-else' } },
    );
    expect(headerLoses.body.result?.isError).toBe(true);
  });

  it('name the run: the same run id and call again is a replay, not a second dispatch', async () => {
    const runId = newRunId();
    const headers = { 'toolgate-run-id': runId };
    const first = await call('echo', { q: 'replayed-by-header' }, headers);
    const again = await call('echo', { q: 'replayed-by-header' }, headers);
    expect(resultMeta(first)).toMatchObject({ run_id: runId, status: 'completed' });
    expect(resultMeta(again)).toMatchObject({ run_id: runId, replayed: true });
    expect(backend.hits.filter((hit) => JSON.stringify(hit.body).includes('replayed-by-header'))).toHaveLength(1);
  });

  it('cap the run with Toolgate-Budget-Units', async () => {
    const capped = await call('echo', { q: 'capped' }, { 'toolgate-budget-units': '0.5' });
    expect(capped.body.result?.isError).toBe(true);
    expect(String(resultMeta(capped).code)).toMatch(/budget/);
    expect(backend.hits.filter((hit) => JSON.stringify(hit.body).includes('capped'))).toHaveLength(0);
  });

  it('cannot name another tenant: context.tenant_id is checked against the token', async () => {
    const other = await call('echo', { q: 'other tenant' }, { 'toolgate-context': '{"tenant_id":"someone-else"}' });
    expect(other.body.result?.isError).toBe(true);
    expect(backend.hits.filter((hit) => JSON.stringify(hit.body).includes('other tenant'))).toHaveLength(0);
  });

  it.each([
    ['toolgate-context', '[1,2]', 'Toolgate-Context header: must be a JSON object'],
    ['toolgate-context', '{"user_id":', 'Toolgate-Context header: must be a JSON object'],
    ['toolgate-budget-units', 'ten', 'Toolgate-Budget-Units header: must be a positive number'],
    ['toolgate-budget-units', '0', 'Toolgate-Budget-Units header: must be a positive number'],
    ['toolgate-budget-units', '1e3', 'Toolgate-Budget-Units header: must be a positive number'],
    ['toolgate-run-id', 'has space', 'Toolgate-Run-Id header:'],
    ['toolgate-run-id', 'x'.repeat(201), 'Toolgate-Run-Id header:'],
  ])('refuse a malformed %s (%s) with 400 and a JSON-RPC error naming it', async (name, value, message) => {
    const answer = await call('echo', { q: 'bad header' }, { [name]: value });
    expect(answer.status).toBe(400);
    expect(answer.body.error?.code).toBe(-32602);
    expect(answer.body.error?.message).toContain(message);
    expect(answer.body.id).toBe(7);
  });
});

describe('errors a client can act on', () => {
  it('names each invalid field in the text, structuredContent and _meta of the isError result', async () => {
    const answer = await call('echo', { q: 42, extra: true });
    const result = answer.body.result!;
    expect(result.isError).toBe(true);
    expect(result.content?.[0]?.text).toMatch(/^tool_input_schema_invalid: .*\/q must be string/);
    const errors = resultMeta(answer).errors as Array<{ path: string; message: string }>;
    expect(errors).toEqual(expect.arrayContaining([{ path: '/q', message: 'must be string' }]));
    // echo advertises an output schema: its refusals keep structuredContent out (SDK v1 checks it).
    expect(result.structuredContent).toBeUndefined();
  });

  it('puts the field errors in structuredContent for a tool without an advertised output schema', async () => {
    const answer = await call('loose', {});
    expect(answer.body.result?.structuredContent).toEqual({
      code: 'tool_input_schema_invalid',
      message: expect.stringContaining('loose@1.0.0'),
      errors: [{ path: '/', message: "must have required property 'q'" }],
    });
  });

  it('answers malformed JSON with the JSON-RPC parse error -32700', async () => {
    for (const body of ['{"jsonrpc": "2.0", "id": 1,', '']) {
      const res = await fetch(`${base}/mcp`, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          accept: 'application/json, text/event-stream',
          authorization: `Bearer ${agent}`,
        },
        body,
      });
      expect(res.status).toBe(400);
      expect(await res.json()).toEqual({
        jsonrpc: '2.0',
        error: { code: -32700, message: expect.stringContaining('Parse error') },
        id: null,
      });
    }
  });
});

describe('protocol versions (docs/mcp.md#protocol-versions)', () => {
  it.each(['2024-11-05', '2025-03-26', '2025-06-18', '2025-11-25'])(
    'answers an initialize asking for %s with that version',
    async (version) => {
      const answer = await rpc('initialize', {
        protocolVersion: version,
        capabilities: {},
        clientInfo: { name: 'versions', version: '1' },
      });
      expect(answer.status).toBe(200);
      expect((answer.body.result as { protocolVersion?: string }).protocolVersion).toBe(version);
    },
  );

  it('answers a POST that does not accept both JSON and SSE with 406', async () => {
    const res = await fetch(`${base}/mcp`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json', authorization: `Bearer ${agent}` },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list', params: {} }),
    });
    expect(res.status).toBe(406);
  });
});

describe('browsers (CORS for TOOLGATE_MCP_ALLOWED_ORIGINS)', () => {
  const preflight = (origin: string | undefined) =>
    fetch(`${base}/mcp`, {
      method: 'OPTIONS',
      headers: {
        ...(origin ? { origin } : {}),
        'access-control-request-method': 'POST',
        'access-control-request-headers': 'authorization, content-type, mcp-protocol-version, toolgate-context',
      },
    });

  it('answers a preflight from an allowed origin, allowing the MCP and run-field headers', async () => {
    const res = await preflight(ALLOWED);
    expect(res.status).toBe(204);
    expect(res.headers.get('access-control-allow-origin')).toBe(ALLOWED);
    expect(res.headers.get('access-control-allow-methods')).toBe('POST');
    const allowed = res.headers.get('access-control-allow-headers')!.toLowerCase().split(', ');
    for (const name of [
      'authorization',
      'content-type',
      'mcp-protocol-version',
      'toolgate-run-id',
      'toolgate-context',
      'toolgate-budget-units',
    ])
      expect(allowed).toContain(name);
    expect(res.headers.get('vary')).toContain('Origin');
  });

  it('refuses a preflight from another origin, or without one, with 403 and no CORS headers', async () => {
    for (const origin of ['https://evil.example.com', undefined]) {
      const res = await preflight(origin);
      expect(res.status).toBe(403);
      expect(res.headers.get('access-control-allow-origin')).toBeNull();
    }
  });

  it('lets an allowed origin read answers, a 401 and its WWW-Authenticate included', async () => {
    const ok = await rpc('tools/list', {}, { origin: ALLOWED });
    expect(ok.status).toBe(200);
    expect(ok.headers.get('access-control-allow-origin')).toBe(ALLOWED);
    const refused = await rpc('tools/list', {}, { origin: ALLOWED }, null);
    expect(refused.status).toBe(401);
    expect(refused.headers.get('access-control-allow-origin')).toBe(ALLOWED);
    expect(refused.headers.get('access-control-expose-headers')).toContain('WWW-Authenticate');
    expect(refused.headers.get('access-control-expose-headers')).toContain('Mcp-Protocol-Version');
  });

  it('judges the origin before the token: a foreign origin is 403 with no token, a bad one or an operator’s', async () => {
    for (const token of [null, 'not-a-jwt', tokens.tenantOperator(T), agent]) {
      const res = await rpc('tools/list', {}, { origin: 'https://evil.example.com' }, token);
      expect(res.status).toBe(403);
      expect(res.headers.get('www-authenticate')).toBeNull();
      expect(res.headers.get('access-control-allow-origin')).toBeNull();
      expect(JSON.stringify(res.body)).toContain('origin https://evil.example.com');
    }
  });
});
