import { isLegacyRequest, ProtocolError } from '@modelcontextprotocol/server';
import { describe, expect, it } from 'vitest';
import { inboundRequestOf } from '../src/mcp/inbound-request.js';
import { callResultOf, runRequestOf, traceIdOfMeta } from '../src/mcp/mcp-calls.js';
import { plainlyLegacy } from '../src/mcp/mcp-eras.js';
import { mcpToolOf, toolsPage } from '../src/mcp/mcp-tools.js';
import type { AgentToolView } from '../src/registry/tool-views.js';
import type { RunAnswer } from '../src/runs/run-types.js';

/** The pure parts of the MCP door: tools from views, pages, run requests from calls, results from envelopes. */
const view = (id: string, overrides: Partial<AgentToolView> = {}): AgentToolView =>
  ({
    id,
    version: '1.0.0',
    display_name: `Tool ${id}`,
    description: 'a tool',
    category: 'read_only',
    risk_level: 'low',
    input_schema: { type: 'object', properties: { q: { type: 'string' } } },
    output_schema: { type: 'object' },
    required_context: [],
    required_scopes: [],
    requires_approval: false,
    cost_units: 1,
    ...overrides,
  }) as AgentToolView;

describe('tools from agent views', () => {
  it('keeps object schemas, gives a typeless one its object type, and wraps anything else so it still constrains', () => {
    expect(mcpToolOf(view('a')).inputSchema).toEqual({ type: 'object', properties: { q: { type: 'string' } } });
    expect(mcpToolOf(view('b', { input_schema: { properties: { q: {} } } })).inputSchema).toEqual({
      type: 'object',
      properties: { q: {} },
    });
    expect(mcpToolOf(view('c', { input_schema: true })).inputSchema).toEqual({ type: 'object', allOf: [true] });
    expect(mcpToolOf(view('d', { input_schema: { type: 'string' } })).inputSchema).toEqual({
      type: 'object',
      allOf: [{ type: 'string' }],
    });
  });

  it('carries an output schema only when it describes an object (structuredContent is one)', () => {
    expect(mcpToolOf(view('a')).outputSchema).toEqual({ type: 'object' });
    expect(mcpToolOf(view('b', { output_schema: { type: 'array' } })).outputSchema).toBeUndefined();
  });

  it('marks external_call tools as reaching the open world, and only read_only ones as read-only', () => {
    expect(mcpToolOf(view('a', { category: 'external_call' })).annotations).toMatchObject({
      readOnlyHint: false,
      openWorldHint: true,
    });
    expect(mcpToolOf(view('b', { category: 'draft_write' })).annotations).toMatchObject({
      readOnlyHint: false,
      openWorldHint: false,
    });
  });
});

describe('tool pages', () => {
  const tools = ['a', 'b', 'c', 'd', 'e'].map((id) => mcpToolOf(view(id)));

  it('pages by id with opaque cursors, the last page without one', () => {
    const first = toolsPage(tools, undefined, 2)!;
    expect(first.tools.map((t) => t.name)).toEqual(['a', 'b']);
    const second = toolsPage(tools, first.nextCursor, 2)!;
    expect(second.tools.map((t) => t.name)).toEqual(['c', 'd']);
    const last = toolsPage(tools, second.nextCursor, 2)!;
    expect(last).toEqual({ tools: [tools[4]] });
  });

  it('goes on after the cursor’s tool even when that tool is gone', () => {
    const cursor = toolsPage(tools, undefined, 2)!.nextCursor;
    expect(
      toolsPage(
        tools.filter((t) => t.name !== 'b'),
        cursor,
        2,
      )!.tools.map((t) => t.name),
    ).toEqual(['c', 'd']);
  });

  it('refuses a cursor it did not issue', () => {
    for (const cursor of ['x', 'eyJhZnRlciI6MX0', '%%%', Buffer.from('{"after":"a","x":1}').toString('base64url')]) {
      expect(toolsPage(tools, cursor, 2)).toBeUndefined();
    }
  });
});

