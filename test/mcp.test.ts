import {
  Client,
  ProtocolError,
  SdkHttpError,
  StreamableHTTPClientTransport,
  type CallToolResult,
} from '@modelcontextprotocol/client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TestBackend } from './helpers/backend.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';
import { until } from './helpers/waits.js';
import { createBudget, grantTool, newRunId, registerTool } from './helpers/world.js';

/**
 * The MCP front door (SPEC §12), driven by the SDK's own client over a real port, in both
 * protocol generations: 2025-era (`initialize`, the client's default) and 2026-07-28
 * (`versionNegotiation: { mode: 'auto' }`, which finds the modern era here).
 */
const T = 'tenant-mcp';
const ERAS = ['legacy', 'modern'] as const;
type Era = (typeof ERAS)[number];
const AGENTS: Record<Era, string> = { legacy: 'mcp.legacy-agent', modern: 'mcp.modern-agent' };
const agentToken = (era: Era) => tokens.agent(AGENTS[era], { tenant: T });
const operator = tokens.tenantOperator(T);
const TRACE_ID = '4bf92f3577b34da6a3ce929d0e0e4736';

let h: Harness;
let backend: TestBackend;
let base: string;
const clients: Client[] = [];

async function connect(era: Era, token = agentToken(era)): Promise<Client> {
  const client = new Client(
    { name: 'toolgate-test', version: '1.0.0' },
    era === 'modern' ? { versionNegotiation: { mode: 'auto' } } : {},
  );
  await client.connect(
    new StreamableHTTPClientTransport(new URL(`${base}/mcp`), {
      requestInit: { headers: { authorization: `Bearer ${token}` } },
    }),
  );
  clients.push(client);
  return client;
}

/** The backend hits of calls whose input carried `marker`. */
const hitsFor = (marker: string) => backend.hits.filter((hit) => JSON.stringify(hit.body).includes(marker));
const resultMeta = (result: CallToolResult) => result._meta?.['dev.toolgate/result'] as Record<string, unknown>;
const textOf = (result: CallToolResult) => (result.content[0] as { text: string }).text;

async function auditOf(runId: string) {
  const res = await h.client.get('/audit', { token: operator, query: { run_id: runId } });
  expect(res.status).toBe(200);
  return (
    res.body.items as Array<{
      event_type: string;
      status: string;
      reason_code: string | null;
      trace_id: string;
      details: Record<string, unknown>;
    }>
  ).reverse();
}

async function callError(promise: Promise<unknown>): Promise<ProtocolError> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(ProtocolError);
  return error as ProtocolError;
}

beforeAll(async () => {
  h = await startHarness();
  backend = await new TestBackend().start();
  await h.client.app.listen({ port: 0, host: '127.0.0.1' });
  const address = h.client.app.server.address() as { port: number };
  base = `http://127.0.0.1:${address.port}`;
  const allowed = { allowed_agents: Object.values(AGENTS) };
  const echo = `${backend.url}/echo`;
  await registerTool(h.client, { id: 'echo', backendUrl: echo, ...allowed });
  await registerTool(h.client, { id: 'echo', version: '1.1.0', backendUrl: echo, ...allowed });
  await registerTool(h.client, { id: 'drafts.write', category: 'draft_write', backendUrl: echo, ...allowed });
  await registerTool(h.client, { id: 'ungranted', backendUrl: echo, ...allowed });
  await registerTool(h.client, { id: 'revoked', backendUrl: echo, ...allowed });
  await registerTool(h.client, { id: 'switched', backendUrl: echo, ...allowed });
  await registerTool(h.client, { id: 'expensive', backendUrl: echo, cost_units: 1000, ...allowed });
  await registerTool(h.client, {
    id: 'limited',
    backendUrl: echo,
    rate_limit: { capacity: 1, refill_per_second: 0.01 },
    ...allowed,
  });
  await registerTool(h.client, { id: 'fails', backendUrl: `${backend.url}/status/500`, ...allowed });
  await registerTool(h.client, {
    id: 'gated',
    backendUrl: echo,
    requires_approval: true,
    risk_level: 'high',
    ...allowed,
  });
  await registerTool(h.client, { id: 'not.allowed', backendUrl: echo, allowed_agents: ['someone.else'] });
  await registerTool(h.client, { id: 'final.publish', category: 'final_write', risk_level: 'high', backendUrl: echo });
  for (const era of ERAS) {
    for (const tool of ['echo', 'drafts.write', 'revoked', 'switched', 'expensive', 'limited', 'fails', 'gated']) {
      const grant = await grantTool(h.client, { tenant: T, agent: AGENTS[era], tool });
      if (tool === 'revoked')
        expect(
          (await h.client.post(`/grants/${grant.id}/revoke`, { token: operator, body: { reason: 'no longer needed' } }))
            .status,
        ).toBe(200);
    }
    await createBudget(h.client, { tenant: T, scope: 'agent', agent_id: AGENTS[era], limit_units: 500 });
  }
  const armed = await h.client.post('/kill-switches', {
    token: operator,
    body: {
      scope: 'tool',
      target: 'switched',
      reason: 'incident 7',
      user_visible_status_copy: 'Paused for maintenance',
    },
  });
  expect(armed.status).toBe(201);
});

