import { existsSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createMCPClient, type MCPClient } from '@ai-sdk/mcp';
import { MultiServerMCPClient } from '@langchain/mcp-adapters';
import { Client as SdkV1Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport as SdkV1Transport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { chromium, type Browser } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TestBackend } from './helpers/backend.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';
import { grantTool, registerTool } from './helpers/world.js';

/**
 * The MCP door driven by the clients agent runtimes use (SPEC §12.1), each as docs/mcp.md tells:
 * the official SDK v1, LangChain's adapters and the Vercel AI SDK list, call, send required
 * context by header, resume an approved call by making it again, see a refusal, and fail on a bad
 * token. Chromium calls from an allowed origin and is refused from another.
 */
const T = 'tenant-mcp-clients';
const AGENTS = { sdk: 'clients.sdk-v1', langchain: 'clients.langchain', aisdk: 'clients.ai-sdk' } as const;
const CONTEXT = { user_id: 'u-7', ticket: 'T-42' };
const CHROMIUM = '/usr/bin/chromium';
const operator = tokens.tenantOperator(T);

let h: Harness;
let backend: TestBackend;
let mcpUrl: string;
/** Pages served from an allowed origin and from another, for the browser. */
let allowedPages: Server;
let otherPages: Server;

const hitsFor = (marker: string) => backend.hits.filter((hit) => JSON.stringify(hit.body).includes(marker)).length;

async function approveLatest(agent: string): Promise<void> {
  const pending = await h.client.get('/approvals', { token: operator, query: { status: 'pending', limit: 100 } });
  const approval = (pending.body.items as Array<{ id: string; agent_id: string }>).find((a) => a.agent_id === agent);
  expect(approval, `a pending approval of ${agent}`).toBeDefined();
  const res = await h.client.post(`/approvals/${approval!.id}/approve`, {
    token: operator,
    body: { rationale: 'checked by a person' },
  });
  expect(res.status).toBe(200);
}

function pageServer(): Promise<Server> {
  const server = createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'text/html' }).end('<!doctype html><title>agent page</title>');
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}
const originOf = (server: Server) => `http://127.0.0.1:${(server.address() as AddressInfo).port}`;

beforeAll(async () => {
  allowedPages = await pageServer();
  otherPages = await pageServer();
  h = await startHarness({ TOOLGATE_MCP_ALLOWED_ORIGINS: originOf(allowedPages) });
  backend = await new TestBackend().start();
  await h.client.app.listen({ port: 0, host: '127.0.0.1' });
  mcpUrl = `http://127.0.0.1:${(h.client.app.server.address() as AddressInfo).port}/mcp`;
  const echo = `${backend.url}/echo`;
  const allowed = { allowed_agents: Object.values(AGENTS) };
  await registerTool(h.client, { id: 'notes.search', backendUrl: echo, ...allowed });
  await registerTool(h.client, {
    id: 'tickets.read',
    backendUrl: echo,
    required_context: ['user_id', 'ticket'],
    ...allowed,
  });
  await registerTool(h.client, {
    id: 'refunds.issue',
    backendUrl: echo,
    requires_approval: true,
    risk_level: 'high',
    ...allowed,
  });
  await registerTool(h.client, { id: 'mail.send', backendUrl: echo, ...allowed });
  for (const agent of Object.values(AGENTS))
    for (const tool of ['notes.search', 'tickets.read', 'refunds.issue', 'mail.send'])
      await grantTool(h.client, { tenant: T, agent, tool });
  const armed = await h.client.post('/kill-switches', {
    token: operator,
    body: { scope: 'tool', target: 'mail.send', reason: 'incident 12', user_visible_status_copy: 'Mail is paused' },
  });
  expect(armed.status).toBe(201);
});

afterAll(async () => {
  await backend?.close();
  await h?.close();
  allowedPages?.close();
  otherPages?.close();
});

