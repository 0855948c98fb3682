import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from 'kysely';
import { agentMayUse } from '../src/registry/tool-access.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';
import { toolBody, type ToolOptions } from './helpers/world.js';

let h: Harness;
const platform = tokens.platform();

beforeAll(async () => {
  h = await startHarness({ TOOLGATE_SECRET_SCF_API_KEY: 'sk-live-not-for-agents' });
});
afterAll(() => h.close());

function register(options: ToolOptions, overrides: Record<string, unknown> = {}, token = platform) {
  return h.client.post('/tools', { token, body: { ...toolBody(options), ...overrides } });
}

async function registered(options: ToolOptions, overrides: Record<string, unknown> = {}) {
  const res = await register(options, overrides);
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return res.body;
}

describe('POST /tools: registering a version', () => {
  it('stores every field of the contract and answers 201 with it', async () => {
    const res = await register(
      {
        id: 'get_scf_control',
        allowed_agents: ['scf.analyst', 'family:scf'],
        required_context: ['tenant_id', 'trace_id'],
        backendUrl: 'http://scf.internal/controls',
      },
      {
        description: 'Reads one SCF control by id.',
        required_scopes: [{ scope: 'scf:read', required: true, rationale: 'reads the normative source' }],
        reads_from: ['scf'],
        rate_limit: { capacity: 10, refill_per_second: 1 },
      },
    );
    expect(res.status).toBe(201);
    expect(res.body).toMatchObject({
      id: 'get_scf_control',
      version: '1.0.0',
      category: 'read_only',
      allowed_agents: ['scf.analyst', 'family:scf'],
      required_context: ['tenant_id', 'trace_id'],
      required_scopes: [{ scope: 'scf:read', required: true, rationale: 'reads the normative source' }],
      deprecation: null,
      backend: { url: 'http://scf.internal/controls', method: 'POST', timeout_ms: 2000, headers: {} },
      target: { family: 'test', provider: 'loopback', region: 'local' },
      rate_limit: { capacity: 10, refill_per_second: 1 },
      egress: null,
      registered_by: 'operator:ops.platform',
    });
    expect(Date.parse(res.body.registered_at)).not.toBeNaN();
  });

  it('fills in defaults for the optional fields', async () => {
    const res = await h.client.post('/tools', {
      token: platform,
      body: {
        id: 'minimal.tool',
        version: '0.1.0',
        display_name: 'Minimal',
        description: 'The fewest fields a registration needs.',
        category: 'read_only',
        risk_level: 'low',
        input_schema: { type: 'object' },
        output_schema: true,
        cost_units: 0,
      },
    });
    expect(res.status).toBe(201);
    expect(res.body).toMatchObject({
      allowed_agents: [],
      required_context: [],
      required_scopes: [],
      requires_approval: false,
      dependencies: [],
      deprecation: null,
      backend: null,
      target: { family: null, provider: null, region: null },
      rate_limit: null,
      egress: null,
    });
  });

  it('records a tool.registered audit event', async () => {
    await registered({ id: 'audited.tool', version: '2.1.0', category: 'draft_write', risk_level: 'medium' });
    const events = await h.client.get('/audit', {
      token: platform,
      query: { event_type: 'tool.registered', tool_id: 'audited.tool' },
    });
    expect(events.body.items).toHaveLength(1);
    expect(events.body.items[0]).toMatchObject({
      actor: 'operator:ops.platform',
      tenant_id: null,
      tool_id: 'audited.tool',
      tool_version: '2.1.0',
      tool_category: 'draft_write',
      risk_level: 'medium',
      status: 'registered',
      details: { content_sha256: expect.stringMatching(/^[0-9a-f]{64}$/) },
    });
  });

  it('answers 200 with the stored version when the same content is registered again, and records nothing', async () => {
    const first = await registered({ id: 'idem.tool' });
    const again = await register({ id: 'idem.tool' });
    expect(again.status).toBe(200);
    expect(again.body).toEqual(first);
    const events = await h.client.get('/audit', {
      token: platform,
      query: { event_type: 'tool.registered', tool_id: 'idem.tool' },
    });
    expect(events.body.items).toHaveLength(1);
  });

  it('treats a body with the defaults spelt out as the same content', async () => {
    await registered({ id: 'spelt.tool' });
    const again = await register(
      { id: 'spelt.tool' },
      { requires_approval: false, rate_limit: null, egress: null, deprecation: null },
    );
    expect(again.status).toBe(200);
  });

  it('refuses different content under a registered version with 409 tool_version_conflict naming the fields', async () => {
    await registered({ id: 'immutable.tool' });
    const res = await register({ id: 'immutable.tool', allowed_agents: ['sneaky.agent'], cost_units: 0 });
    expect(res.status).toBe(409);
    expect(res.body.error).toMatchObject({
      code: 'tool_version_conflict',
      details: { tool_id: 'immutable.tool', version: '1.0.0', differing_fields: ['allowed_agents', 'cost_units'] },
    });
    const stored = await h.client.get('/tools/immutable.tool', { token: platform });
    expect(stored.body.allowed_agents).toEqual([]);
  });

  it('keeps registered content immutable in the database itself', async () => {
    await registered({ id: 'guarded.tool' });
    const db = h.db.database.control;
    await expect(
      sql`update tool_versions set contract = '{}'::jsonb where tool_id = 'guarded.tool'`.execute(db),
    ).rejects.toThrow(/immutable/);
    await expect(sql`delete from tool_versions where tool_id = 'guarded.tool'`.execute(db)).rejects.toThrow(
      /never deleted/,
    );
  });
});

