import { once } from 'node:events';
import { connect, type AddressInfo } from 'node:net';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openDatabase } from '../src/db/database.js';
import { hasPostgresServer } from './helpers/database.js';
import { TestBackend } from './helpers/backend.js';
import { openapi } from './helpers/contract.js';
import { AppClient, startHarness, type Harness } from './helpers/harness.js';
import { TcpProxy } from './helpers/tcp-proxy.js';
import { tokens } from './helpers/tokens.js';
import { grantTool, newRunId, registerTool } from './helpers/world.js';

let h: Harness;
beforeAll(async () => {
  h = await startHarness({ TOOLGATE_BODY_LIMIT_BYTES: '2048' });
});
afterAll(() => h.close());

describe('HTTP conventions', () => {
  it('answers an unknown route with 404 not_found in the error envelope', async () => {
    const res = await h.client.app.inject({ method: 'GET', url: '/nope' });
    expect(res.statusCode).toBe(404);
    expect(res.json()).toEqual({ error: { code: 'not_found', message: 'no route GET /nope', details: {} } });
  });

  it('answers malformed JSON with 400 invalid_request, never 500', async () => {
    const res = await h.client.app.inject({
      method: 'POST',
      url: '/whoami',
      headers: { authorization: `Bearer ${tokens.platform()}`, 'content-type': 'application/json' },
      payload: '{"broken": ',
    });
    expect(res.statusCode).toBe(400);
    expect(res.json().error.code).toBe('invalid_request');
  });

  it('answers an oversized body with 413 payload_too_large', async () => {
    const res = await h.client.app.inject({
      method: 'POST',
      url: '/whoami',
      headers: { 'content-type': 'application/json' },
      payload: JSON.stringify({ blob: 'x'.repeat(4096) }),
    });
    expect(res.statusCode).toBe(413);
    expect(res.json().error.code).toBe('payload_too_large');
  });

  it('answers an oversized body with a documented 413 on every route that takes one', async () => {
    const agentOnly = new Set([
      'POST /runs/execute',
      'POST /runs/{run_id}/complete',
      'POST /runs/{run_id}/handoffs',
      'POST /mcp',
    ]);
    const operations = Object.entries(openapi.paths).flatMap(([path, item]) =>
      ['post', 'put', 'patch', 'delete']
        .filter((method) => method in item)
        .map((method) => `${method.toUpperCase()} ${path}`),
    );
    expect(operations.length).toBeGreaterThan(10);
    for (const operation of operations) {
      const [method, path] = operation.split(' ') as [string, string];
      const token = agentOnly.has(operation) ? tokens.agent('big.agent', { tenant: 't-big' }) : tokens.platform();
      // Checked against openapi.yaml as every response is: a 413 it does not document fails here.
      const res = await h.client.request(method, path.replace(/\{[^}]+\}/g, 'x1'), {
        token,
        body: { blob: 'x'.repeat(4096) },
      });
      expect(res.status, operation).toBe(413);
      expect(res.body.error.code, operation).toBe('payload_too_large');
    }
  });

  it.each(['/health', '/ready', '/metrics', '/openapi.json'])(
    'ignores a query parameter on %s, but refuses one no record could keep, as documented',
    async (path) => {
      expect((await h.client.get(path, { query: { x: 'y' } })).status).toBe(200);
      const res = await h.client.get(path, { query: { x: 'a\u0000b' } });
      expect(res.status).toBe(400);
      expect(res.body.error).toMatchObject({ code: 'invalid_request', details: { issues: [{ field: 'query.x' }] } });
    },
  );

  it('echoes a sane x-request-id and mints one otherwise', async () => {
    const given = await h.client.get('/health', { headers: { 'x-request-id': 'req-123' } });
    expect(given.headers['x-request-id']).toBe('req-123');
    const minted = await h.client.get('/health', { headers: { 'x-request-id': 'bad id with spaces' } });
    expect(minted.headers['x-request-id']).toMatch(/^[0-9a-f-]{36}$/);
  });

  it.each([
    ['a malformed URL', '/tools/%E0%A4%A', 'FST_ERR_BAD_URL'],
    ['a path segment over the length limit', `/tools/${'a'.repeat(300)}`, 'FST_ERR_MAX_PARAM_LENGTH'],
  ])('echoes or mints x-request-id on %s, refused before routing', async (_name, url, reason) => {
    const given = await h.client.get(url, { headers: { 'x-request-id': 'req-before-routing' } });
    expect(given.status).toBe(400);
    expect(given.body.error).toMatchObject({ code: 'invalid_request', details: { reason } });
    expect(given.headers['x-request-id']).toBe('req-before-routing');
    const minted = await h.client.get(url);
    expect(minted.headers['x-request-id']).toMatch(/^[0-9a-f-]{36}$/);
  });

  it('records the W3C trace id of a traceparent header on audit events', async () => {
    const traceId = '4bf92f3577b34da6a3ce929d0e0e4736';
    await h.client.get('/audit', {
      token: tokens.agent('tracer.agent', { tenant: 't-trace' }),
      headers: { traceparent: `00-${traceId}-00f067aa0ba902b7-01` },
    });
    const events = await h.client.get('/audit', { token: tokens.platform(), query: { agent_id: 'tracer.agent' } });
    expect(events.body.items[0].trace_id).toBe(traceId);
  });

  it('refuses a malformed id in an audit filter as invalid_request before it reaches the database', async () => {
    for (const field of ['tenant_id', 'run_id', 'tool_id', 'agent_id', 'event_type']) {
      const res = await h.client.get('/audit', { token: tokens.platform(), query: { [field]: 'x\u0000y' } });
      expect(res.status, field).toBe(400);
      expect(res.body.error, field).toMatchObject({
        code: 'invalid_request',
        details: { issues: [{ field: `query.${field}` }] },
      });
    }
  });

  it('audits a tenant-operator naming another tenant in GET /audit, but not a malformed tenant_id', async () => {
    const operator = tokens.tenantOperator('t-audit-filter');
    const malformed = await h.client.get('/audit', { token: operator, query: { tenant_id: 'x\u0000y' } });
    expect(malformed.status).toBe(400);
    expect(malformed.body.error).toMatchObject({
      code: 'invalid_request',
      details: { issues: [{ field: 'query.tenant_id' }] },
    });
    const other = await h.client.get('/audit', { token: operator, query: { tenant_id: 'x-y' } });
    expect(other.status).toBe(404);
    const events = await h.client.get('/audit', {
      token: tokens.platform(),
      query: { event_type: 'security.cross_tenant_attempt', tenant_id: 't-audit-filter' },
    });
    expect(
      events.body.items.map((e: { details: { requested_tenant_id: string } }) => e.details.requested_tenant_id),
    ).toEqual(['x-y']);
  });

  it('exposes Prometheus metrics, including request durations', async () => {
    await h.client.get('/health');
    const res = await h.client.get('/metrics');
    expect(res.status).toBe(200);
    expect(res.text).toContain('toolgate_http_request_duration_seconds_bucket');
    expect(res.text).toContain('route="/health"');
    expect(res.text).toContain('toolgate_audit_events_committed_total');
    expect(res.text).toMatch(/toolgate_registry_catalog_age_seconds \d/);
    expect(res.text).toMatch(/toolgate_kill_switch_snapshot_age_seconds \d/);
    // Every statement sent counts: the requests above read the database.
    const statements = Number(/toolgate_db_statements_total (\d+)/.exec(res.text)?.[1]);
    expect(statements).toBeGreaterThan(0);
    await h.client.get('/ready');
    const after = Number(/toolgate_db_statements_total (\d+)/.exec((await h.client.get('/metrics')).text)?.[1]);
    expect(after).toBeGreaterThan(statements);
  });
});

