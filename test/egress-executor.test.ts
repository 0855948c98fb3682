import http from 'node:http';
import type { AddressInfo } from 'node:net';
import zlib from 'node:zlib';
import { afterEach, describe, expect, it } from 'vitest';
import { createEgressExecutor } from '../src/egress/egress-executor.js';
import type { EgressPolicy } from '../src/egress/egress-policy.js';
import type { ResolvedAddress, Resolver } from '../src/egress/resolver.js';

/**
 * Real listeners on loopback. 127.0.0.1 stands in for the internet (an exception CIDR admits it);
 * 127.0.0.2 is the inside: no exception covers it, and it must never see a request.
 */
const PUBLIC = '127.0.0.1';
const PRIVATE = '127.0.0.2';
const allowCidrs = [`${PUBLIC}/32`];

interface Listener {
  port: number;
  hits: Array<{ method: string; url: string; headers: http.IncomingHttpHeaders; body: string }>;
}

const servers: http.Server[] = [];

async function listen(
  host: string,
  handler: http.RequestListener = (_req, res) => res.end('ok'),
  port = 0,
): Promise<Listener> {
  const hits: Listener['hits'] = [];
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (chunk: Buffer) => (body += chunk.toString()));
    req.on('end', () => {
      hits.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, body });
      handler(req, res);
    });
  });
  servers.push(server);
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, resolve);
  });
  return { port: (server.address() as AddressInfo).port, hits };
}

afterEach(async () => {
  for (const server of servers.splice(0)) {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
});

/** A resolver from a table, counting how often each name was asked. */
function tableResolver(table: Record<string, string | string[]>) {
  const asked: Record<string, number> = {};
  const resolver: Resolver = async (hostname) => {
    asked[hostname] = (asked[hostname] ?? 0) + 1;
    const entry = table[hostname];
    if (entry === undefined) throw Object.assign(new Error(`ENOTFOUND ${hostname}`), { code: 'ENOTFOUND' });
    return [entry].flat().map((address): ResolvedAddress => ({ address, family: address.includes(':') ? 6 : 4 }));
  };
  return { resolver, asked };
}

/** An executor for which api.example.test is the (stand-in) internet. */
const apiExecutor = () =>
  createEgressExecutor({ allowCidrs, resolver: tableResolver({ 'api.example.test': PUBLIC }).resolver });

const policy = (overrides: Partial<EgressPolicy> = {}): EgressPolicy => ({
  allowed_hosts: ['*.example.test'],
  schemes: ['http'],
  ...overrides,
});

describe('egress executor: allowed calls', () => {
  it('fetches an allowed public host and returns {status, headers, body}', async () => {
    const api = await listen(PUBLIC, (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'x-api': 'v1' });
      res.end(JSON.stringify({ answer: 42 }));
    });
    const result = await apiExecutor().execute(
      { url: `http://api.example.test:${api.port}/v1/things?q=1`, headers: { Accept: 'application/json' } },
      policy(),
    );

    expect(result).toMatchObject({
      ok: true,
      output: {
        status: 200,
        headers: { 'content-type': 'application/json', 'x-api': 'v1' },
        body: { answer: 42 },
      },
    });
    expect(api.hits).toHaveLength(1);
    expect(api.hits[0]).toMatchObject({ method: 'GET', url: '/v1/things?q=1' });
    // The host the guard checked is the host the request names: pinning changes the address only.
    expect(api.hits[0]!.headers).toMatchObject({
      host: `api.example.test:${api.port}`,
      accept: 'application/json',
    });
  });

  it('returns non-JSON bodies as text, and non-2xx statuses as ordinary output', async () => {
    const api = await listen(PUBLIC, (_req, res) => {
      res.writeHead(404, { 'content-type': 'text/plain' });
      res.end('no such thing');
    });
    const executor = apiExecutor();
    expect(await executor.execute({ url: `http://api.example.test:${api.port}/` }, policy())).toMatchObject({
      ok: true,
      output: { status: 404, body: 'no such thing' },
    });
  });

  it('sends a JSON body with an allowed method', async () => {
    const api = await listen(PUBLIC, (_req, res) => res.end());
    const executor = apiExecutor();
    const result = await executor.execute(
      { url: `http://api.example.test:${api.port}/items`, method: 'post', body: { name: 'x' } },
      policy({ methods: ['POST'] }),
    );
    expect(result.ok).toBe(true);
    expect(api.hits[0]).toMatchObject({
      method: 'POST',
      body: '{"name":"x"}',
      headers: { 'content-type': 'application/json' },
    });
  });

  it('strips set-cookie and hop-by-hop headers from the response and decodes gzip', async () => {
    const api = await listen(PUBLIC, (_req, res) => {
      res.setHeader('set-cookie', ['session=secret; HttpOnly', 'other=1']);
      res.setHeader('connection', 'keep-alive, x-hop');
      res.setHeader('x-hop', 'one hop only');
      res.setHeader('keep-alive', 'timeout=5');
      res.setHeader('x-kept', 'yes');
      res.setHeader('content-type', 'text/plain');
      res.setHeader('content-encoding', 'gzip');
      res.end(zlib.gzipSync('compressed text'));
    });
    const executor = apiExecutor();
    const result = await executor.execute({ url: `http://api.example.test:${api.port}/` }, policy());

    expect(result).toMatchObject({ ok: true, output: { body: 'compressed text', headers: { 'x-kept': 'yes' } } });
    const headers = result.ok ? result.output.headers : {};
    for (const name of ['set-cookie', 'connection', 'keep-alive', 'x-hop', 'content-encoding', 'transfer-encoding']) {
      expect(headers).not.toHaveProperty(name);
    }
  });
});

