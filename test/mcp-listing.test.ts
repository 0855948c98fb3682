import { Client, ProtocolError, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ListenerBus } from '../src/mcp/listener-bus.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { signToken, tokens } from './helpers/tokens.js';
import { until } from './helpers/waits.js';
import { grantTool, registerTool } from './helpers/world.js';

/**
 * What an agent's MCP list holds and who hears it change (SPEC §12.1): the tools it may use and holds
 * a live grant for; grant changes told to that agent only, policy changes to that tenant only; listen
 * streams capped per agent and per process, and ended when their token expires.
 */
const A = 'tenant-mcp-list-a';
const B = 'tenant-mcp-list-b';
const A1 = 'mcp.lister-one';
const A2 = 'mcp.lister-two';
const B1 = 'mcp.lister-b';
const PER_AGENT = 2;
const PER_PROCESS = 5;

let h: Harness;
let url: URL;
const clients: Client[] = [];

async function connect(token: string): Promise<Client> {
  const client = new Client({ name: 'lister', version: '1.0.0' }, { versionNegotiation: { mode: 'auto' } });
  await client.connect(
    new StreamableHTTPClientTransport(url, { requestInit: { headers: { authorization: `Bearer ${token}` } } }),
  );
  clients.push(client);
  return client;
}

/** A connected client that counts the list changes it hears. */
async function listener(agent: string, tenant: string): Promise<{ client: Client; heard: () => number }> {
  const client = await connect(tokens.agent(agent, { tenant }));
  let heard = 0;
  client.setNotificationHandler('notifications/tools/list_changed', async () => {
    heard += 1;
  });
  await client.listen({ toolsListChanged: true });
  return { client, heard: () => heard };
}

const names = async (client: Client) =>
  (await client.listTools(undefined, { cacheMode: 'refresh' })).tools.map((tool) => tool.name);

beforeAll(async () => {
  h = await startHarness({
    TOOLGATE_MCP_MAX_LISTEN_STREAMS_PER_AGENT: String(PER_AGENT),
    TOOLGATE_MCP_MAX_LISTEN_STREAMS: String(PER_PROCESS),
  });
  await h.client.app.listen({ port: 0, host: '127.0.0.1' });
  url = new URL(`http://127.0.0.1:${(h.client.app.server.address() as { port: number }).port}/mcp`);
  const everyone = [A1, A2, B1];
  for (const id of ['listed.granted', 'listed.later', 'listed.revoked', 'listed.never'])
    await registerTool(h.client, { id, backendUrl: 'http://127.0.0.1:9/echo', allowed_agents: everyone });
  await grantTool(h.client, { tenant: A, agent: A1, tool: 'listed.granted' });
  await grantTool(h.client, { tenant: A, agent: A1, tool: 'listed.revoked' });
  await grantTool(h.client, { tenant: A, agent: A2, tool: 'listed.granted' });
  await grantTool(h.client, { tenant: B, agent: B1, tool: 'listed.granted' });
});

afterAll(async () => {
  for (const client of clients) await client.close().catch(() => undefined);
  await h?.close();
});

describe('the list', () => {
  it('holds only tools the agent holds a live grant for, whatever GET /tools offers it', async () => {
    const client = await connect(tokens.agent(A1, { tenant: A }));
    expect(await names(client)).toEqual(['listed-granted', 'listed-revoked']);
    const offered = await h.client.get('/tools', { token: tokens.agent(A1, { tenant: A }) });
    expect((offered.body.items as Array<{ id: string }>).map((item) => item.id)).toContain('listed.never');
  });
});