/** Sends raw bytes on a fresh connection and returns everything the gateway answers until it closes. */
async function rawExchange(
  port: number,
  bytes: string,
): Promise<{ head: string; headers: Record<string, string>; body: string; raw: string }> {
  const socket = connect(port, '127.0.0.1');
  await once(socket, 'connect');
  let reply = '';
  socket.on('data', (chunk: Buffer) => (reply += chunk.toString('utf8')));
  socket.on('error', () => undefined);
  socket.write(bytes);
  await once(socket, 'close');
  const [head = '', body = ''] = reply.split('\r\n\r\n');
  const [statusLine = '', ...lines] = head.split('\r\n');
  const headers = Object.fromEntries(
    lines.map((line) => [line.slice(0, line.indexOf(':')).toLowerCase(), line.slice(line.indexOf(':') + 1).trim()]),
  );
  return { head: statusLine, headers, body, raw: reply };
}

describe("requests Node's HTTP parser refuses", () => {
  let port: number;
  beforeAll(async () => {
    await h.client.app.listen({ port: 0, host: '127.0.0.1' });
    port = (h.client.app.server.address() as AddressInfo).port;
  });

  it.each([
    ['a request line that is garbage', 'NOT HTTP AT ALL\r\n\r\n'],
    ['a malformed header line', 'GET /health HTTP/1.1\r\nhost: toolgate\r\nthis is no header\r\n\r\n'],
    ['a header name with a space', 'GET /health HTTP/1.1\r\nhost: toolgate\r\nx bad: 1\r\n\r\n'],
  ])('answers %s with 400 invalid_request in the error envelope, with a request id', async (_name, bytes) => {
    const reply = await rawExchange(port, bytes);
    expect(reply.head).toMatch(/^HTTP\/1\.1 400 /);
    expect(reply.headers['x-request-id']).toMatch(/^[0-9a-f-]{36}$/);
    expect(reply.headers['content-type']).toMatch(/^application\/json/);
    expect(reply.headers.connection).toBe('close');
    const body = JSON.parse(reply.body);
    expect(body).toEqual({
      error: {
        code: 'invalid_request',
        message: 'the request is not valid HTTP',
        details: { reason: expect.stringMatching(/^HPE_/) },
      },
    });
    expect(Number(reply.headers['content-length'])).toBe(Buffer.byteLength(reply.body));
  });

  it('answers headers over the size limit with 400 invalid_request, with a request id', async () => {
    const reply = await rawExchange(
      port,
      `GET /health HTTP/1.1\r\nhost: toolgate\r\nx-big: ${'a'.repeat(20_000)}\r\n\r\n`,
    );
    expect(reply.head).toMatch(/^HTTP\/1\.1 400 /);
    expect(reply.headers['x-request-id']).toMatch(/^[0-9a-f-]{36}$/);
    expect(JSON.parse(reply.body)).toMatchObject({
      error: { code: 'invalid_request', details: { reason: 'HPE_HEADER_OVERFLOW' } },
    });
  });

  it('still serves well-formed requests on the same server', async () => {
    const reply = await rawExchange(port, 'GET /health HTTP/1.1\r\nhost: toolgate\r\nconnection: close\r\n\r\n');
    expect(reply.head).toMatch(/^HTTP\/1\.1 200 /);
    expect(reply.headers['x-request-id']).toMatch(/^[0-9a-f-]{36}$/);
  });

  it('answers the good requests pipelined before a refused one first, each in its turn, then the refusal', async () => {
    const good = 'GET /health HTTP/1.1\r\nhost: toolgate\r\n\r\n';
    const reply = await rawExchange(
      port,
      `${good}GET /ready HTTP/1.1\r\nhost: toolgate\r\n\r\nGET /health HTTP/1.1\r\nthis is no header\r\n\r\n`,
    );
    // Read as a client reads: each answer is taken for the request in the same position.
    const statuses = [...reply.raw.matchAll(/HTTP\/1\.1 (\d{3}) /g)].map((match) => match[1]);
    expect(statuses).toEqual(['200', '200', '400']);
    expect(reply.raw).toContain('{"status":"ok"}');
    expect(reply.raw).toContain(`{"status":"ready","database":"${hasPostgresServer ? 'postgres' : 'pglite'}"}`);
    expect(reply.raw).toContain('"reason":"HPE_INVALID_HEADER_TOKEN"');
  });

  it('refuses a connection once, however much more it sends while the answer before the refusal is still owed', async () => {
    const backend = await new TestBackend().start();
    const warnings: Error[] = [];
    const onWarning = (warning: Error) => warnings.push(warning);
    process.on('warning', onWarning);
    try {
      await registerTool(h.client, {
        id: 'parser.held',
        backendUrl: `${backend.url}/gate`,
        allowed_agents: ['parser.agent'],
        category: 'read_only',
        cost_units: 0,
      });
      await grantTool(h.client, { tenant: 'parser-tenant', agent: 'parser.agent', tool: 'parser.held' });
      const body = JSON.stringify({
        run_id: newRunId(),
        context: {},
        plan: [{ tool_id: 'parser.held', input: { q: 'held' } }],
      });
      const socket = connect(port, '127.0.0.1');
      await once(socket, 'connect');
      let reply = '';
      socket.on('data', (chunk: Buffer) => (reply += chunk.toString('utf8')));
      socket.on('error', () => undefined);
      const closed = once(socket, 'close');
      const token = tokens.agent('parser.agent', { tenant: 'parser-tenant' });
      socket.write(
        `POST /runs/execute HTTP/1.1\r\nhost: toolgate\r\nauthorization: Bearer ${token}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}` +
          'GET /health HTTP/1.1\r\nthis is no header\r\n\r\n',
      );
      await backend.waitForHits('/gate', 1);
      // While the run is held at its backend, the client keeps sending: each chunk fails the parser again.
      for (let i = 0; i < 15; i += 1) {
        socket.write('still no header\r\n');
        await new Promise((resolve) => setTimeout(resolve, 5));
      }
      backend.openGate();
      await closed;
      const statuses = [...reply.matchAll(/HTTP\/1\.1 (\d{3}) /g)].map((match) => match[1]);
      expect(statuses).toEqual(['200', '400']);
      expect(warnings.map((warning) => warning.name)).not.toContain('MaxListenersExceededWarning');
    } finally {
      process.off('warning', onWarning);
      await backend.close();
    }
  });
});

