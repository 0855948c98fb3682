import { Client, ProtocolError, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from '../src/config/config.js';
import { openDatabase } from '../src/db/database.js';
import { TestBackend } from './helpers/backend.js';
import { hasPostgresServer } from './helpers/database.js';
import { AppClient, startHarness, type Harness } from './helpers/harness.js';
import { ed25519Pem } from './helpers/signing-keys.js';
import { TcpProxy } from './helpers/tcp-proxy.js';
import { signToken, tokens } from './helpers/tokens.js';
import { until } from './helpers/waits.js';
import { grantTool, registerTool } from './helpers/world.js';

/** Production refuses to start without a key to sign the audit log's checkpoints. */
const AUDIT_KEY = { TOOLGATE_AUDIT_SIGNING_KEY: ed25519Pem().privatePem };

/** The MCP door as deployments configure it (SPEC §12 `TOOLGATE_MCP_*`), and when its database goes away. */
const T = 'tenant-mcp-deploy';
const AGENT = 'mcp.deployed-agent';
const RESOURCE = 'https://gateway.example.com/mcp';

describe('TOOLGATE_MCP_* configuration, validated at start-up', () => {
  it('defaults to an enabled door with no audience, authorization servers or browser origins', () => {
    expect(loadConfig({}).mcp).toEqual({
      enabled: true,
      resource: undefined,
      authorizationServers: [],
      allowedOrigins: [],
      hostUrls: true,
      maxListenStreamsPerAgent: 8,
      maxListenStreams: 1024,
    });
    // In production no URL is ever built from a request's Host.
    expect(loadConfig({ NODE_ENV: 'production', TOOLGATE_JWT_SECRET: 'x'.repeat(32), ...AUDIT_KEY }).mcp.hostUrls).toBe(
      false,
    );
  });

  it('reads lists and switches', () => {
    const config = loadConfig({
      TOOLGATE_MCP_ENABLED: 'false',
      TOOLGATE_MCP_RESOURCE: RESOURCE,
      TOOLGATE_MCP_AUTHORIZATION_SERVERS: ' https://auth.example.com , https://login.example.org/tenant ',
      TOOLGATE_MCP_ALLOWED_ORIGINS: 'https://app.example.com,http://localhost:5173',
      TOOLGATE_MCP_MAX_LISTEN_STREAMS_PER_AGENT: '2',
      TOOLGATE_MCP_MAX_LISTEN_STREAMS: '50',
    });
    expect(config.mcp).toEqual({
      enabled: false,
      resource: RESOURCE,
      authorizationServers: ['https://auth.example.com', 'https://login.example.org/tenant'],
      allowedOrigins: ['https://app.example.com', 'http://localhost:5173'],
      hostUrls: true,
      maxListenStreamsPerAgent: 2,
      maxListenStreams: 50,
    });
  });

  it.each([
    ['TOOLGATE_MCP_ENABLED', 'yes'],
    ['TOOLGATE_MCP_RESOURCE', 'gateway.example.com/mcp'],
    ['TOOLGATE_MCP_RESOURCE', 'https://gateway.example.com/mcp#frag'],
    ['TOOLGATE_MCP_AUTHORIZATION_SERVERS', 'https://auth.example.com,ftp://files.example.com'],
    ['TOOLGATE_MCP_ALLOWED_ORIGINS', 'https://app.example.com/'],
    ['TOOLGATE_MCP_ALLOWED_ORIGINS', '*'],
    ['TOOLGATE_MCP_MAX_LISTEN_STREAMS_PER_AGENT', '0'],
    ['TOOLGATE_MCP_MAX_LISTEN_STREAMS', 'many'],
  ])('refuses %s=%s, naming it', (name, value) => {
    expect(() => loadConfig({ [name]: value })).toThrowError(ConfigError);
    expect(() => loadConfig({ [name]: value })).toThrowError(new RegExp(name));
  });
});

describe('a gateway with a resource, authorization servers and an allowed origin', () => {
  let h: Harness;
  let base: string;
  const post = (token: string, headers: Record<string, string> = {}) =>
    fetch(`${base}/mcp`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
        authorization: `Bearer ${token}`,
        ...headers,
      },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list', params: {} }),
    });
  const agentWith = (aud: unknown) =>
    signToken({ sub: AGENT, tenant_id: T, kind: 'agent', ...(aud === undefined ? {} : { aud }) });

  beforeAll(async () => {
    h = await startHarness({
      TOOLGATE_MCP_RESOURCE: RESOURCE,
      TOOLGATE_MCP_AUTHORIZATION_SERVERS: 'https://auth.example.com',
      TOOLGATE_MCP_ALLOWED_ORIGINS: 'https://app.example.com',
    });
    await h.client.app.listen({ port: 0, host: '127.0.0.1' });
    base = `http://127.0.0.1:${(h.client.app.server.address() as { port: number }).port}`;
  });
  afterAll(() => h?.close());

  it('serves RFC 9728 metadata naming the resource and its authorization servers', async () => {
    const res = await h.client.get('/.well-known/oauth-protected-resource/mcp');
    expect(res.body).toEqual({
      resource: RESOURCE,
      authorization_servers: ['https://auth.example.com'],
      bearer_methods_supported: ['header'],
      resource_name: 'toolgate',
    });
  });

  it('refuses a token whose aud does not name the resource with 401 and the pointer at the resource’s origin', async () => {
    for (const token of [
      agentWith(undefined),
      agentWith('https://elsewhere.example.com/mcp'),
      agentWith(['https://gateway.example.com']),
    ]) {
      const res = await post(token);
      expect(res.status).toBe(401);
      expect(res.headers.get('www-authenticate')).toBe(
        'Bearer error="invalid_token", resource_metadata="https://gateway.example.com/.well-known/oauth-protected-resource/mcp"',
      );
    }
  });

  it('serves a token whose aud names the resource, also among others, and from an allowed browser origin', async () => {
    expect((await post(agentWith(RESOURCE))).status).toBe(200);
    expect((await post(agentWith(['https://other.example.com', RESOURCE]))).status).toBe(200);
    expect((await post(agentWith(RESOURCE), { origin: 'https://app.example.com' })).status).toBe(200);
    expect((await post(agentWith(RESOURCE), { origin: 'https://app.example.com.evil.example' })).status).toBe(403);
  });
});