afterAll(async () => {
  for (const client of clients) await client.close().catch(() => undefined);
  await backend?.close();
  await h?.close();
});

describe.each(ERAS)('over MCP, %s era', (era) => {
  let client: Client;
  beforeAll(async () => {
    client = await connect(era);
    expect(client.getProtocolEra()).toBe(era);
  });

  it('lists exactly the agent’s GET /tools view: one tool per id, its newest usable version, sorted, with annotations and toolgate’s facts', async () => {
    const listed = await client.listTools();
    const view = await h.client.get('/tools', { token: agentToken(era) });
    expect(view.status).toBe(200);
    const all = view.body.items as Array<{
      id: string;
      version: string;
      display_name: string;
      category: string;
      risk_level: string;
      requires_approval: boolean;
      required_context: string[];
      cost_units: number;
      input_schema: unknown;
      output_schema: unknown;
    }>;
    // Only what the agent holds a live grant for: 'ungranted' has none, 'revoked' none live.
    const items = all.filter((item) => !['ungranted', 'revoked'].includes(item.id));
    expect(all.map((item) => item.id)).toContain('ungranted');
    expect(
      listed.tools.map((tool) => [tool.name, (tool._meta?.['dev.toolgate/tool'] as { version: string }).version]),
    ).toEqual(items.map((item) => [item.id.replaceAll('.', '-'), item.version]));
    // Named by a mapping of the id (docs/mcp.md#tool-names); the id itself is in _meta.
    expect(listed.tools.map((tool) => (tool._meta?.['dev.toolgate/tool'] as { id: string }).id)).toEqual(
      items.map((item) => item.id),
    );
    expect(listed.tools.map((tool) => tool.name)).toEqual([...listed.tools.map((tool) => tool.name)].sort());
    expect(listed.tools.map((tool) => tool.name)).not.toContain('not-allowed');
    expect(listed.tools.map((tool) => tool.name)).not.toContain('final-publish');
    const echo = listed.tools.find((tool) => tool.name === 'echo')!;
    const echoView = items.find((item) => item.id === 'echo')!;
    expect(echo).toMatchObject({
      title: echoView.display_name,
      inputSchema: echoView.input_schema,
      outputSchema: echoView.output_schema,
      annotations: { readOnlyHint: true, openWorldHint: false },
      _meta: {
        'dev.toolgate/tool': {
          id: 'echo',
          version: '1.1.0',
          category: 'read_only',
          risk_level: 'low',
          requires_approval: false,
          required_context: [],
          cost_units: 1,
        },
      },
    });
    expect(listed.tools.find((tool) => tool.name === 'drafts-write')!.annotations).toMatchObject({
      readOnlyHint: false,
      openWorldHint: false,
    });
    // A cache lifetime, for clients that hear of no change.
    expect((listed as { ttlMs?: number }).ttlMs).toBeGreaterThan(0);
  });

  it('calls a tool as a one-step run: the backend’s output, an intent and an outcome record that say via mcp, the trace continued', async () => {
    const marker = `call-${era}`;
    const runId = newRunId('mcp');
    const result = (await client.callTool({
      name: 'echo',
      arguments: { q: marker },
      _meta: { 'dev.toolgate/run': { run_id: runId }, traceparent: `00-${TRACE_ID}-00f067aa0ba902b7-01` },
    })) as CallToolResult;
    expect(result.isError).toBe(false);
    expect(result.structuredContent).toEqual({ echo: { q: marker } });
    expect(JSON.parse(textOf(result))).toEqual({ echo: { q: marker } });
    expect(resultMeta(result)).toMatchObject({ run_id: runId, status: 'completed' });
    expect(hitsFor(marker)).toHaveLength(1);
    const [hit] = hitsFor(marker);
    expect(hit!.headers.traceparent).toContain(TRACE_ID);
    const events = await auditOf(runId);
    expect(events.map((e) => e.event_type)).toEqual(['run.step.dispatching', 'run.step.completed']);
    for (const event of events) {
      expect(event.details.via).toBe('mcp');
      expect(event.trace_id).toBe(TRACE_ID);
    }
  });

  it('never lets the backend see the agent’s token', async () => {
    const marker = `token-${era}`;
    await client.callTool({ name: 'echo', arguments: { q: marker } });
    const [hit] = hitsFor(marker);
    expect(hit!.headers.authorization).toBeUndefined();
    expect(JSON.stringify(hit!.headers)).not.toContain(agentToken(era).split('.')[2]);
  });

  it('replays a run named in _meta without a second dispatch', async () => {
    const marker = `replay-${era}`;
    const call = { name: 'echo', arguments: { q: marker }, _meta: { 'dev.toolgate/run': { run_id: newRunId('mcp') } } };
    const first = (await client.callTool(call)) as CallToolResult;
    const again = (await client.callTool(call)) as CallToolResult;
    expect(again.structuredContent).toEqual(first.structuredContent);
    expect(resultMeta(again)).toMatchObject({ replayed: true });
    expect(hitsFor(marker)).toHaveLength(1);
  });

  it.each([
    ['ungranted', { q: 'x' }, 'grant_missing', 'failed'],
    ['revoked', { q: 'x' }, 'grant_revoked', 'failed'],
    ['switched', { q: 'x' }, 'kill_switch_active', 'killed'],
    ['expensive', { q: 'x' }, 'budget_exceeded', 'killed'],
    ['echo', { q: 42 }, 'tool_input_schema_invalid', 'failed'],
  ])(
    'a refusal (%s → %s) is an isError result the model can read, and nothing is dispatched',
    async (tool, input, code, status) => {
      const dispatched = backend.hits.length;
      const runId = newRunId('mcp');
      const result = (await client.callTool({
        name: tool,
        arguments: input,
        _meta: { 'dev.toolgate/run': { run_id: runId } },
      })) as CallToolResult;
      expect(result.isError).toBe(true);
      expect(textOf(result)).toMatch(new RegExp(`^${code}: `));
      expect(resultMeta(result)).toEqual({
        run_id: runId,
        status,
        code,
        ...(code === 'tool_input_schema_invalid' ? { errors: [{ path: '/q', message: 'must be string' }] } : {}),
      });
      expect(backend.hits.length).toBe(dispatched);
      const events = await auditOf(runId);
      expect(events.map((e) => [e.status, e.reason_code, e.details.via])).toContainEqual(['denied', code, 'mcp']);
    },
  );

  it('a backend failure is an isError result with its code, after one dispatch', async () => {
    const marker = `fails-${era}`;
    const result = (await client.callTool({ name: 'fails', arguments: { q: marker } })) as CallToolResult;
    expect(result.isError).toBe(true);
    expect(resultMeta(result)).toMatchObject({ status: 'failed', code: 'tool_backend_failed' });
    expect(hitsFor(marker)).toHaveLength(1);
  });

  it('a rate limit is an isError result with its retry time', async () => {
    const first = (await client.callTool({ name: 'limited', arguments: { q: `limited-${era}-1` } })) as CallToolResult;
    expect(first.isError).toBe(false);
    const second = (await client.callTool({ name: 'limited', arguments: { q: `limited-${era}-2` } })) as CallToolResult;
    expect(second.isError).toBe(true);
    expect(resultMeta(second)).toMatchObject({ status: 'throttled', code: 'rate_limited' });
    expect(resultMeta(second).retry_after_seconds).toBeGreaterThanOrEqual(1);
    expect(hitsFor(`limited-${era}-2`)).toHaveLength(0);
  });

  it.each(['not.allowed', 'not-allowed', 'final.publish', 'final-publish', 'no.such.tool', 'no-such-tool'])(
    'a tool that does not exist for the agent (%s) is -32602, as if it were not there',
    async (name) => {
      const error = await callError(client.callTool({ name, arguments: { q: 'x' } }));
      expect(error.code).toBe(-32602);
      expect(error.message).toContain(`Unknown tool: ${name}`);
    },
  );

  it('malformed run fields in _meta are the client’s error (-32602), and nothing runs', async () => {
    const error = await callError(
      client.callTool({
        name: 'echo',
        arguments: { q: `bad-meta-${era}` },
        _meta: { 'dev.toolgate/run': { run_id: 'has spaces' } },
      }),
    );
    expect(error.code).toBe(-32602);
    expect(error.message).toContain('run_id');
    expect(hitsFor(`bad-meta-${era}`)).toHaveLength(0);
  });

  it('an approval-gated call is held, approved over REST, and completes when called again', async () => {
    const marker = `gated-${era}`;
    const call = {
      name: 'gated',
      arguments: { q: marker },
      _meta: { 'dev.toolgate/run': { run_id: newRunId('mcp') } },
    };
    const held = (await client.callTool(call)) as CallToolResult;
    expect(held.isError).toBe(true);
    const meta = resultMeta(held);
    expect(meta).toMatchObject({ status: 'awaiting_approval', code: 'awaiting_approval' });
    expect(meta.approval_id).toMatch(/^apr_/);
    // Still waiting: the same call answers the same hold.
    expect(resultMeta((await client.callTool(call)) as CallToolResult)).toMatchObject({
      status: 'awaiting_approval',
      approval_id: meta.approval_id,
    });
    expect(hitsFor(marker)).toHaveLength(0);
    const approved = await h.client.post(`/approvals/${meta.approval_id as string}/approve`, {
      token: operator,
      body: { rationale: 'looked at it' },
    });
    expect(approved.status).toBe(200);
    const done = (await client.callTool(call)) as CallToolResult;
    expect(done.isError).toBe(false);
    expect(done.structuredContent).toEqual({ echo: { q: marker } });
    expect(hitsFor(marker)).toHaveLength(1);
    const events = await auditOf(meta.run_id as string);
    expect(events.filter((e) => e.event_type === 'run.resumed').map((e) => e.details.via)).toEqual(['mcp']);
  });

  it('a held call whose proposal an operator rejected is refused when called again, and never dispatched', async () => {
    const marker = `rejected-${era}`;
    const call = {
      name: 'gated',
      arguments: { q: marker },
      _meta: { 'dev.toolgate/run': { run_id: newRunId('mcp') } },
    };
    const held = resultMeta((await client.callTool(call)) as CallToolResult);
    const rejected = await h.client.post(`/approvals/${held.approval_id as string}/reject`, {
      token: operator,
      body: { rationale: 'not this one' },
    });
    expect(rejected.status).toBe(200);
    const again = (await client.callTool(call)) as CallToolResult;
    expect(again.isError).toBe(true);
    expect(resultMeta(again)).toMatchObject({ run_id: held.run_id, code: 'run_not_resumable' });
    expect(hitsFor(marker)).toHaveLength(0);
  });
});