describe('POST /tools: what a registration may not say', () => {
  const cases: Array<[string, ToolOptions, Record<string, unknown>, string]> = [
    ['an id that is not a dotted lower-case name', { id: 'Web.Fetch' }, {}, 'body.id'],
    ['an id with an empty segment', { id: 'web..fetch' }, {}, 'body.id'],
    ['a version that is not semver', { id: 'bad.version', version: '1.0' }, {}, 'body.version'],
    ['a version with a v prefix', { id: 'bad.version', version: 'v1.0.0' }, {}, 'body.version'],
    [
      'an input schema that is not JSON Schema',
      { id: 'bad.schema' },
      { input_schema: { type: 'strnig' } },
      'body.input_schema',
    ],
    [
      'an output schema with an unresolvable $ref',
      { id: 'bad.schema' },
      { output_schema: { $ref: 'https://example.com/remote.json' } },
      'body.output_schema',
    ],
    ['a schema that is not even an object', { id: 'bad.schema' }, { input_schema: 'object' }, 'body.input_schema'],
    [
      'a final_write tool that names an agent',
      { id: 'approve_soa', category: 'final_write', risk_level: 'critical', allowed_agents: ['soa.architect'] },
      {},
      'body.allowed_agents',
    ],
    [
      'an admin tool that names a family',
      { id: 'raw_database_query', category: 'admin', risk_level: 'critical', allowed_agents: ['family:standard'] },
      {},
      'body.allowed_agents',
    ],
    [
      'a final_write tool below high risk',
      { id: 'approve_gap', category: 'final_write', risk_level: 'medium' },
      {},
      'body.risk_level',
    ],
    [
      'an admin tool of low risk',
      { id: 'delete_document', category: 'admin', risk_level: 'low' },
      {},
      'body.risk_level',
    ],
    [
      'an external_call tool without an egress allowlist',
      { id: 'external_api_call', category: 'external_call', risk_level: 'high' },
      {},
      'body.egress',
    ],
    [
      'an external_call tool with an empty allowlist',
      { id: 'external_api_call', category: 'external_call', risk_level: 'high', egress: { allowed_hosts: [] } },
      {},
      'body.egress.allowed_hosts',
    ],
    [
      'an external_call tool with a backend',
      {
        id: 'external_api_call',
        category: 'external_call',
        risk_level: 'high',
        egress: { allowed_hosts: ['api.example.com'] },
        backendUrl: 'http://x.internal',
      },
      {},
      'body.backend',
    ],
    [
      'an allowlist entry that is not a host',
      {
        id: 'external_api_call',
        category: 'external_call',
        risk_level: 'high',
        egress: { allowed_hosts: ['https://api.example.com/path'] },
      },
      {},
      'body.egress.allowed_hosts.0',
    ],
    [
      'egress on a tool that is not external_call',
      { id: 'read.with.egress', egress: { allowed_hosts: ['api.example.com'] } },
      {},
      'body.egress',
    ],
    [
      'a dependency range that is not semver',
      { id: 'bad.dep' },
      { dependencies: [{ tool_id: 'minimal.tool', range: 'latest' }] },
      'body.dependencies.0.range',
    ],
    [
      'a header that reads an arbitrary environment variable',
      { id: 'leaky.tool', backendUrl: 'http://x.internal' },
      {},
      'body.backend.headers.authorization',
    ],
    [
      'a header the gateway sets itself',
      { id: 'spoof.tool', backendUrl: 'http://x.internal' },
      {},
      'body.backend.headers.x-toolgate-tenant-id',
    ],
    [
      'a backend URL with credentials',
      { id: 'creds.tool', backendUrl: 'http://user:pass@x.internal' },
      {},
      'body.backend.url',
    ],
    ['an unknown field', { id: 'extra.tool' }, { colour: 'blue' }, 'body'],
    ['a missing cost', { id: 'free.tool' }, { cost_units: undefined }, 'body.cost_units'],
  ];

  it.each(cases)('rejects %s with 400 invalid_request naming the field', async (_name, options, overrides, field) => {
    const body = { ...toolBody(options), ...overrides };
    if (field === 'body.backend.headers.authorization')
      (body.backend as { headers: unknown }).headers = { authorization: { from_env: 'DATABASE_URL' } };
    if (field === 'body.backend.headers.x-toolgate-tenant-id')
      (body.backend as { headers: unknown }).headers = { 'x-toolgate-tenant-id': 'other' };
    const res = await h.client.post('/tools', { token: platform, body });
    expect(res.status, JSON.stringify(res.body)).toBe(400);
    expect(res.body.error.code).toBe('invalid_request');
    expect(res.body.error.message.startsWith(field), res.body.error.message).toBe(true);
  });

  it('rejects a secret header whose variable is not set on the gateway', async () => {
    const body = toolBody({ id: 'typo.secret', backendUrl: 'http://x.internal' });
    (body.backend as { headers: unknown }).headers = { authorization: { from_env: 'TOOLGATE_SECRET_SCF_API_KYE' } };
    const res = await h.client.post('/tools', { token: platform, body });
    expect(res.status).toBe(400);
    expect(res.body.error).toMatchObject({
      code: 'invalid_request',
      details: { field: 'body.backend.headers.authorization' },
    });
  });

  it('rejects a dependency on an unknown tool with reason unknown_tool', async () => {
    const res = await register({ id: 'needs.ghost' }, { dependencies: [{ tool_id: 'ghost.tool', range: '^1.0.0' }] });
    expect(res.status).toBe(400);
    expect(res.body.error).toMatchObject({
      code: 'invalid_request',
      details: { field: 'body.dependencies.0', reason: 'unknown_tool', tool_id: 'ghost.tool', range: '^1.0.0' },
    });
  });

  it('rejects a range no registered version satisfies with reason semver_range_no_match', async () => {
    await registered({ id: 'dep.base', version: '1.4.0' });
    const res = await register({ id: 'needs.base' }, { dependencies: [{ tool_id: 'dep.base', range: '^2.0.0' }] });
    expect(res.status).toBe(400);
    expect(res.body.error.details).toMatchObject({
      field: 'body.dependencies.0',
      reason: 'semver_range_no_match',
      tool_id: 'dep.base',
      range: '^2.0.0',
    });
    const ok = await register({ id: 'needs.base' }, { dependencies: [{ tool_id: 'dep.base', range: '^1.2.0' }] });
    expect(ok.status).toBe(201);
  });

  it('lets only platform-operators register', async () => {
    const tenantOperator = await register({ id: 'tenant.tool' }, {}, tokens.tenantOperator('tenant-a'));
    expect(tenantOperator.status).toBe(403);
    expect(tenantOperator.body.error.code).toBe('forbidden');
    const agent = await register({ id: 'agent.tool' }, {}, tokens.agent('scf.analyst', { tenant: 'tenant-a' }));
    expect(agent.status).toBe(403);
    expect(agent.body.error.code).toBe('agent_forbidden');
    const none = await h.client.post('/tools', { body: toolBody({ id: 'anon.tool' }) });
    expect(none.status).toBe(401);
  });
});