describe.skipIf(!hasPostgresServer)('when the database goes away (needs a PostgreSQL server)', () => {
  it('fails closed: /ready and audited routes answer 503 gateway_unavailable, and it recovers', async () => {
    const server = new URL(h.db.url!);
    const proxy = await new TcpProxy(server.hostname, Number(server.port || 5432)).start();
    const database = await openDatabase({
      databaseUrl: proxy.urlFor(h.db.url!),
      dataDir: '',
      poolSize: 2,
      logger: pino({ level: 'silent' }),
    });
    const client = await AppClient.start(database);
    try {
      expect((await client.get('/ready')).status).toBe(200);
      proxy.cutConnections();
      const ready = await client.get('/ready');
      expect(ready.status).toBe(503);
      expect(ready.body.error.code).toBe('gateway_unavailable');
      const audit = await client.get('/audit', { token: tokens.platform() });
      expect(audit.status).toBe(503);
      expect(audit.body.error.code).toBe('gateway_unavailable');
      // An agent's escalation attempt cannot be recorded, so it is refused as unavailable, not let through.
      const escalation = await client.get('/audit', { token: tokens.agent('a.one', { tenant: 't1' }) });
      expect(escalation.status).toBe(503);
      expect((await client.get('/health')).status).toBe(200);
      proxy.restore();
      let recovered = 0;
      for (let i = 0; i < 50 && recovered !== 200; i += 1) {
        recovered = (await client.get('/audit', { token: tokens.platform() })).status;
        if (recovered !== 200) await new Promise((r) => setTimeout(r, 100));
      }
      expect(recovered).toBe(200);
    } finally {
      await client.close();
      await database.close();
      await proxy.close();
    }
  });

  it('answers /ready without waiting out a ping a silent partition holds: ready while its snapshots are confirmed, then not', async () => {
    const server = new URL(h.db.url!);
    const proxy = await new TcpProxy(server.hostname, Number(server.port || 5432)).start();
    const database = await openDatabase({
      databaseUrl: proxy.urlFor(h.db.url!),
      dataDir: '',
      poolSize: 10,
      logger: pino({ level: 'silent' }),
    });
    // Confirmations every 100 ms: the snapshots are seconds away from their 5 s bound when the ping is given up.
    const client = await AppClient.start(database, {
      TOOLGATE_KILL_SWITCH_POLL_MS: '100',
      TOOLGATE_REGISTRY_REFRESH_MS: '100',
    });
    try {
      // Idle pooled connections, which the partition will leave open and silent.
      await Promise.all(Array.from({ length: 5 }, () => client.get('/ready')));
      proxy.freeze();
      // The ping hangs on a silent connection (query timeout 20 s). Like a slow database, that
      // alone does not make the replica unready while its snapshots are confirmed within bound.
      const during = await client.get('/ready');
      expect(during.status).toBe(200);
      expect(during.body).toEqual({ status: 'ready', database: 'postgres' });
      // Once they are not, it is unready, answered from what it knows.
      let ready = during;
      for (let i = 0; i < 100 && ready.status === 200; i += 1) {
        ready = await client.get('/ready');
        if (ready.status === 200) await new Promise((r) => setTimeout(r, 100));
      }
      expect(ready.status).toBe(503);
      expect(ready.body.error).toMatchObject({ code: 'gateway_unavailable', details: { check: 'snapshot' } });
      proxy.restore();
      for (let i = 0; i < 100 && ready.status !== 200; i += 1) {
        ready = await client.get('/ready');
        if (ready.status !== 200) await new Promise((r) => setTimeout(r, 100));
      }
      expect(ready.status).toBe(200);
    } finally {
      proxy.restore();
      await client.close();
      await database.close();
      await proxy.close();
    }
  });
});