describe('who hears a change', () => {
  it('tells a grant change to that agent’s listeners only, across tenants none', async () => {
    const one = await listener(A1, A);
    const two = await listener(A2, A);
    const other = await listener(B1, B);
    await grantTool(h.client, { tenant: A, agent: A1, tool: 'listed.later' });
    await until('A1 to hear of its grant', () => one.heard() > 0);
    expect(await names(one.client)).toContain('listed-later');

    const revoked = (await h.client.get('/grants', { token: tokens.tenantOperator(A), query: { agent_id: A1 } })).body
      .items as Array<{ id: string; tool_id: string }>;
    const grant = revoked.find((g) => g.tool_id === 'listed.revoked')!;
    const heardBefore = one.heard();
    const res = await h.client.post(`/grants/${grant.id}/revoke`, {
      token: tokens.tenantOperator(A),
      body: { reason: 'not needed' },
    });
    expect(res.status).toBe(200);
    await until('A1 to hear of the revocation', () => one.heard() > heardBefore);
    expect(await names(one.client)).not.toContain('listed-revoked');

    // B's policy changes: only B's listener hears; A's were told nothing of either change.
    const policy = await h.client.put(`/tenants/${B}/policy`, {
      token: tokens.platform(),
      body: { external_call_enabled: true },
    });
    expect(policy.status).toBe(200);
    await until('B1 to hear of its tenant’s policy', () => other.heard() > 0);
    expect(two.heard()).toBe(0);
    expect(other.heard()).toBe(1);
    for (const { client } of [one, two, other]) await client.close();
  });
});

describe('listen streams', () => {
  it('are capped per agent: one more is refused, another agent’s is not', async () => {
    const open = [await listener(A2, A), await listener(A2, A)];
    const refused = await connect(tokens.agent(A2, { tenant: A }));
    const error = await refused.listen({ toolsListChanged: true }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(ProtocolError);
    expect((error as ProtocolError).message).toMatch(/Subscription limit reached/);
    const elsewhere = await listener(B1, B);
    for (const { client } of [...open, elsewhere]) await client.close();
  });

  it('are capped per process', async () => {
    const open = [];
    for (const [agent, tenant] of [
      [A1, A],
      [A1, A],
      [A2, A],
      [A2, A],
      [B1, B],
    ] as const)
      open.push(await listener(agent, tenant));
    const refused = await connect(tokens.agent(B1, { tenant: B }));
    const error = await refused.listen({ toolsListChanged: true }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(Error);
    for (const { client } of open) await client.close();
  });

  it('end when their token expires', async () => {
    const token = signToken({ sub: A1, tenant_id: A, kind: 'agent', exp: Math.floor(Date.now() / 1000) + 2 });
    const client = await connect(token);
    const subscription = await client.listen({ toolsListChanged: true });
    expect(await subscription.closed).not.toBe('local');
  });
});

describe('the listener bus', () => {
  it('knows whose each subscription is, and tells each change only to those it concerns', async () => {
    const bus = new ListenerBus(() => undefined);
    const heard: string[] = [];
    const subscribeAs = (tenantId: string, agentId: string) =>
      bus.within({ tenantId, agentId }, async () => {
        await Promise.resolve();
        return bus.subscribe(() => heard.push(`${tenantId}/${agentId}`));
      });
    const stop = await subscribeAs('t1', 'a1');
    await subscribeAs('t1', 'a2');
    await subscribeAs('t2', 'a1');
    bus.subscribe(() => heard.push('nobody'));
    expect(bus.countOf({ tenantId: 't1', agentId: 'a1' })).toBe(1);
    expect(bus.listeners()).toHaveLength(3);

    bus.publishTo((who) => who.tenantId === 't1' && who.agentId === 'a1', { kind: 'tools_list_changed' });
    expect(heard.splice(0)).toEqual(['t1/a1']);
    bus.publishTo((who) => who.tenantId === 't2', { kind: 'tools_list_changed' });
    expect(heard.splice(0)).toEqual(['t2/a1']);
    bus.publish({ kind: 'tools_list_changed' });
    expect(heard.splice(0).sort()).toEqual(['nobody', 't1/a1', 't1/a2', 't2/a1']);
    stop();
    expect(bus.countOf({ tenantId: 't1', agentId: 'a1' })).toBe(0);
  });
});