describe('backend secrets', () => {
  it('stores a secret header by name and never returns its value', async () => {
    const body = toolBody({
      id: 'secret.backend',
      backendUrl: 'http://scf.internal/api',
      allowed_agents: ['scf.analyst'],
    });
    (body.backend as { headers: unknown }).headers = {
      authorization: { from_env: 'TOOLGATE_SECRET_SCF_API_KEY' },
      'x-client': 'toolgate',
    };
    const res = await h.client.post('/tools', { token: platform, body });
    expect(res.status).toBe(201);
    expect(res.body.backend.headers).toEqual({
      authorization: { from_env: 'TOOLGATE_SECRET_SCF_API_KEY' },
      'x-client': '***',
    });
    expect(res.text).not.toContain('sk-live');
    const read = await h.client.get('/tools/secret.backend', { token: platform });
    expect(read.text).not.toContain('sk-live');
    expect(read.body.backend).toMatchObject({ url: 'http://scf.internal/api', headers: { 'x-client': '***' } });
    const agentRead = await h.client.get('/tools/secret.backend', {
      token: tokens.agent('scf.analyst', { tenant: 'tenant-a' }),
    });
    expect(agentRead.status).toBe(200);
    expect(agentRead.body).not.toHaveProperty('backend');
    expect(agentRead.text).not.toContain('TOOLGATE_SECRET');
    const audit = await h.client.get('/audit', { token: platform, query: { tool_id: 'secret.backend' } });
    expect(audit.text).not.toContain('sk-live');
  });

  it('resolves the secret only for dispatch, from the snapshot taken at start-up', async () => {
    const { catalog } = h.client.app.services;
    const resolved = catalog.resolve('secret.backend');
    expect(resolved.ok).toBe(true);
    if (!resolved.ok) return;
    expect(catalog.backendHeaders(resolved.tool)).toEqual({
      authorization: 'sk-live-not-for-agents',
      'x-client': 'toolgate',
    });
  });
});