describe('run ids', () => {
  it('belong to the agent that used them first: another agent naming one is refused (run_id_conflict), nothing dispatched', async () => {
    const runId = newRunId('mcp');
    const owner = await connect('legacy');
    const other = await connect('modern');
    expect(
      (
        (await owner.callTool({
          name: 'echo',
          arguments: { q: 'owned' },
          _meta: { 'dev.toolgate/run': { run_id: runId } },
        })) as CallToolResult
      ).isError,
    ).toBe(false);
    const refused = (await other.callTool({
      name: 'echo',
      arguments: { q: 'not yours' },
      _meta: { 'dev.toolgate/run': { run_id: runId } },
    })) as CallToolResult;
    expect(refused.isError).toBe(true);
    expect(resultMeta(refused)).toEqual({ run_id: runId, status: 'rejected', code: 'run_id_conflict' });
    expect(hitsFor('not yours')).toHaveLength(0);
    const events = await auditOf(runId);
    expect(events.find((e) => e.event_type === 'run.rejected')).toMatchObject({
      reason_code: 'run_id_conflict',
      details: { via: 'mcp' },
    });
  });
});

describe('list changes', () => {
  it('a 2026-07-28 client listening is told when a registration changes its tools', async () => {
    const client = await connect('modern');
    let heard = 0;
    client.setNotificationHandler('notifications/tools/list_changed', async () => {
      heard += 1;
    });
    const subscription = await client.listen({ toolsListChanged: true });
    expect(subscription.honoredFilter).toMatchObject({ toolsListChanged: true });
    await registerTool(h.client, {
      id: 'arrived.later',
      backendUrl: `${backend.url}/echo`,
      allowed_agents: Object.values(AGENTS),
    });
    await grantTool(h.client, { tenant: T, agent: AGENTS.modern, tool: 'arrived.later' });
    await until('a tools/list_changed notification', () => heard > 0);
    const tools = await client.listTools(undefined, { cacheMode: 'refresh' });
    expect(tools.tools.map((tool) => tool.name)).toContain('arrived-later');
    await subscription.close();
  });

  it('a 2025-era client, which has no stream here, is told how long a list may be kept', async () => {
    const client = await connect('legacy');
    expect(client.getServerCapabilities()?.tools?.listChanged).toBeFalsy();
    const listed = await client.listTools();
    expect((listed as { ttlMs?: number }).ttlMs).toBe(10_000);
  });
});