describe('in production with no resource configured', () => {
  it('builds no URL from Host: a bare Bearer challenge, and no metadata', async () => {
    const h = await startHarness({ NODE_ENV: 'production', ...AUDIT_KEY });
    try {
      const res = await h.client.app.inject({
        method: 'POST',
        url: '/mcp',
        headers: { host: 'evil.example.com', 'content-type': 'application/json' },
        payload: { jsonrpc: '2.0', id: 1, method: 'tools/list', params: {} },
      });
      expect(res.statusCode).toBe(401);
      expect(res.headers['www-authenticate']).toBe('Bearer');
      const metadata = await h.client.get('/.well-known/oauth-protected-resource/mcp', {
        headers: { host: 'evil.example.com' },
      });
      expect(metadata.status).toBe(404);
      expect(metadata.text).not.toContain('evil.example.com');
    } finally {
      await h.close();
    }
  });

  it('with TOOLGATE_MCP_RESOURCE, names it whatever the Host, and checks aud', async () => {
    const h = await startHarness({ NODE_ENV: 'production', TOOLGATE_MCP_RESOURCE: RESOURCE, ...AUDIT_KEY });
    try {
      const metadata = await h.client.get('/.well-known/oauth-protected-resource/mcp', {
        headers: { host: 'evil.example.com' },
      });
      expect(metadata.body.resource).toBe(RESOURCE);
      const res = await h.client.app.inject({
        method: 'POST',
        url: '/mcp',
        headers: {
          host: 'evil.example.com',
          'content-type': 'application/json',
          accept: 'application/json, text/event-stream',
          authorization: `Bearer ${tokens.agent(AGENT, { tenant: T })}`,
        },
        payload: { jsonrpc: '2.0', id: 1, method: 'tools/list', params: {} },
      });
      expect(res.statusCode).toBe(401);
      expect(res.headers['www-authenticate']).toContain('https://gateway.example.com/.well-known/');
    } finally {
      await h.close();
    }
  });
});

describe('a gateway with the door disabled', () => {
  it('serves neither /mcp nor its metadata', async () => {
    const h = await startHarness({ TOOLGATE_MCP_ENABLED: 'false' });
    try {
      expect(h.client.app.registeredRoutes.filter((route) => route.includes('mcp'))).toEqual([]);
      expect((await h.client.app.inject({ method: 'POST', url: '/mcp', payload: {} })).statusCode).toBe(404);
    } finally {
      await h.close();
    }
  });
});

describe('shutting down', () => {
  it('ends open listen streams, so that a listening client does not hold the gateway open', async () => {
    const h = await startHarness();
    const client = new Client({ name: 'listener', version: '1.0.0' }, { versionNegotiation: { mode: 'auto' } });
    try {
      await h.client.app.listen({ port: 0, host: '127.0.0.1' });
      const url = new URL(`http://127.0.0.1:${(h.client.app.server.address() as { port: number }).port}/mcp`);
      await client.connect(
        new StreamableHTTPClientTransport(url, {
          requestInit: { headers: { authorization: `Bearer ${tokens.agent(AGENT, { tenant: T })}` } },
        }),
      );
      const subscription = await client.listen({ toolsListChanged: true });
      const started = Date.now();
      await h.client.app.close();
      expect(Date.now() - started).toBeLessThan(5_000);
      expect(await subscription.closed).not.toBe('local');
    } finally {
      await client.close().catch(() => undefined);
      await h.close();
    }
  });
});