describe('what operators see of a backend', () => {
  it('never shows a literal header value again, and shows the backend to platform-operators only', async () => {
    const body = toolBody({
      id: 'keyed.backend',
      backendUrl: 'http://vendor.internal/api',
      allowed_agents: ['scf.analyst'],
    });
    (body.backend as { headers: unknown }).headers = { 'x-api-key': 'ak-literal-credential-123' };
    const created = await h.client.post('/tools', { token: platform, body });
    expect(created.status).toBe(201);
    expect(created.body).toMatchObject({ backend_configured: true, backend: { headers: { 'x-api-key': '***' } } });
    // Registering the same content again is still idempotent: the stored value is compared, not the mask.
    expect((await h.client.post('/tools', { token: platform, body })).status).toBe(200);

    for (const tenant of ['tenant-a', 'tenant-z']) {
      const operator = tokens.tenantOperator(tenant);
      for (const res of [
        await h.client.get('/tools/keyed.backend', { token: operator }),
        await h.client.get('/tools', { token: operator, query: { limit: 500 } }),
        await h.client.get('/tools/keyed.backend/versions', { token: operator }),
      ]) {
        expect(res.status).toBe(200);
        expect(res.text).not.toContain('ak-literal-credential-123');
        expect(res.text).not.toContain('vendor.internal');
      }
      const one = await h.client.get('/tools/keyed.backend', { token: operator });
      expect(one.body).not.toHaveProperty('backend');
      expect(one.body.backend_configured).toBe(true);
    }
    for (const path of ['/tools/keyed.backend', '/tools?limit=500', '/tools/keyed.backend/versions']) {
      const res = await h.client.get(path, { token: platform });
      expect(res.text, path).not.toContain('ak-literal-credential-123');
      expect(res.text, path).toContain('vendor.internal');
    }
  });
});

describe('GET /tools/{id}', () => {
  beforeAll(async () => {
    for (const version of ['1.0.0', '1.1.0', '1.2.0', '2.0.0']) {
      await registered({ id: 'versioned.tool', version, allowed_agents: ['scf.analyst'] });
    }
  });

  it('answers the newest version by default and the newest match of a range', async () => {
    const newest = await h.client.get('/tools/versioned.tool', { token: platform });
    expect(newest.status).toBe(200);
    expect(newest.body.version).toBe('2.0.0');
    const ranged = await h.client.get('/tools/versioned.tool', { token: platform, query: { version: '^1.0.0' } });
    expect(ranged.body.version).toBe('1.2.0');
    const tilde = await h.client.get('/tools/versioned.tool', { token: platform, query: { version: '~1.1' } });
    expect(tilde.body.version).toBe('1.1.0');
    const exact = await h.client.get('/tools/versioned.tool', { token: platform, query: { version: '1.0.0' } });
    expect(exact.body.version).toBe('1.0.0');
  });

  it('answers 404 tool_version_not_found when no version matches, and tool_not_registered for an unknown tool', async () => {
    const none = await h.client.get('/tools/versioned.tool', { token: platform, query: { version: '^3' } });
    expect(none.status).toBe(404);
    expect(none.body.error.code).toBe('tool_version_not_found');
    const garbage = await h.client.get('/tools/versioned.tool', { token: platform, query: { version: 'not a range' } });
    expect(garbage.body.error.code).toBe('tool_version_not_found');
    const unknown = await h.client.get('/tools/no.such.tool', { token: platform });
    expect(unknown.status).toBe(404);
    expect(unknown.body.error.code).toBe('tool_not_registered');
  });

  it('shows an agent only what it needs, and nothing of tools it may not use', async () => {
    const agent = tokens.agent('scf.analyst', { tenant: 'tenant-a' });
    const mine = await h.client.get('/tools/versioned.tool', { token: agent, query: { version: '^1' } });
    expect(mine.status).toBe(200);
    expect(mine.body.version).toBe('1.2.0');
    for (const hidden of ['backend', 'allowed_agents', 'target', 'registered_by'])
      expect(mine.body).not.toHaveProperty(hidden);
    const other = await h.client.get('/tools/versioned.tool', {
      token: tokens.agent('someone.else', { tenant: 'tenant-a' }),
    });
    expect(other.status).toBe(404);
    expect(other.body.error.code).toBe('tool_not_registered');
  });

  it('rejects a malformed id with 400', async () => {
    const res = await h.client.get('/tools/Not-A-Tool', { token: platform });
    expect(res.status).toBe(400);
  });
});

