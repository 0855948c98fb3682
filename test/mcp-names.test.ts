import { createHash } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MCP_NAME_PATTERN, mcpNameOf } from '../src/registry/mcp-names.js';
import { TestBackend } from './helpers/backend.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';
import { grantTool, registerTool, toolBody } from './helpers/world.js';

/** MCP tool names every model API accepts (SPEC §12.1, docs/mcp.md#tool-names), and what registration refuses for them. */
const T = 'tenant-mcp-names';
const AGENT = 'mcp.naming-agent';

describe('the name mapping', () => {
  it('keeps an id that is a valid name, turns dots into hyphens, and cuts a long id to 64 with a hash of it', () => {
    expect(mcpNameOf('echo')).toBe('echo');
    expect(mcpNameOf('schema_plain')).toBe('schema_plain');
    expect(mcpNameOf('schema.plain')).toBe('schema-plain');
    const long = `a${'.b'.repeat(60)}`;
    const hash = createHash('sha256').update(long).digest('hex').slice(0, 8);
    expect(mcpNameOf(long)).toBe(`${long.replaceAll('.', '-').slice(0, 55)}-${hash}`);
    expect(mcpNameOf(long)).toHaveLength(64);
    expect(mcpNameOf(long)).toBe(mcpNameOf(long));
    expect(mcpNameOf(`${long}.c`)).not.toBe(mcpNameOf(long));
    for (const id of ['echo', 'a.b.c', 'x'.repeat(64), 'x'.repeat(65), long, `${'y'.repeat(100)}.z`])
      expect(mcpNameOf(id)).toMatch(MCP_NAME_PATTERN);
  });
});

describe('over a gateway', () => {
  let h: Harness;
  let backend: TestBackend;
  let base: string;
  const agent = tokens.agent(AGENT, { tenant: T });

  async function rpc(method: string, params: Record<string, unknown>) {
    const res = await fetch(`${base}/mcp`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
        authorization: `Bearer ${agent}`,
      },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method, params }),
    });
    return (await res.json()) as {
      result?: { tools?: Array<{ name: string; _meta: Record<string, { id: string }> }>; isError?: boolean };
      error?: { code: number; message: string };
    };
  }

  beforeAll(async () => {
    h = await startHarness();
    backend = await new TestBackend().start();
    await h.client.app.listen({ port: 0, host: '127.0.0.1' });
    base = `http://127.0.0.1:${(h.client.app.server.address() as { port: number }).port}`;
    for (const id of ['schema.plain', 'schema_plain']) {
      await registerTool(h.client, { id, backendUrl: `${backend.url}/echo`, allowed_agents: [AGENT] });
      await grantTool(h.client, { tenant: T, agent: AGENT, tool: id });
    }
  });

  afterAll(async () => {
    await backend?.close();
    await h?.close();
  });

  it('lists ids that differ only by . and _ under distinct names a model accepts, and calls each by its name or id', async () => {
    const listed = await rpc('tools/list', {});
    expect(listed.result?.tools?.map((tool) => [tool.name, tool._meta['dev.toolgate/tool']!.id])).toEqual([
      ['schema-plain', 'schema.plain'],
      ['schema_plain', 'schema_plain'],
    ]);
    for (const name of ['schema-plain', 'schema.plain', 'schema_plain']) {
      const called = await rpc('tools/call', { name, arguments: { q: `by-${name}` } });
      expect(called.result?.isError, JSON.stringify(called)).toBe(false);
    }
    expect(backend.hits).toHaveLength(3);
  });

  it('refuses a new id whose name another id already has with 409 tool_name_conflict', async () => {
    // A long id is named by its first 55 characters and a hash; an id of 64 can be made to match it.
    let long = '';
    let hash = '';
    // A tool id segment starts with a letter: find a long id whose hash does.
    for (let i = 0; !/^[a-f]/.test(hash); i += 1) {
      long = `${'n'.repeat(55)}.long${'q'.repeat(i + 5)}`;
      hash = createHash('sha256').update(long).digest('hex').slice(0, 8);
    }
    const crafted = `${'n'.repeat(55)}.${hash}`;
    expect(crafted).toHaveLength(64);
    expect(mcpNameOf(crafted)).toBe(mcpNameOf(long));
    await registerTool(h.client, { id: long, backendUrl: `${backend.url}/echo` });
    const refused = await h.client.post('/tools', { token: tokens.platform(), body: toolBody({ id: crafted }) });
    expect(refused.status).toBe(409);
    expect(refused.body.error).toMatchObject({
      code: 'tool_name_conflict',
      details: { tool_id: crafted, mcp_name: mcpNameOf(long), conflicting_tool_id: long },
    });
    // A new version of a registered id is no new name.
    await registerTool(h.client, { id: long, version: '1.1.0', backendUrl: `${backend.url}/echo` });
  });

  it('refuses a new version whose input schema is not an object schema with 400', async () => {
    for (const input_schema of [{ type: 'string' }, true, { properties: { q: {} } }]) {
      const refused = await h.client.post('/tools', {
        token: tokens.platform(),
        body: toolBody({ id: 'not.an.object', input_schema }),
      });
      expect(refused.status).toBe(400);
      expect(refused.body.error).toMatchObject({
        code: 'invalid_request',
        details: { field: 'body.input_schema', reason: 'input_schema_not_object' },
      });
    }
  });
});