describe('egress executor: refusals never reach the inside', () => {
  it('refuses a host that resolves to one public and one private address', async () => {
    const api = await listen(PUBLIC);
    const inside = await listen(PRIVATE, undefined, api.port);
    const { resolver } = tableResolver({ 'mixed.example.test': [PUBLIC, PRIVATE] });
    const executor = createEgressExecutor({ allowCidrs, resolver });

    const result = await executor.execute({ url: `http://mixed.example.test:${api.port}/` }, policy());

    expect(result).toMatchObject({
      ok: false,
      code: 'egress_denied',
      reason: 'address_not_public',
      details: { hop: 0, host: 'mixed.example.test', address: PRIVATE, classification: 'loopback' },
    });
    expect(api.hits).toHaveLength(0);
    expect(inside.hits).toHaveLength(0);
  });

  it('does not follow redirects unless the policy says so: the 3xx is the output', async () => {
    const inside = await listen(PRIVATE);
    const api = await listen(PUBLIC, (_req, res) => {
      res.writeHead(302, { location: `http://${PRIVATE}:${inside.port}/admin` });
      res.end();
    });
    const executor = apiExecutor();

    const result = await executor.execute(
      { url: `http://api.example.test:${api.port}/` },
      policy({ allowed_hosts: ['*'] }),
    );

    expect(result).toMatchObject({
      ok: true,
      output: { status: 302, headers: { location: `http://${PRIVATE}:${inside.port}/admin` } },
    });
    expect(inside.hits).toHaveLength(0);
  });

  it('re-checks a followed redirect, so one to a private address never reaches the private listener', async () => {
    const inside = await listen(PRIVATE);
    const api = await listen(PUBLIC, (req, res) => {
      const host = req.url === '/by-ip' ? PRIVATE : 'internal.example.test';
      res.writeHead(307, { location: `http://${host}:${inside.port}/admin` });
      res.end();
    });
    const { resolver } = tableResolver({ 'api.example.test': PUBLIC, 'internal.example.test': PRIVATE });
    const executor = createEgressExecutor({ allowCidrs, resolver });
    const following = policy({ allowed_hosts: ['*'], follow_redirects: true });

    for (const path of ['/by-ip', '/by-name']) {
      const result = await executor.execute({ url: `http://api.example.test:${api.port}${path}` }, following);
      expect(result).toMatchObject({
        ok: false,
        code: 'egress_denied',
        reason: 'address_not_public',
        details: { hop: 1, classification: 'loopback' },
      });
    }
    expect(api.hits).toHaveLength(2);
    expect(inside.hits).toHaveLength(0);
  });

  it('re-checks the allowlist on every hop too', async () => {
    const api = await listen(PUBLIC, (_req, res) => {
      res.writeHead(301, { location: '//elsewhere.test/' });
      res.end();
    });
    const { resolver, asked } = tableResolver({ 'api.example.test': PUBLIC, 'elsewhere.test': PUBLIC });
    const executor = createEgressExecutor({ allowCidrs, resolver });
    const result = await executor.execute(
      { url: `http://api.example.test:${api.port}/` },
      policy({ follow_redirects: true }),
    );
    expect(result).toMatchObject({ reason: 'host_not_allowed', details: { hop: 1, host: 'elsewhere.test' } });
    expect(asked['elsewhere.test']).toBeUndefined();
  });

  it('follows allowed redirects up to the hop limit', async () => {
    const api = await listen(PUBLIC, (req, res) => {
      const n = Number(req.url?.slice(1) ?? 0);
      if (n < 5) {
        res.writeHead(302, { location: `/${n + 1}` });
        res.end();
      } else {
        res.end(`arrived at ${n}`);
      }
    });
    const executor = apiExecutor();
    const url = `http://api.example.test:${api.port}/0`;

    expect(await executor.execute({ url }, policy({ follow_redirects: true, max_redirects: 5 }))).toMatchObject({
      ok: true,
      output: { status: 200, body: 'arrived at 5' },
    });
    api.hits.length = 0;
    expect(await executor.execute({ url }, policy({ follow_redirects: true, max_redirects: 2 }))).toMatchObject({
      reason: 'redirect_limit_exceeded',
      details: { hop: 2, max_redirects: 2 },
    });
    expect(api.hits.map((hit) => hit.url)).toEqual(['/0', '/1', '/2']);
  });

  it('turns POST into a body-less GET after 303, and keeps method and body after 307', async () => {
    const api = await listen(PUBLIC, (req, res) => {
      if (req.url === '/see-other' || req.url === '/temporary') {
        res.writeHead(req.url === '/see-other' ? 303 : 307, { location: '/done' });
      }
      res.end();
    });
    const executor = apiExecutor();
    const following = policy({ follow_redirects: true, methods: ['GET', 'POST'] });

    await executor.execute(
      { url: `http://api.example.test:${api.port}/see-other`, method: 'POST', body: 'x' },
      following,
    );
    await executor.execute(
      { url: `http://api.example.test:${api.port}/temporary`, method: 'POST', body: 'y' },
      following,
    );

    expect(api.hits.map((hit) => [hit.method, hit.url, hit.body])).toEqual([
      ['POST', '/see-other', 'x'],
      ['GET', '/done', ''],
      ['POST', '/temporary', 'y'],
      ['POST', '/done', 'y'],
    ]);
  });

  it('drops credential headers when a redirect leaves the origin', async () => {
    const api = await listen(PUBLIC, (req, res) => {
      if (req.url === '/start') res.writeHead(302, { location: `http://other.example.test:${api.port}/next` });
      res.end();
    });
    const { resolver } = tableResolver({ 'api.example.test': PUBLIC, 'other.example.test': PUBLIC });
    const executor = createEgressExecutor({ allowCidrs, resolver });

    const result = await executor.execute(
      { url: `http://api.example.test:${api.port}/start`, headers: { Authorization: 'Bearer t', 'x-other': '1' } },
      policy({ follow_redirects: true, allow_credential_headers: true }),
    );

    expect(result.ok).toBe(true);
    expect(api.hits[0]!.headers.authorization).toBe('Bearer t');
    expect(api.hits[1]!.headers.authorization).toBeUndefined();
    expect(api.hits[1]!.headers['x-other']).toBe('1');
  });

  it('pins the connection to the checked address, so DNS rebinding cannot redirect it', async () => {
    const api = await listen(PUBLIC, (_req, res) => res.end('outside'));
    // Same port on the inside address: a connection that followed the new answer would land here.
    const inside = await listen(PRIVATE, (_req, res) => res.end('inside'), api.port);
    // Rebinding: the first answer is public, every later one private.
    let answers = 0;
    const rebinding: Resolver = async () => [{ address: answers++ === 0 ? PUBLIC : PRIVATE, family: 4 }];
    const executor = createEgressExecutor({ allowCidrs, resolver: rebinding });
    const url = `http://rebind.example.test:${api.port}/`;

    const first = await executor.execute({ url }, policy());
    expect(first).toMatchObject({ ok: true, output: { body: 'outside' } });
    expect(answers).toBe(1); // the socket did not ask again: it used the checked address
    // A second call resolves afresh and is refused on the new answer.
    expect(await executor.execute({ url }, policy())).toMatchObject({ reason: 'address_not_public' });
    expect(api.hits).toHaveLength(1);
    expect(inside.hits).toHaveLength(0);
  });

  it("narrows to the grant's egress_domains", async () => {
    const api = await listen(PUBLIC);
    const { resolver, asked } = tableResolver({ 'api.example.test': PUBLIC, 'other.example.test': PUBLIC });
    const executor = createEgressExecutor({ allowCidrs, resolver });
    const narrowing = { egress_domains: ['api.example.test'] };

    expect(await executor.execute({ url: `http://api.example.test:${api.port}/` }, policy(), narrowing)).toMatchObject({
      ok: true,
    });
    expect(
      await executor.execute({ url: `http://other.example.test:${api.port}/` }, policy(), narrowing),
    ).toMatchObject({
      code: 'egress_denied',
      reason: 'host_not_in_grant',
    });
    expect(api.hits).toHaveLength(1);
    expect(asked['other.example.test']).toBeUndefined();
  });

  it('refuses a host override and undeclared credentials before sending anything', async () => {
    const api = await listen(PUBLIC);
    const executor = apiExecutor();
    const url = `http://api.example.test:${api.port}/`;
    expect(await executor.execute({ url, headers: { Host: 'admin.internal' } }, policy())).toMatchObject({
      reason: 'header_not_allowed',
    });
    expect(await executor.execute({ url, headers: { authorization: 'Bearer t' } }, policy())).toMatchObject({
      reason: 'header_not_allowed',
    });
    expect(api.hits).toHaveLength(0);
  });
});