describe.skipIf(!hasPostgresServer)('two replicas on one database (needs a PostgreSQL server)', () => {
  it('a client listening on one replica hears of a registration made on the other, and of a tenant policy change', async () => {
    const h = await startHarness();
    const other = await AppClient.start(h.db.database);
    const client = new Client({ name: 'listener', version: '1.0.0' }, { versionNegotiation: { mode: 'auto' } });
    try {
      await other.app.listen({ port: 0, host: '127.0.0.1' });
      const url = new URL(`http://127.0.0.1:${(other.app.server.address() as { port: number }).port}/mcp`);
      await client.connect(
        new StreamableHTTPClientTransport(url, {
          requestInit: { headers: { authorization: `Bearer ${tokens.agent(AGENT, { tenant: T })}` } },
        }),
      );
      let heard = 0;
      client.setNotificationHandler('notifications/tools/list_changed', async () => {
        heard += 1;
      });
      await client.listen({ toolsListChanged: true });
      await registerTool(h.client, {
        id: 'registered.elsewhere',
        backendUrl: 'http://127.0.0.1:9/echo',
        allowed_agents: [AGENT],
      });
      await grantTool(h.client, { tenant: T, agent: AGENT, tool: 'registered.elsewhere' });
      // The registration and the grant are two changes, each told.
      await until('the registration and the grant to be heard', () => heard >= 2);
      expect((await client.listTools(undefined, { cacheMode: 'refresh' })).tools.map((tool) => tool.name)).toContain(
        'registered-elsewhere',
      );
      const before = heard;
      const policy = await h.client.put(`/tenants/${T}/policy`, {
        token: tokens.platform(),
        body: { external_call_enabled: true },
      });
      expect(policy.status).toBe(200);
      await until('the policy change to be heard', () => heard > before);
    } finally {
      await client.close().catch(() => undefined);
      await other.close();
      await h.close();
    }
  });
});

describe.skipIf(!hasPostgresServer)('when the database goes away (needs a PostgreSQL server)', () => {
  it('a call is -32603 and dispatches nothing; the door recovers with the database', async () => {
    const h = await startHarness();
    const backend = await new TestBackend().start();
    const server = new URL(h.db.url!);
    const proxy = await new TcpProxy(server.hostname, Number(server.port || 5432)).start();
    const database = await openDatabase({
      databaseUrl: proxy.urlFor(h.db.url!),
      dataDir: '',
      poolSize: 2,
      logger: pino({ level: 'silent' }),
    });
    const app = await AppClient.start(database);
    const client = new Client({ name: 'outage-test', version: '1.0.0' });
    try {
      await registerTool(app, { id: 'echo', backendUrl: `${backend.url}/echo`, allowed_agents: [AGENT] });
      await grantTool(app, { tenant: T, agent: AGENT, tool: 'echo' });
      await app.app.listen({ port: 0, host: '127.0.0.1' });
      const url = new URL(`http://127.0.0.1:${(app.app.server.address() as { port: number }).port}/mcp`);
      await client.connect(
        new StreamableHTTPClientTransport(url, {
          requestInit: { headers: { authorization: `Bearer ${tokens.agent(AGENT, { tenant: T })}` } },
        }),
      );
      expect((await client.callTool({ name: 'echo', arguments: { q: 'before' } })).isError).toBe(false);
      proxy.cutConnections();
      const error = await client.callTool({ name: 'echo', arguments: { q: 'during' } }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(ProtocolError);
      expect((error as ProtocolError).code).toBe(-32603);
      expect((error as ProtocolError).message).toContain('gateway_unavailable');
      expect(backend.hits.filter((hit) => JSON.stringify(hit.body).includes('during'))).toEqual([]);
      proxy.restore();
      let after: unknown;
      for (let i = 0; i < 50 && after === undefined; i += 1) {
        after = await client.callTool({ name: 'echo', arguments: { q: 'after' } }).catch(() => undefined);
        if (after === undefined) await new Promise((r) => setTimeout(r, 100));
      }
      expect(after).toMatchObject({ isError: false, structuredContent: { echo: { q: 'after' } } });
    } finally {
      await client.close().catch(() => undefined);
      await app.close();
      await database.close();
      await proxy.close();
      await backend.close();
      await h.close();
    }
  });
});