describe('GET /tools for operators', () => {
  it('lists every version with the catalog revision, by id and newest version first', async () => {
    const res = await h.client.get('/tools', { token: tokens.tenantOperator('tenant-a'), query: { limit: 500 } });
    expect(res.status).toBe(200);
    expect(res.body.revision).toBe(h.client.app.services.catalog.revision);
    expect(res.body.revision).toBeGreaterThan(0);
    const versioned = res.body.items
      .filter((t: { id: string }) => t.id === 'versioned.tool')
      .map((t: { version: string }) => t.version);
    expect(versioned).toEqual(['2.0.0', '1.2.0', '1.1.0', '1.0.0']);
    const ids = res.body.items.map((t: { id: string }) => t.id);
    expect(ids).toEqual([...ids].sort());
  });

  it('filters by category', async () => {
    const res = await h.client.get('/tools', { token: platform, query: { category: 'draft_write' } });
    expect(res.body.items.length).toBeGreaterThan(0);
    expect(res.body.items.every((t: { category: string }) => t.category === 'draft_write')).toBe(true);
  });

  it('pages with an opaque cursor without repeating or skipping', async () => {
    const all = await h.client.get('/tools', { token: platform, query: { limit: 500 } });
    const seen: string[] = [];
    let cursor: string | undefined;
    for (let page = 0; page < 100; page += 1) {
      const res = await h.client.get('/tools', { token: platform, query: { limit: 3, cursor } });
      seen.push(...res.body.items.map((t: { id: string; version: string }) => `${t.id}@${t.version}`));
      cursor = res.body.next_cursor ?? undefined;
      if (!cursor) break;
    }
    expect(seen).toEqual(all.body.items.map((t: { id: string; version: string }) => `${t.id}@${t.version}`));
    const bad = await h.client.get('/tools', { token: platform, query: { cursor: 'nope' } });
    expect(bad.status).toBe(400);
  });
});