describe('egress executor: caps and faults are values', () => {
  it('fails a response larger than max_response_bytes', async () => {
    const api = await listen(PUBLIC, (_req, res) => res.end('x'.repeat(5000)));
    const executor = apiExecutor();
    expect(
      await executor.execute({ url: `http://api.example.test:${api.port}/` }, policy({ max_response_bytes: 1000 })),
    ).toMatchObject({ ok: false, code: 'tool_backend_failed', reason: 'response_too_large' });
  });

  it('fails a gzip bomb once it decompresses past the cap', async () => {
    const bomb = zlib.gzipSync(Buffer.alloc(16 * 1024 * 1024));
    const api = await listen(PUBLIC, (_req, res) => {
      res.writeHead(200, { 'content-encoding': 'gzip', 'content-type': 'text/plain' });
      res.end(bomb);
    });
    const executor = apiExecutor();
    expect(
      await executor.execute(
        { url: `http://api.example.test:${api.port}/` },
        policy({ max_response_bytes: 64 * 1024 }),
      ),
    ).toMatchObject({ code: 'tool_backend_failed', reason: 'response_too_large' });
  });

  it('times out a destination that never answers', async () => {
    const api = await listen(PUBLIC, () => {
      /* never responds */
    });
    const executor = apiExecutor();
    expect(
      await executor.execute({ url: `http://api.example.test:${api.port}/` }, policy({ timeout_ms: 200 })),
    ).toEqual({
      ok: false,
      code: 'tool_backend_timeout',
      reason: 'deadline_exceeded',
      details: { timeout_ms: 200 },
    });
  });

  it('counts resolution against the deadline too', async () => {
    const hanging: Resolver = () => new Promise(() => undefined);
    const executor = createEgressExecutor({ allowCidrs, resolver: hanging });
    expect(await executor.execute({ url: 'http://slow.example.test/' }, policy({ timeout_ms: 100 }))).toMatchObject({
      code: 'tool_backend_timeout',
    });
  });

  it('reports a refused connection as a backend failure', async () => {
    const api = await listen(PUBLIC);
    const { port } = api;
    for (const server of servers.splice(0)) await new Promise((resolve) => server.close(resolve));
    const executor = apiExecutor();
    expect(await executor.execute({ url: `http://api.example.test:${port}/` }, policy())).toMatchObject({
      ok: false,
      code: 'tool_backend_failed',
      reason: 'connection_failed',
      details: { error_code: 'ECONNREFUSED' },
    });
  });

  it('refuses a name that does not resolve', async () => {
    const executor = createEgressExecutor({ allowCidrs, resolver: tableResolver({}).resolver });
    expect(await executor.execute({ url: 'http://nowhere.example.test/' }, policy())).toMatchObject({
      code: 'egress_denied',
      reason: 'host_unresolvable',
    });
  });
});

describe('egress executor: check', () => {
  it('runs the guard without sending anything', async () => {
    const api = await listen(PUBLIC);
    const { resolver } = tableResolver({ 'api.example.test': PUBLIC, 'mixed.example.test': [PUBLIC, '10.0.0.1'] });
    const executor = createEgressExecutor({ allowCidrs, resolver });

    expect(await executor.check({ url: `http://api.example.test:${api.port}/` }, policy())).toEqual({
      ok: true,
      host: 'api.example.test',
      addresses: [PUBLIC],
    });
    expect(await executor.check({ url: 'http://mixed.example.test/' }, policy())).toMatchObject({
      reason: 'address_not_public',
      details: { hop: 0, address: '10.0.0.1' },
    });
    expect(api.hits).toHaveLength(0);
  });

  it('fails construction on an invalid exception CIDR', () => {
    expect(() => createEgressExecutor({ allowCidrs: ['not-a-cidr'] })).toThrow(/invalid egress exception CIDR/);
  });
});
