import { generateKeyPairSync } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createSigner } from 'fast-jwt';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AppClient } from './helpers/harness.js';
import { createTestDatabase, type TestDatabase } from './helpers/database.js';
import { signToken, tokens } from './helpers/tokens.js';

const rsa = generateKeyPairSync('rsa', { modulusLength: 2048 });
const ec = generateKeyPairSync('ec', { namedCurve: 'P-256' });
const otherRsa = generateKeyPairSync('rsa', { modulusLength: 2048 });
const rsaPublicPem = rsa.publicKey.export({ type: 'spki', format: 'pem' }).toString();
const rsaPrivatePem = rsa.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
const ecPublicPem = ec.publicKey.export({ type: 'spki', format: 'pem' }).toString();
const ecPrivatePem = ec.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
const otherRsaPrivatePem = otherRsa.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();

const now = () => Math.floor(Date.now() / 1000);
const operatorClaims = { sub: 'ops.one', tenant_id: 't1', kind: 'operator', roles: ['platform-operator'] };
const b64 = (value: object) => Buffer.from(JSON.stringify(value)).toString('base64url');

function sign(algorithm: 'RS256' | 'ES256' | 'HS256', key: string, claims: object, header: object = {}): string {
  return createSigner({ algorithm, key, header: { alg: algorithm, ...header } })({ exp: now() + 600, ...claims });
}

let db: TestDatabase;
let hs: AppClient;
let rs: AppClient;
let es: AppClient;
let jwks: AppClient;

beforeAll(async () => {
  db = await createTestDatabase();
  hs = await AppClient.start(db.database, {
    TOOLGATE_JWT_ISSUER: 'https://idp.test',
    TOOLGATE_JWT_AUDIENCE: 'toolgate',
  });
  rs = await AppClient.start(db.database, { TOOLGATE_JWT_SECRET: '', TOOLGATE_JWT_PUBLIC_KEY: rsaPublicPem });
  es = await AppClient.start(db.database, { TOOLGATE_JWT_SECRET: '', TOOLGATE_JWT_PUBLIC_KEY: ecPublicPem });
  const dir = mkdtempSync(join(tmpdir(), 'toolgate-jwks-'));
  const file = join(dir, 'jwks.json');
  writeFileSync(
    file,
    JSON.stringify({
      keys: [
        { ...rsa.publicKey.export({ format: 'jwk' }), kid: 'rsa-1', use: 'sig' },
        { ...ec.publicKey.export({ format: 'jwk' }), kid: 'ec-1', use: 'sig' },
      ],
    }),
  );
  jwks = await AppClient.start(db.database, { TOOLGATE_JWT_SECRET: '', TOOLGATE_JWT_JWKS_FILE: file });
});

afterAll(async () => {
  for (const client of [hs, rs, es, jwks]) await client?.close();
  await db?.drop();
});

const withIssuer = { ...operatorClaims, iss: 'https://idp.test', aud: 'toolgate' };