describe('deprecating a version', () => {
  beforeAll(async () => {
    for (const version of ['1.0.0', '1.1.0', '2.0.0'])
      await registered({ id: 'old.search', version, allowed_agents: ['scf.analyst'] });
    await registered({ id: 'new.search', allowed_agents: ['scf.analyst'] });
  });

  it('records the deprecation and its audit event, and ranges then skip the version', async () => {
    const res = await h.client.post('/tools/old.search/versions/1.1.0/deprecate', {
      token: platform,
      body: { replacement_tool_id: 'new.search' },
    });
    expect(res.status).toBe(200);
    expect(res.body.deprecation).toMatchObject({ replacement_tool_id: 'new.search' });
    expect(Date.parse(res.body.deprecation.deprecated_at)).toBeLessThanOrEqual(Date.now());
    const ranged = await h.client.get('/tools/old.search', { token: platform, query: { version: '^1.0.0' } });
    expect(ranged.body.version).toBe('1.0.0');
    const exact = await h.client.get('/tools/old.search', { token: platform, query: { version: '1.1.0' } });
    expect(exact.body).toMatchObject({ version: '1.1.0', deprecation: { replacement_tool_id: 'new.search' } });
    const events = await h.client.get('/audit', {
      token: platform,
      query: { event_type: 'tool.deprecated', tool_id: 'old.search' },
    });
    expect(events.body.items).toHaveLength(1);
    expect(events.body.items[0]).toMatchObject({
      tool_version: '1.1.0',
      actor: 'operator:ops.platform',
      details: { before: null, after: { replacement_tool_id: 'new.search' } },
    });
  });

  it('makes the default resolution skip a deprecated newest version', async () => {
    await h.client.post('/tools/old.search/versions/2.0.0/deprecate', { token: platform, body: {} });
    const newest = await h.client.get('/tools/old.search', { token: platform });
    expect(newest.body.version).toBe('1.0.0');
    const resolved = h.client.app.services.catalog.resolve('old.search');
    expect(resolved.ok && resolved.tool.version).toBe('1.0.0');
  });

  it('answers tool_version_not_found when every version a range matches is deprecated', async () => {
    const res = await h.client.get('/tools/old.search', { token: platform, query: { version: '^2' } });
    expect(res.status).toBe(404);
    expect(res.body.error.code).toBe('tool_version_not_found');
    expect(h.client.app.services.catalog.resolve('old.search', '^2')).toEqual({
      ok: false,
      code: 'tool_version_not_found',
    });
  });

  it('keeps a scheduled deprecation out of effect until its date', async () => {
    await registered({ id: 'scheduled.tool', version: '1.0.0' });
    await registered({ id: 'scheduled.tool', version: '1.1.0' });
    const at = new Date(Date.now() + 7 * 24 * 3600_000).toISOString();
    const res = await h.client.post('/tools/scheduled.tool/versions/1.1.0/deprecate', {
      token: platform,
      body: { deprecated_at: at },
    });
    expect(res.status).toBe(200);
    expect(res.body.deprecation.deprecated_at).toBe(at);
    const newest = await h.client.get('/tools/scheduled.tool', { token: platform });
    expect(newest.body.version).toBe('1.1.0');
  });

  it('changes nothing when the same deprecation is repeated', async () => {
    const first = await h.client.post('/tools/old.search/versions/1.0.0/deprecate', {
      token: platform,
      body: { deprecated_at: '2030-01-01T00:00:00Z' },
    });
    const again = await h.client.post('/tools/old.search/versions/1.0.0/deprecate', {
      token: platform,
      body: { deprecated_at: '2030-01-01T00:00:00.000Z' },
    });
    expect(again.status).toBe(200);
    expect(again.body).toEqual(first.body);
    const events = await h.client.get('/audit', {
      token: platform,
      query: { event_type: 'tool.deprecated', tool_id: 'old.search' },
    });
    expect(events.body.items.filter((e: { tool_version: string }) => e.tool_version === '1.0.0')).toHaveLength(1);
  });

  it('answers 404 for an unknown tool or version and 400 for an unknown replacement', async () => {
    const tool = await h.client.post('/tools/no.such.tool/versions/1.0.0/deprecate', { token: platform, body: {} });
    expect(tool.status).toBe(404);
    expect(tool.body.error.code).toBe('tool_not_registered');
    const version = await h.client.post('/tools/old.search/versions/9.9.9/deprecate', { token: platform, body: {} });
    expect(version.status).toBe(404);
    expect(version.body.error.code).toBe('tool_version_not_found');
    const replacement = await h.client.post('/tools/new.search/versions/1.0.0/deprecate', {
      token: platform,
      body: { replacement_tool_id: 'ghost.tool' },
    });
    expect(replacement.status).toBe(400);
    expect(replacement.body.error.details).toMatchObject({ field: 'body.replacement_tool_id', reason: 'unknown_tool' });
    const range = await h.client.post('/tools/old.search/versions/^1/deprecate', { token: platform, body: {} });
    expect(range.status).toBe(400);
  });

  it('lets only platform-operators deprecate', async () => {
    const res = await h.client.post('/tools/new.search/versions/1.0.0/deprecate', {
      token: tokens.tenantOperator('tenant-a'),
      body: {},
    });
    expect(res.status).toBe(403);
    const agent = await h.client.post('/tools/new.search/versions/1.0.0/deprecate', {
      token: tokens.agent('scf.analyst', { tenant: 'tenant-a' }),
      body: {},
    });
    expect(agent.body.error.code).toBe('agent_forbidden');
    expect((await h.client.get('/tools/new.search', { token: platform })).body.deprecation).toBeNull();
  });
});

describe('GET /tools/{id}/versions', () => {
  it('lists every version newest first, deprecated ones included', async () => {
    const res = await h.client.get('/tools/old.search/versions', { token: platform });
    expect(res.status).toBe(200);
    expect(res.body.items.map((t: { version: string }) => t.version)).toEqual(['2.0.0', '1.1.0', '1.0.0']);
    expect(res.body.items[0].deprecation).not.toBeNull();
    const unknown = await h.client.get('/tools/no.such.tool/versions', { token: platform });
    expect(unknown.body.error.code).toBe('tool_not_registered');
    const agent = await h.client.get('/tools/old.search/versions', {
      token: tokens.agent('scf.analyst', { tenant: 'tenant-a' }),
    });
    expect(agent.status).toBe(403);
  });
});