describe('the door itself', () => {
  const post = (headers: Record<string, string>) =>
    fetch(`${base}/mcp`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...headers },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list', params: {} }),
    });

  it('answers no token with 401 and the resource metadata pointer, which is served without auth', async () => {
    const res = await post({});
    expect(res.status).toBe(401);
    expect(res.headers.get('www-authenticate')).toBe(
      `Bearer resource_metadata="${base}/.well-known/oauth-protected-resource/mcp"`,
    );
    const metadata = await h.client.get('/.well-known/oauth-protected-resource/mcp');
    expect(metadata.status).toBe(200);
    expect(metadata.body).toMatchObject({ bearer_methods_supported: ['header'] });
    // The SDK's client sees the status (and would start its OAuth discovery from the pointer).
    const failed = await new Client({ name: 't', version: '1' })
      .connect(new StreamableHTTPClientTransport(new URL(`${base}/mcp`)))
      .catch((e: unknown) => e);
    expect(failed).toBeInstanceOf(SdkHttpError);
    expect((failed as SdkHttpError).status).toBe(401);
  });

  it('answers an invalid token with 401 invalid_token and the pointer', async () => {
    const res = await post({ authorization: 'Bearer not.a.token' });
    expect(res.status).toBe(401);
    expect(res.headers.get('www-authenticate')).toContain('error="invalid_token"');
    expect(res.headers.get('www-authenticate')).toContain('resource_metadata=');
  });

  it('refuses an operator token with 403', async () => {
    expect((await post({ authorization: `Bearer ${operator}` })).status).toBe(403);
  });

  it('refuses a browser Origin it was not told to allow with 403', async () => {
    const res = await post({ authorization: `Bearer ${agentToken('legacy')}`, origin: 'https://evil.example' });
    expect(res.status).toBe(403);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('forbidden');
  });

  it('answers GET and DELETE with 405: stateless, there is no stream to open or session to end', async () => {
    for (const method of ['GET', 'DELETE']) {
      const res = await h.client.request(method, '/mcp', { token: agentToken('legacy') });
      expect(res.status).toBe(405);
      expect(res.headers.allow).toBe('POST');
    }
  });

  it('answers a Host header that is no host name without a fault, and never points clients at it', async () => {
    for (const host of ['a b', '[::1', 'evil"quote']) {
      const call = await h.client.app.inject({
        method: 'POST',
        url: '/mcp',
        headers: {
          host,
          'content-type': 'application/json',
          accept: 'application/json, text/event-stream',
          authorization: `Bearer ${agentToken('legacy')}`,
        },
        payload: { jsonrpc: '2.0', id: 1, method: 'tools/list', params: {} },
      });
      expect(call.statusCode, call.body).toBe(200);
      const refused = await h.client.app.inject({
        method: 'POST',
        url: '/mcp',
        headers: { host, 'content-type': 'application/json' },
        payload: {},
      });
      expect(refused.statusCode).toBe(401);
      expect(refused.headers['www-authenticate']).toBe(
        'Bearer resource_metadata="http://localhost/.well-known/oauth-protected-resource/mcp"',
      );
    }
  });

  it('answers a 2025-06-18 initialize on any replica, and a tools/call that follows it without a session', async () => {
    const headers = {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      authorization: `Bearer ${agentToken('legacy')}`,
    };
    const init = await fetch(`${base}/mcp`, {
      method: 'POST',
      headers,
      body: JSON.stringify({
        jsonrpc: '2.0',
        id: 1,
        method: 'initialize',
        params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
      }),
    });
    expect(init.status).toBe(200);
    expect(((await init.json()) as { result: { protocolVersion: string } }).result.protocolVersion).toBe('2025-06-18');
    const call = await fetch(`${base}/mcp`, {
      method: 'POST',
      headers: { ...headers, 'mcp-protocol-version': '2025-06-18' },
      body: JSON.stringify({
        jsonrpc: '2.0',
        id: 2,
        method: 'tools/call',
        params: { name: 'echo', arguments: { q: 'raw-2025-06-18' } },
      }),
    });
    const body = (await call.json()) as { result: CallToolResult };
    expect(body.result.structuredContent).toEqual({ echo: { q: 'raw-2025-06-18' } });
  });

  it('mints no session id', async () => {
    const res = await post({ authorization: `Bearer ${agentToken('legacy')}` });
    expect(res.status).toBe(200);
    expect(res.headers.get('mcp-session-id')).toBeNull();
    expect(res.headers.get('content-type')).toContain('application/json');
  });

  it('counts MCP requests by method and outcome', async () => {
    const unknown = await fetch(`${base}/mcp`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
        authorization: `Bearer ${agentToken('legacy')}`,
      },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'prompts/list', params: {} }),
    });
    expect(((await unknown.json()) as { error: { code: number } }).error.code).toBe(-32601);
    const metrics = await h.client.get('/metrics');
    expect(metrics.text).toMatch(/toolgate_mcp_requests_total\{method="other",outcome="error"\} 1/);
    expect(metrics.text).toMatch(/toolgate_mcp_requests_total\{method="tools\/call",outcome="tool_error"\} \d+/);
    expect(metrics.text).toMatch(/toolgate_mcp_requests_total\{method="tools\/list",outcome="ok"\} \d+/);
    expect(metrics.text).toMatch(/toolgate_mcp_requests_total\{method="[^"]+",outcome="unauthenticated"\} \d+/);
  });
});