describe('authentication (SPEC §1)', () => {
  it('accepts a valid HS256 token and reads the principal from it', async () => {
    const res = await hs.get('/whoami', { token: signToken({ ...withIssuer, scope: 'read write' }) });
    expect(res.status).toBe(200);
    expect(res.body).toEqual({
      kind: 'operator',
      id: 'ops.one',
      tenant_id: 't1',
      role: 'platform-operator',
      family: null,
      scopes: ['read', 'write'],
    });
  });

  it('accepts RS256 and ES256 tokens signed by the configured key', async () => {
    expect((await rs.get('/whoami', { token: sign('RS256', rsaPrivatePem, operatorClaims) })).status).toBe(200);
    expect((await es.get('/whoami', { token: sign('ES256', ecPrivatePem, operatorClaims) })).status).toBe(200);
  });

  it('verifies a token carrying a kid against the one configured public key', async () => {
    // Identity providers add a `kid`; with a single PEM key there is nothing to choose between.
    expect(
      (await rs.get('/whoami', { token: sign('RS256', rsaPrivatePem, operatorClaims, { kid: 'idp-key-2024' }) }))
        .status,
    ).toBe(200);
    expect(
      (await es.get('/whoami', { token: sign('ES256', ecPrivatePem, operatorClaims, { kid: 'idp-key-2024' }) })).status,
    ).toBe(200);
    // The kid picks nothing: another key's token is refused, with or without one.
    for (const header of [{ kid: 'idp-key-2024' }, {}]) {
      const res = await rs.get('/whoami', { token: sign('RS256', otherRsaPrivatePem, operatorClaims, header) });
      expect(res.status).toBe(401);
      expect(res.body.error.code).toBe('unauthenticated');
    }
  });

  it('picks the JWKS key by kid', async () => {
    expect(
      (await jwks.get('/whoami', { token: sign('RS256', rsaPrivatePem, operatorClaims, { kid: 'rsa-1' }) })).status,
    ).toBe(200);
    expect(
      (await jwks.get('/whoami', { token: sign('ES256', ecPrivatePem, operatorClaims, { kid: 'ec-1' }) })).status,
    ).toBe(200);
    expect(
      (await jwks.get('/whoami', { token: sign('RS256', rsaPrivatePem, operatorClaims, { kid: 'nope' }) })).status,
    ).toBe(401);
    // A key the JWKS does not hold cannot borrow a known kid.
    const forged = sign('RS256', otherRsaPrivatePem, operatorClaims, { kid: 'rsa-1' });
    expect((await jwks.get('/whoami', { token: forged })).status).toBe(401);
  });

  const attacks: Array<[string, () => { client: () => AppClient; token: string }]> = [
    [
      'alg none',
      () => ({
        client: () => hs,
        token: `${b64({ alg: 'none', typ: 'JWT' })}.${b64({ ...withIssuer, exp: now() + 600 })}.`,
      }),
    ],
    [
      'alg none on an RS256 gateway',
      () => ({
        client: () => rs,
        token: `${b64({ alg: 'none', typ: 'JWT' })}.${b64({ ...operatorClaims, exp: now() + 600 })}.`,
      }),
    ],
    [
      'HS256 signed with the RS256 public key (algorithm confusion)',
      () => ({ client: () => rs, token: sign('HS256', rsaPublicPem, operatorClaims) }),
    ],
    [
      'RS256 token on an ES256 gateway',
      () => ({ client: () => es, token: sign('RS256', rsaPrivatePem, operatorClaims) }),
    ],
    ['expired', () => ({ client: () => hs, token: signToken({ ...withIssuer, exp: now() - 120 }) })],
    ['not yet valid', () => ({ client: () => hs, token: signToken({ ...withIssuer, nbf: now() + 3600 }) })],
    ['wrong issuer', () => ({ client: () => hs, token: signToken({ ...withIssuer, iss: 'https://evil.test' }) })],
    ['missing issuer', () => ({ client: () => hs, token: signToken({ ...operatorClaims, aud: 'toolgate' }) })],
    [
      'missing audience',
      () => ({ client: () => hs, token: signToken({ ...operatorClaims, iss: 'https://idp.test' }) }),
    ],
    ['wrong audience', () => ({ client: () => hs, token: signToken({ ...withIssuer, aud: 'someone-else' }) })],
    [
      'bad signature',
      () => ({ client: () => hs, token: signToken(withIssuer, 'another-secret-another-secret-another-secret') }),
    ],
    [
      'tampered payload',
      () => {
        const [header, , signature] = signToken(withIssuer).split('.');
        return {
          client: () => hs,
          token: `${header}.${b64({ ...withIssuer, roles: ['platform-operator'], tenant_id: 'other', exp: now() + 600 })}.${signature}`,
        };
      },
    ],
    [
      'no exp claim',
      () => ({
        client: () => hs,
        token: createSigner({ key: 'test-secret-test-secret-test-secret-0123456789', algorithm: 'HS256' })(withIssuer),
      }),
    ],
    ['garbage', () => ({ client: () => hs, token: 'not-a-jwt' })],
    ['three garbage segments', () => ({ client: () => hs, token: 'aaa.bbb.ccc' })],
    ['no tenant_id claim', () => ({ client: () => hs, token: signToken({ ...withIssuer, tenant_id: undefined }) })],
    ['unknown kind', () => ({ client: () => hs, token: signToken({ ...withIssuer, kind: 'admin' }) })],
    [
      'operator without a known role',
      () => ({ client: () => hs, token: signToken({ ...withIssuer, roles: ['root'] }) }),
    ],
    [
      'an exp in the year 9999',
      () => ({ client: () => hs, token: signToken({ ...withIssuer, iat: now(), exp: 253402300799 }) }),
    ],
    [
      'a lifetime one second past the 24 h default',
      () => ({ client: () => hs, token: signToken({ ...withIssuer, iat: now(), exp: now() + 86_401 }) }),
    ],
    [
      'no iat and an exp more than 24 h ahead',
      () => ({ client: () => hs, token: signToken({ ...withIssuer, exp: now() + 86_460 }) }),
    ],
    [
      'an iat ten minutes in the future',
      () => ({ client: () => hs, token: signToken({ ...withIssuer, iat: now() + 600, exp: now() + 1200 }) }),
    ],
    ['a non-numeric iat', () => ({ client: () => hs, token: signToken({ ...withIssuer, iat: 'yesterday' }) })],
  ];

  it.each(attacks)('refuses %s with 401 unauthenticated', async (_name, make) => {
    const { client, token } = make();
    const res = await client().get('/whoami', { token });
    expect(res.status).toBe(401);
    expect(res.body.error.code).toBe('unauthenticated');
  });

  it('accepts a lifetime of exactly the bound, and an iat within a minute ahead (clock skew)', async () => {
    const t = now();
    expect((await hs.get('/whoami', { token: signToken({ ...withIssuer, iat: t, exp: t + 86_400 }) })).status).toBe(
      200,
    );
    expect((await hs.get('/whoami', { token: signToken({ ...withIssuer, iat: t + 30, exp: t + 3600 }) })).status).toBe(
      200,
    );
  });

  it('bounds the lifetime by TOOLGATE_JWT_MAX_TTL_SECONDS', async () => {
    const short = await AppClient.start(db.database, { TOOLGATE_JWT_MAX_TTL_SECONDS: '600' });
    try {
      const t = now();
      expect(
        (await short.get('/whoami', { token: signToken({ ...operatorClaims, iat: t, exp: t + 600 }) })).status,
      ).toBe(200);
      const res = await short.get('/whoami', { token: signToken({ ...operatorClaims, iat: t, exp: t + 601 }) });
      expect(res.status).toBe(401);
      expect(res.body.error).toMatchObject({
        code: 'unauthenticated',
        message: expect.stringContaining('longer than 600 s'),
      });
    } finally {
      await short.close();
    }
  });

  it('reads the auth scheme case-insensitively', async () => {
    for (const scheme of ['Bearer', 'bearer', 'BEARER', 'bEaReR']) {
      const res = await hs.get('/whoami', { headers: { authorization: `${scheme} ${signToken(withIssuer)}` } });
      expect(res.status, scheme).toBe(200);
    }
  });

  it('refuses a request without a token, or with another scheme', async () => {
    expect((await hs.get('/whoami')).body.error.code).toBe('unauthenticated');
    expect((await hs.get('/whoami', { headers: { authorization: `Basic ${signToken(withIssuer)}` } })).status).toBe(
      401,
    );
  });

  it('never echoes the token or the verifier error', async () => {
    const token = signToken({ ...withIssuer, exp: now() - 120 });
    const res = await hs.get('/whoami', { token });
    expect(res.text).not.toContain(token);
    expect(res.text.toLowerCase()).not.toContain('expired');
  });
});