describe('dependencies and the deprecation review', () => {
  beforeAll(async () => {
    await registered({ id: 'kb.chunks', version: '1.0.0' });
    await registered({ id: 'kb.chunks', version: '1.3.0' });
    await registered(
      { id: 'kb.search', version: '2.0.0' },
      { dependencies: [{ tool_id: 'kb.chunks', range: '^1.0.0' }] },
    );
    await registered(
      { id: 'evidence.candidates' },
      {
        dependencies: [
          { tool_id: 'kb.search', range: '^2.0.0' },
          { tool_id: 'kb.chunks', range: '~1.3.0' },
        ],
      },
    );
    await registered({ id: 'pinned.reader' }, { dependencies: [{ tool_id: 'kb.chunks', range: '1.0.0' }] });
  });

  it('resolves the whole dependency set transitively', async () => {
    const res = await h.client.get('/tools/evidence.candidates/versions/1.0.0/dependencies', { token: platform });
    expect(res.status).toBe(200);
    expect(res.body).toEqual({
      tool_id: 'evidence.candidates',
      version: '1.0.0',
      satisfied: true,
      resolved: [
        {
          tool_id: 'kb.search',
          version: '2.0.0',
          range: '^2.0.0',
          required_by: { tool_id: 'evidence.candidates', version: '1.0.0' },
        },
        {
          tool_id: 'kb.chunks',
          version: '1.3.0',
          range: '~1.3.0',
          required_by: { tool_id: 'evidence.candidates', version: '1.0.0' },
        },
      ],
      unsatisfied: null,
    });
  });

  it('surfaces a deprecation in the window with its replacement and the versions still depending on it', async () => {
    await registered({ id: 'kb.chunks.v2' });
    const dep = await h.client.post('/tools/kb.chunks/versions/1.3.0/deprecate', {
      token: platform,
      body: { replacement_tool_id: 'kb.chunks.v2' },
    });
    expect(dep.status).toBe(200);
    const res = await h.client.get('/tools/deprecations', {
      token: tokens.tenantOperator('tenant-a'),
      query: { within: 'P7D' },
    });
    expect(res.status).toBe(200);
    const notice = res.body.items.find(
      (n: { tool_id: string; version: string }) => n.tool_id === 'kb.chunks' && n.version === '1.3.0',
    );
    expect(notice).toMatchObject({ replacement_tool_id: 'kb.chunks.v2', in_effect: true });
    expect(notice.dependents).toEqual([
      { tool_id: 'evidence.candidates', version: '1.0.0', range: '~1.3.0', resolves_to: null },
      { tool_id: 'kb.search', version: '2.0.0', range: '^1.0.0', resolves_to: '1.0.0' },
    ]);
    const scheduled = res.body.items.find((n: { tool_id: string }) => n.tool_id === 'scheduled.tool');
    expect(scheduled).toMatchObject({ version: '1.1.0', in_effect: false });
    // 2030 is outside a week's window either way.
    expect(
      res.body.items.find(
        (n: { tool_id: string; version: string }) => n.tool_id === 'old.search' && n.version === '1.0.0',
      ),
    ).toBeUndefined();
  });

  it('reports the first unsatisfied dependency with its typed reason once a range only matches deprecated versions', async () => {
    const res = await h.client.get('/tools/evidence.candidates/versions/1.0.0/dependencies', { token: platform });
    expect(res.body).toMatchObject({
      satisfied: false,
      resolved: [],
      unsatisfied: {
        tool_id: 'kb.chunks',
        range: '~1.3.0',
        reason: 'semver_range_no_match',
        required_by: { tool_id: 'evidence.candidates', version: '1.0.0' },
      },
    });
    const pinned = await h.client.get('/tools/pinned.reader/versions/1.0.0/dependencies', { token: platform });
    expect(pinned.body).toMatchObject({ satisfied: true, resolved: [{ tool_id: 'kb.chunks', version: '1.0.0' }] });
  });

  it('rejects a window that is not an ISO 8601 duration, and answers 404 for unknown versions', async () => {
    for (const within of ['30 days', 'P', 'PT', '-P1D']) {
      const res = await h.client.get('/tools/deprecations', { token: platform, query: { within } });
      expect(res.status, within).toBe(400);
    }
    const missing = await h.client.get('/tools/kb.search/versions/9.0.0/dependencies', { token: platform });
    expect(missing.body.error.code).toBe('tool_version_not_found');
    const unknown = await h.client.get('/tools/no.such.tool/versions/1.0.0/dependencies', { token: platform });
    expect(unknown.body.error.code).toBe('tool_not_registered');
  });
});