describe('run requests from tools/call', () => {
  it('names the tool, takes the arguments as input, and the run fields from _meta, absent ones absent', () => {
    const request = runRequestOf(
      'scf.search',
      { q: 'x' },
      {
        'dev.toolgate/run': {
          run_id: 'r-1',
          version: '^1',
          context: { organization_id: 'o' },
          budget_units: 5,
          session_id: 's-1',
        },
      },
    );
    expect(request).toEqual({
      run_id: 'r-1',
      session_id: 's-1',
      budget_units: 5,
      context: { organization_id: 'o' },
      plan: [{ tool_id: 'scf.search', version: '^1', input: { q: 'x' } }],
    });
  });

  it('makes a fresh run id, an empty context and an empty input when none is given', () => {
    const request = runRequestOf('scf.search', undefined, undefined);
    expect(request.run_id).toMatch(/^mcp-[0-9a-f-]{36}$/);
    expect(request).toMatchObject({ context: {}, plan: [{ tool_id: 'scf.search', input: {} }] });
  });

  it.each([{ run_id: 'a b' }, { budget_units: 0 }, { context: 'x' }, { unknown: 1 }, 'not an object'])(
    'refuses %j as -32602',
    (meta) => {
      expect(() => runRequestOf('t', {}, { 'dev.toolgate/run': meta })).toThrowError(ProtocolError);
    },
  );

  it('reads a valid traceparent only', () => {
    expect(traceIdOfMeta({ traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' })).toBe(
      '4bf92f3577b34da6a3ce929d0e0e4736',
    );
    expect(traceIdOfMeta({ traceparent: '00-00000000000000000000000000000000-00f067aa0ba902b7-01' })).toBeUndefined();
    expect(traceIdOfMeta({ traceparent: 'nonsense' })).toBeUndefined();
    expect(traceIdOfMeta(undefined)).toBeUndefined();
  });
});

describe('results from run envelopes', () => {
  const answer = (envelope: Partial<RunAnswer['envelope']>, replayed = false): RunAnswer => ({
    httpStatus: 200,
    replayed,
    envelope: { run_id: 'r-1', status: 'completed', dry_run: false, steps: [], warnings: [], ...envelope },
  });
  const step = { index: 0, tool_id: 't', version: '1.0.0', cost_units: 0, duration_ms: 1, audit_id: null };

  it('gives a completed call its output as text and as structured content', () => {
    const result = callResultOf('t', answer({ steps: [{ ...step, status: 'completed', output: { a: 1 } }] }));
    expect(result).toEqual({
      content: [{ type: 'text', text: '{"a":1}' }],
      structuredContent: { a: 1 },
      isError: false,
      _meta: { 'dev.toolgate/result': { run_id: 'r-1', status: 'completed' } },
    });
    expect(
      callResultOf('t', answer({ steps: [{ ...step, status: 'completed', output: [1] }] })).structuredContent,
    ).toBeUndefined();
  });

  it('gives a stopped run the code of the step that stopped it, and a rate limit its retry time', () => {
    const result = callResultOf(
      't',
      answer({
        status: 'throttled',
        retry_after_seconds: 3,
        steps: [{ ...step, status: 'denied', error: { code: 'rate_limited', message: 'slow down', details: {} } }],
      }),
    );
    expect(result).toMatchObject({
      isError: true,
      content: [{ type: 'text', text: 'rate_limited: slow down' }],
      _meta: {
        'dev.toolgate/result': { run_id: 'r-1', status: 'throttled', code: 'rate_limited', retry_after_seconds: 3 },
      },
    });
  });

  it('answers a tool that does not exist for the agent with -32602, an outage with -32603', () => {
    for (const code of ['tool_not_registered', 'tool_category_blocked', 'unauthorized_tool_access'] as const) {
      expect(() =>
        callResultOf(
          't',
          answer({
            status: 'failed',
            steps: [{ ...step, status: 'denied', error: { code, message: 'm', details: {} } }],
          }),
        ),
      ).toThrowError(/Unknown tool: t/);
    }
    expect(() =>
      callResultOf(
        't',
        answer({
          status: 'failed',
          steps: [{ ...step, status: 'denied', error: { code: 'gateway_unavailable', message: 'm', details: {} } }],
        }),
      ),
    ).toThrowError(/gateway_unavailable/);
  });
});

describe('which era a request is', () => {
  const call = (params: Record<string, unknown> = { name: 't', arguments: {} }) => ({
    jsonrpc: '2.0',
    id: 1,
    method: 'tools/call',
    params,
  });
  const envelope = {
    'io.modelcontextprotocol/protocolVersion': '2026-07-28',
    'io.modelcontextprotocol/clientInfo': { name: 'c', version: '1' },
    'io.modelcontextprotocol/clientCapabilities': {},
  };
  const cases: Array<[string, Record<string, string>, unknown, boolean]> = [
    ['a 2025-era call', { 'mcp-protocol-version': '2025-11-25' }, call(), true],
    ['a call naming no version', {}, call(), true],
    [
      'an initialize',
      {},
      { jsonrpc: '2.0', id: 'i', method: 'initialize', params: { protocolVersion: '2025-06-18' } },
      true,
    ],
    [
      'run fields in _meta',
      { 'mcp-protocol-version': '2025-06-18' },
      call({ name: 't', _meta: { 'dev.toolgate/run': {} } }),
      true,
    ],
    ['a progress token', {}, call({ name: 't', _meta: { progressToken: 7 } }), true],
    ['a 2026-07-28 envelope', { 'mcp-protocol-version': '2026-07-28' }, call({ name: 't', _meta: envelope }), false],
    ['a 2026-07-28 header without an envelope', { 'mcp-protocol-version': '2026-07-28' }, call(), false],
    ['a version with spaces around it', { 'mcp-protocol-version': ' 2025-11-25 ' }, call(), false],
    ['a notification', {}, { jsonrpc: '2.0', method: 'notifications/initialized' }, false],
    ['a batch', {}, [call()], false],
    ['a fractional id', {}, { ...call(), id: 1.5 }, false],
    ['a member JSON-RPC does not have', {}, { ...call(), extra: true }, false],
    ['params that are a list', {}, { ...call(), params: [] }, false],
    ['a progress token that is no token', {}, call({ name: 't', _meta: { progressToken: true } }), false],
  ];
  it.each(cases)(
    '%s: plainly legacy is %s only where the SDK routes it to legacy serving too',
    async (_label, headers, body, plain) => {
      const request = inboundRequestOf({ 'content-type': 'application/json', ...headers }, undefined);
      expect(plainlyLegacy(request, body)).toBe(plain);
      if (plain) expect(await isLegacyRequest(request, body)).toBe(true);
    },
  );

  it("the SDK classifies the view of Node's request as it classifies a web Request", async () => {
    for (const [, headers, body] of cases) {
      const web = new Request('http://localhost/mcp', {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...headers },
      });
      const view = inboundRequestOf({ 'content-type': 'application/json', ...headers }, undefined);
      expect(await isLegacyRequest(view, body)).toBe(await isLegacyRequest(web, body));
    }
  });
});