describe('separation of powers', () => {
  it('gives an agent on an operator route 403 agent_forbidden and records a security event', async () => {
    const agent = signToken({
      sub: 'veritas.fact-checker',
      tenant_id: 't-esc',
      kind: 'agent',
      iss: 'https://idp.test',
      aud: 'toolgate',
    });
    const res = await hs.get('/audit', { token: agent });
    expect(res.status).toBe(403);
    expect(res.body.error.code).toBe('agent_forbidden');
    const events = await hs.get('/audit', {
      token: signToken(withIssuer),
      query: { event_type: 'security.escalation_attempt', tenant_id: 't-esc' },
    });
    expect(events.body.items).toHaveLength(1);
    expect(events.body.items[0]).toMatchObject({
      actor: 'agent:veritas.fact-checker',
      agent_id: 'veritas.fact-checker',
      tenant_id: 't-esc',
      reason_code: 'agent_forbidden',
      details: { route: '/audit', method: 'GET' },
    });
  });

  it('keeps platform routes from tenant-operators, and records the attempt', async () => {
    const res = await hs.get('/audit/verify', {
      token: signToken({ ...withIssuer, sub: 'tenant.reacher', tenant_id: 't-reach', roles: ['tenant-operator'] }),
    });
    expect(res.status).toBe(403);
    expect(res.body.error.code).toBe('forbidden');
    const events = await hs.get('/audit', {
      token: signToken(withIssuer),
      query: { event_type: 'security.escalation_attempt', tenant_id: 't-reach' },
    });
    expect(events.body.items).toHaveLength(1);
    expect(events.body.items[0]).toMatchObject({
      actor: 'operator:tenant.reacher',
      reason_code: 'forbidden',
      details: { route: '/audit/verify', required: 'platform-operator', actor_role: 'tenant-operator' },
    });
  });

  it('lets the public routes through without a token', async () => {
    expect((await hs.get('/health')).status).toBe(200);
    expect((await hs.get('/ready')).status).toBe(200);
  });

  it('uses the tokens helper shapes the other suites rely on', async () => {
    const plain = await AppClient.start(db.database);
    try {
      expect(
        (await plain.get('/whoami', { token: tokens.agent('a.one', { tenant: 't1', family: 'fam', scope: 's1' }) }))
          .body,
      ).toMatchObject({ kind: 'agent', family: 'fam', scopes: ['s1'] });
      expect((await plain.get('/whoami', { token: tokens.tenantOperator('t1') })).body).toMatchObject({
        kind: 'operator',
        role: 'tenant-operator',
      });
    } finally {
      await plain.close();
    }
  });
});