describe('the official SDK v1 (@modelcontextprotocol/sdk)', () => {
  const connect = async (token: string, headers: Record<string, string> = {}) => {
    const client = new SdkV1Client({ name: 'sdk-v1-agent', version: '1.0.0' });
    await client.connect(
      new SdkV1Transport(new URL(mcpUrl), {
        requestInit: { headers: { authorization: `Bearer ${token}`, ...headers } },
      }),
    );
    return client;
  };
  const token = tokens.agent(AGENTS.sdk, { tenant: T });
  const text = (result: unknown) => (result as { content: Array<{ text: string }> }).content[0]!.text;

  it('lists, calls, sends context by header, resumes an approval and sees a refusal', async () => {
    const client = await connect(token, { 'Toolgate-Context': JSON.stringify(CONTEXT) });
    try {
      const names = (await client.listTools()).tools.map((tool) => tool.name);
      expect(names).toEqual(['mail-send', 'notes-search', 'refunds-issue', 'tickets-read']);
      expect(await client.callTool({ name: 'notes-search', arguments: { q: 'sdk-plain' } })).toMatchObject({
        isError: false,
        structuredContent: { echo: { q: 'sdk-plain' } },
      });
      expect(await client.callTool({ name: 'tickets-read', arguments: { q: 'sdk-context' } })).toMatchObject({
        isError: false,
      });

      const held = await client.callTool({ name: 'refunds-issue', arguments: { q: 'sdk-refund' } });
      expect(held.isError).toBe(true);
      expect(text(held)).toMatch(/^awaiting_approval: /);
      await approveLatest(AGENTS.sdk);
      expect(await client.callTool({ name: 'refunds-issue', arguments: { q: 'sdk-refund' } })).toMatchObject({
        isError: false,
      });
      expect(hitsFor('sdk-refund')).toBe(1);

      const refused = await client.callTool({ name: 'mail-send', arguments: { q: 'sdk-mail' } });
      expect(refused.isError).toBe(true);
      expect(text(refused)).toMatch(/^kill_switch_active: /);
    } finally {
      await client.close();
    }
  });

  it('fails to connect with a bad token', async () => {
    await expect(connect('not-a-token')).rejects.toThrow(/unauthenticated/);
  });
});

describe('LangChain (@langchain/mcp-adapters)', () => {
  const clientFor = (token: string, onCall?: (name: string) => Record<string, string>) =>
    new MultiServerMCPClient({
      mcpServers: {
        toolgate: { transport: 'http', url: mcpUrl, headers: { Authorization: `Bearer ${token}` } },
      },
      throwOnLoadError: true,
      // The headers beforeToolCall returns replace the server's (the adapter opens a client with
      // them alone): the token goes with them.
      ...(onCall
        ? {
            beforeToolCall: ({ name }: { name: string }) => ({
              headers: { Authorization: `Bearer ${token}`, ...onCall(name) },
            }),
          }
        : {}),
    });
  const token = tokens.agent(AGENTS.langchain, { tenant: T });

  it('lists, calls, sends context per call from beforeToolCall, resumes an approval and sees a refusal', async () => {
    const client = clientFor(token, () => ({ 'Toolgate-Context': JSON.stringify(CONTEXT) }));
    try {
      const tools = await client.getTools();
      const tool = (name: string) => tools.find((t) => t.name === name)!;
      expect(tools.map((t) => t.name).sort()).toEqual(['mail-send', 'notes-search', 'refunds-issue', 'tickets-read']);
      expect(JSON.stringify(await tool('notes-search').invoke({ q: 'lc-plain' }))).toContain('lc-plain');
      expect(JSON.stringify(await tool('tickets-read').invoke({ q: 'lc-context' }))).toContain('lc-context');

      await expect(tool('refunds-issue').invoke({ q: 'lc-refund' })).rejects.toThrow(/awaiting_approval/);
      await approveLatest(AGENTS.langchain);
      expect(JSON.stringify(await tool('refunds-issue').invoke({ q: 'lc-refund' }))).toContain('lc-refund');
      expect(hitsFor('lc-refund')).toBe(1);

      await expect(tool('mail-send').invoke({ q: 'lc-mail' })).rejects.toThrow(/kill_switch_active/);
    } finally {
      await client.close();
    }
  });

  it('without the context header, a tool that requires context is refused', async () => {
    const client = clientFor(token);
    try {
      const tools = await client.getTools();
      await expect(tools.find((t) => t.name === 'tickets-read')!.invoke({ q: 'lc-none' })).rejects.toThrow(
        /missing_required_context/,
      );
    } finally {
      await client.close();
    }
  });

  it('fails to load tools with a bad token', async () => {
    const client = clientFor('not-a-token');
    await expect(client.getTools()).rejects.toThrow();
    await client.close().catch(() => undefined);
  });
});

