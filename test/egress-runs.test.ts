import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ResolvedAddress, Resolver } from '../src/egress/resolver.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';
import { egressSchemas, grantTool, newRunId, registerTool } from './helpers/world.js';

/**
 * `external_call` tools end to end, through POST /runs/execute. 127.0.0.1 stands in for the
 * internet (an exception CIDR admits it, an injected resolver maps names to it); 127.0.0.2 is the
 * inside: nothing covers it, and its listener must never see a request.
 */
const T = 'tenant-egress';
const OFF = 'tenant-no-egress';
const AGENT = 'fetcher.agent';
const agent = tokens.agent(AGENT, { tenant: T });

interface Listener {
  port: number;
  hits: string[];
  server: http.Server;
}

async function listen(host: string, handler: http.RequestListener): Promise<Listener> {
  const hits: string[] = [];
  const server = http.createServer((req, res) => {
    hits.push(req.url ?? '');
    handler(req, res);
  });
  await new Promise<void>((resolve) => server.listen(0, host, resolve));
  return { port: (server.address() as AddressInfo).port, hits, server };
}

const table: Record<string, string[]> = {};
const resolver: Resolver = async (hostname) => {
  const entry = table[hostname];
  if (!entry) throw Object.assign(new Error(`ENOTFOUND ${hostname}`), { code: 'ENOTFOUND' });
  return entry.map((address): ResolvedAddress => ({ address, family: 4 }));
};

let h: Harness;
let outside: Listener;
let inside: Listener;

const fetchStep = (url: string) => ({ tool_id: 'web.fetch', input: { url } });

beforeAll(async () => {
  inside = await listen('127.0.0.2', (_req, res) => res.end('secret'));
  outside = await listen('127.0.0.1', (req, res) => {
    if (req.url === '/redirect-inside') {
      res.writeHead(302, { location: `http://internal.example.test:${inside.port}/admin` });
      res.end();
      return;
    }
    res.writeHead(200, { 'content-type': 'application/json', 'set-cookie': 'session=abc' });
    res.end(JSON.stringify({ hello: 'world' }));
  });
  table['api.example.test'] = ['127.0.0.1'];
  table['docs.example.test'] = ['127.0.0.1'];
  table['mixed.example.test'] = ['127.0.0.1', '10.0.0.7'];
  table['internal.example.test'] = ['127.0.0.2'];
  h = await startHarness({ TOOLGATE_EGRESS_ALLOW_CIDRS: '127.0.0.1/32' }, { resolver });
  await registerTool(h.client, {
    id: 'web.fetch',
    category: 'external_call',
    risk_level: 'medium',
    allowed_agents: [AGENT],
    egress: {
      allowed_hosts: ['*.example.test'],
      schemes: ['http'],
      methods: ['GET'],
      follow_redirects: true,
      max_redirects: 3,
    },
    ...egressSchemas,
  });
  await grantTool(h.client, { tenant: T, agent: AGENT, tool: 'web.fetch' });
  await h.client.put(`/tenants/${T}/policy`, { token: tokens.platform(), body: { external_call_enabled: true } });
});

afterAll(async () => {
  for (const listener of [outside, inside]) {
    listener?.server.closeAllConnections();
    await new Promise((resolve) => listener?.server.close(resolve));
  }
  await h?.close();
});

describe('external_call tools through /runs/execute', () => {
  it('fetches an allowed public host and returns {status, headers, body} without set-cookie', async () => {
    const res = await h.client.post('/runs/execute', {
      token: agent,
      body: { run_id: newRunId(), plan: [fetchStep(`http://api.example.test:${outside.port}/data`)] },
    });
    expect(res.status).toBe(200);
    expect(res.body.steps[0].output).toMatchObject({ status: 200, body: { hello: 'world' } });
    expect(res.body.steps[0].output.headers['set-cookie']).toBeUndefined();
  });

  it('refuses a host of which one address is private, before any connection', async () => {
    const before = outside.hits.length;
    const res = await h.client.post('/runs/execute', {
      token: agent,
      body: { run_id: newRunId(), plan: [fetchStep(`http://mixed.example.test:${outside.port}/data`)] },
    });
    expect(res.status).toBe(403);
    expect(res.body.steps[0].error.code).toBe('egress_denied');
    expect(outside.hits.length).toBe(before);
    const events = await h.client.get('/audit', {
      token: tokens.platform(),
      query: { event_type: 'security.egress_blocked' },
    });
    expect(events.body.items.length).toBeGreaterThan(0);
  });

  it('never lets a redirect reach the inside', async () => {
    const res = await h.client.post('/runs/execute', {
      token: agent,
      body: { run_id: newRunId(), plan: [fetchStep(`http://api.example.test:${outside.port}/redirect-inside`)] },
    });
    expect(res.status).toBe(403);
    expect(res.body.steps[0].error.code).toBe('egress_denied');
    expect(inside.hits).toEqual([]);
    // Refused at a redirect hop, as at the input stage: a security event, not a plain failure.
    const events = (await h.client.get('/audit', { token: tokens.platform(), query: { run_id: res.body.run_id } })).body
      .items as Array<{ event_type: string }>;
    expect(events.map((e) => e.event_type).sort()).toEqual(['run.step.dispatching', 'security.egress_blocked']);
  });

  it('narrows to a grant’s egress_domains', async () => {
    const narrowed = 'narrow.agent';
    await registerTool(h.client, {
      id: 'web.fetch',
      version: '1.0.1',
      category: 'external_call',
      risk_level: 'medium',
      allowed_agents: [AGENT, narrowed],
      egress: { allowed_hosts: ['*.example.test'], schemes: ['http'], methods: ['GET'] },
      ...egressSchemas,
    });
    await grantTool(h.client, {
      tenant: T,
      agent: narrowed,
      tool: 'web.fetch',
      capability_modifiers: { egress_domains: ['docs.example.test'] },
    });
    const token = tokens.agent(narrowed, { tenant: T });
    const allowed = await h.client.post('/runs/execute', {
      token,
      body: { run_id: newRunId(), plan: [fetchStep(`http://docs.example.test:${outside.port}/x`)] },
    });
    expect(allowed.status).toBe(200);
    const refused = await h.client.post('/runs/execute', {
      token,
      body: { run_id: newRunId(), plan: [fetchStep(`http://api.example.test:${outside.port}/x`)] },
    });
    expect(refused.status).toBe(403);
    expect(refused.body.steps[0].error.code).toBe('egress_denied');
  });

  it('is blocked for a tenant that has not enabled external calls', async () => {
    const res = await h.client.post('/runs/execute', {
      token: tokens.agent(AGENT, { tenant: OFF }),
      body: { run_id: newRunId(), plan: [fetchStep(`http://api.example.test:${outside.port}/data`)] },
    });
    expect(res.status).toBe(403);
    expect(res.body.steps[0].error.code).toBe('tool_category_blocked');
  });
});