describe('the catalog on the hot path', () => {
  beforeAll(async () => {
    await registered(
      { id: 'validated.tool', version: '1.0.0' },
      {
        input_schema: {
          type: 'object',
          properties: { due: { type: 'string', format: 'date' }, n: { type: 'integer', minimum: 1 } },
          required: ['due'],
          additionalProperties: false,
        },
        output_schema: { $id: 'https://schemas.example/shared.json', type: 'object', required: ['ok'] },
      },
    );
    // The same $id in another tool's schema must not collide with the first.
    await registered(
      { id: 'validated.other' },
      { output_schema: { $id: 'https://schemas.example/shared.json', type: 'array' } },
    );
  });

  it('validates inputs and outputs with each version’s compiled schemas, formats included', () => {
    const { catalog } = h.client.app.services;
    const resolved = catalog.resolve('validated.tool');
    if (!resolved.ok) throw new Error('not resolved');
    const { input, output } = catalog.validators(resolved.tool);
    expect(input({ due: '2026-05-01', n: 2 })).toBe(true);
    expect(input({ due: 'tomorrow' })).toBe(false);
    expect(input({ due: '2026-05-01', extra: true })).toBe(false);
    expect(input({ n: 0, due: '2026-05-01' })).toBe(false);
    expect(output({ ok: true })).toBe(true);
    expect(output([])).toBe(false);
    const other = catalog.resolve('validated.other');
    if (!other.ok) throw new Error('not resolved');
    expect(catalog.validators(other.tool).output([])).toBe(true);
  });

  it('compiles each version once per replica', () => {
    const { catalog } = h.client.app.services;
    const resolved = catalog.resolve('validated.tool');
    if (!resolved.ok) throw new Error('not resolved');
    expect(catalog.validators(resolved.tool).input).toBe(catalog.validators(resolved.tool).input);
  });

  it('refuses every payload for a version it does not hold, rather than skipping validation', () => {
    const { input } = h.client.app.services.catalog.validators({ id: 'validated.tool', version: '9.9.9' });
    expect(input({ due: '2026-05-01' })).toBe(false);
  });

  it("lists a tool's versions, newest first, for agentMayUse to tell who may use each", () => {
    const { catalog } = h.client.app.services;
    expect(catalog.versions('versioned.tool').map((t) => t.version)).toEqual(['2.0.0', '1.2.0', '1.1.0', '1.0.0']);
    expect(catalog.versions('no.such.tool')).toEqual([]);
    const tool = catalog.versions('versioned.tool')[0]!;
    expect(agentMayUse(tool, { agentId: 'scf.analyst', family: undefined })).toBe(true);
    expect(agentMayUse(tool, { agentId: 'gap.analyst', family: undefined })).toBe(false);
  });

  it('reports ready while fresh', async () => {
    const res = await h.client.get('/ready');
    expect(res.status).toBe(200);
    expect(h.client.app.services.catalog.ageMs()).toBeLessThan(5_000);
  });
});

describe('re-registration and deprecation', () => {
  it('refuses to change a deprecation through re-registration, but re-seeds a deprecated version unchanged', async () => {
    await registered({ id: 'reseed.tool' });
    await h.client.post('/tools/reseed.tool/versions/1.0.0/deprecate', {
      token: platform,
      body: { deprecated_at: '2026-01-01T00:00:00Z' },
    });
    const reseed = await register({ id: 'reseed.tool' });
    expect(reseed.status).toBe(200);
    expect(reseed.body.deprecation).toMatchObject({ deprecated_at: '2026-01-01T00:00:00.000Z' });
    const sameDeprecation = await register(
      { id: 'reseed.tool' },
      { deprecation: { deprecated_at: '2026-01-01T00:00:00.000Z', replacement_tool_id: null } },
    );
    expect(sameDeprecation.status).toBe(200);
    const other = await register(
      { id: 'reseed.tool' },
      { deprecation: { deprecated_at: '2027-01-01T00:00:00Z', replacement_tool_id: null } },
    );
    expect(other.status).toBe(409);
    expect(other.body.error).toMatchObject({
      code: 'tool_version_conflict',
      details: { differing_fields: ['deprecation'] },
    });
  });

  it('accepts a deprecation at registration and records it', async () => {
    const res = await register(
      { id: 'born.deprecated' },
      { deprecation: { deprecated_at: '2026-01-01T00:00:00+02:00', replacement_tool_id: 'born.deprecated' } },
    );
    expect(res.status).toBe(201);
    expect(res.body.deprecation).toEqual({
      deprecated_at: '2025-12-31T22:00:00.000Z',
      replacement_tool_id: 'born.deprecated',
    });
    const newest = await h.client.get('/tools/born.deprecated', { token: platform });
    expect(newest.body.error.code).toBe('tool_version_not_found');
  });
});