describe('a claim named payload is only a claim (issue 42)', () => {
  // An agent of t1 whose token also carries, nested, the claims of a platform-operator of t2.
  const nested = {
    sub: 'mallory',
    tenant_id: 't2',
    kind: 'operator',
    roles: ['platform-operator'],
    iss: 'https://idp.test',
    aud: 'toolgate',
    exp: now() + 600,
  };
  const agentClaims = { sub: 'agent.one', tenant_id: 't1', kind: 'agent', payload: nested };
  const modes: Array<[string, () => AppClient, () => string]> = [
    [
      'a shared secret (HS256)',
      () => hs,
      () => signToken({ ...agentClaims, iss: 'https://idp.test', aud: 'toolgate' }),
    ],
    ['a public key (RS256)', () => rs, () => sign('RS256', rsaPrivatePem, agentClaims)],
    ['a public key (ES256)', () => es, () => sign('ES256', ecPrivatePem, agentClaims)],
    ['a JWKS file', () => jwks, () => sign('RS256', rsaPrivatePem, agentClaims, { kid: 'rsa-1' })],
  ];

  it.each(modes)('takes the top-level claims with %s', async (_mode, client, token) => {
    const whoami = await client().get('/whoami', { token: token() });
    expect(whoami.status).toBe(200);
    expect(whoami.body).toMatchObject({ kind: 'agent', id: 'agent.one', tenant_id: 't1', role: null });
    const checkpoint = await client().post('/audit/checkpoints', { token: token(), body: {} });
    expect(checkpoint.status).toBe(403);
    expect(checkpoint.body.error.code).toBe('agent_forbidden');
  });

  it('reads the MCP audience from the top level too', async () => {
    const resource = 'https://gateway.example.com/mcp';
    const mcp = await AppClient.start(db.database, { TOOLGATE_MCP_RESOURCE: resource });
    try {
      const agent = { sub: 'agent.one', tenant_id: 't1', kind: 'agent', exp: now() + 600 };
      const post = (claims: Record<string, unknown>) =>
        mcp.post('/mcp', {
          token: signToken({ ...agent, ...claims }),
          headers: { accept: 'application/json, text/event-stream' },
          body: { jsonrpc: '2.0', id: 1, method: 'tools/list', params: {} },
        });
      const elsewhere = 'https://elsewhere.example.com/mcp';
      expect((await post({ aud: elsewhere, payload: { ...agent, aud: resource } })).status).toBe(401);
      expect((await post({ payload: { ...agent, aud: resource } })).status).toBe(401);
      expect((await post({ aud: resource })).status).toBe(200);
    } finally {
      await mcp.close();
    }
  });
});