describe('the Vercel AI SDK (@ai-sdk/mcp)', () => {
  const connect = (token: string, headers: Record<string, string> = {}): Promise<MCPClient> =>
    createMCPClient({
      transport: { type: 'http', url: mcpUrl, headers: { Authorization: `Bearer ${token}`, ...headers } },
    });
  const token = tokens.agent(AGENTS.aisdk, { tenant: T });
  const options = { toolCallId: 'call-1', messages: [] };

  it('lists, calls, sends context by header, resumes an approval and sees a refusal', async () => {
    const client = await connect(token, { 'Toolgate-Context': JSON.stringify(CONTEXT) });
    try {
      const tools = await client.tools();
      expect(Object.keys(tools).sort()).toEqual(['mail-send', 'notes-search', 'refunds-issue', 'tickets-read']);
      const run = async (name: string, q: string) =>
        (await tools[name]!.execute!({ q }, options)) as unknown as {
          isError?: boolean;
          content: Array<{ text: string }>;
        };
      expect(await run('notes-search', 'ai-plain')).toMatchObject({ isError: false });
      expect(await run('tickets-read', 'ai-context')).toMatchObject({ isError: false });

      const held = await run('refunds-issue', 'ai-refund');
      expect(held.isError).toBe(true);
      expect(held.content[0]!.text).toMatch(/^awaiting_approval: /);
      await approveLatest(AGENTS.aisdk);
      expect(await run('refunds-issue', 'ai-refund')).toMatchObject({ isError: false });
      expect(hitsFor('ai-refund')).toBe(1);

      const refused = await run('mail-send', 'ai-mail');
      expect(refused.isError).toBe(true);
      expect(refused.content[0]!.text).toMatch(/^kill_switch_active: /);
    } finally {
      await client.close();
    }
  });

  it('fails to connect with a bad token', async () => {
    await expect(connect('not-a-token')).rejects.toThrow();
  });
});

describe.skipIf(!existsSync(CHROMIUM))('a browser (Chromium)', () => {
  let browser: Browser;
  beforeAll(async () => {
    browser = await chromium.launch({ executablePath: CHROMIUM, headless: true });
  });
  afterAll(async () => {
    await browser?.close();
  });

  /** What a page at `origin` gets from POST /mcp tools/list: the status, or the fetch's failure. */
  async function listFrom(origin: string): Promise<unknown> {
    const page = await browser.newPage();
    try {
      await page.goto(origin);
      const token = tokens.agent(AGENTS.sdk, { tenant: T });
      return await page.evaluate(
        `fetch(${JSON.stringify(mcpUrl)}, {
          method: 'POST',
          headers: {
            'Content-Type': 'application/json',
            Accept: 'application/json, text/event-stream',
            Authorization: 'Bearer ${token}',
            'Toolgate-Context': '{"user_id":"u-1"}',
          },
          body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list', params: {} }),
        }).then(async (res) => ({ status: res.status, names: (await res.json()).result.tools.map((t) => t.name) }),
                (error) => ({ failed: String(error) }))`,
      );
    } finally {
      await page.close();
    }
  }

  it('calls /mcp from an allowed origin', async () => {
    expect(await listFrom(originOf(allowedPages))).toEqual({
      status: 200,
      names: ['mail-send', 'notes-search', 'refunds-issue', 'tickets-read'],
    });
  });

  it('is refused from another origin', async () => {
    expect(await listFrom(originOf(otherPages))).toEqual({ failed: expect.stringContaining('Failed to fetch') });
  });
});
