import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startControlPlaneApp } from './helpers/control-plane.js';
import { createTestDatabase, type TestDatabase } from './helpers/database.js';
import type { AppClient } from './helpers/harness.js';
import { ManualClock, startClient } from './helpers/manual-clock.js';
import { tokens } from './helpers/tokens.js';

const A = 'tenant-grants-a';
const B = 'tenant-grants-b';
const AGENT = 'veritas.fact-checker';
const platform = tokens.platform('ops.platform');
const opA = tokens.tenantOperator(A, 'alice');
const opB = tokens.tenantOperator(B, 'bob');

let db: TestDatabase;
let client: AppClient;

beforeAll(async () => {
  db = await createTestDatabase();
  client = await startControlPlaneApp(db.database);
});
afterAll(async () => {
  await client?.close();
  await db?.drop();
});

const inHours = (hours: number) => new Date(Date.now() + hours * 3600_000).toISOString();

let agentCounter = 0;
/** A fresh agent id, so each test resolves against its own grants. */
function newAgent(): string {
  agentCounter += 1;
  return `agent-${agentCounter}.worker`;
}

function grant(body: Record<string, unknown>, token = opA, via = client) {
  return via.post('/grants', {
    token,
    body: {
      agent_id: AGENT,
      tool_id: 'scf.read',
      scope: 'per-tenant',
      expires_at: inHours(1),
      rationale: 'weekly briefing pack run',
      ...body,
    },
  });
}

function explain(query: Record<string, string>, token = opA, via = client) {
  return via.get('/grants/resolve', { token, query: { agent_id: AGENT, tool_id: 'scf.read', ...query } });
}

async function auditEvents(eventType: string) {
  const res = await client.get('/audit', { token: platform, query: { event_type: eventType, limit: 500 } });
  return res.body.items as Array<Record<string, any>>;
}

describe('POST /grants', () => {
  it('grants a tool for a tenant, answers 201 with the grant, and records who, what and why', async () => {
    const agent = newAgent();
    const res = await grant({ agent_id: agent, capability_modifiers: { max_cost_units: 5 } });
    expect(res.status).toBe(201);
    expect(res.body).toMatchObject({
      tenant_id: A,
      agent_id: agent,
      tool_id: 'scf.read',
      scope: 'per-tenant',
      scope_ref: A,
      capability_modifiers: { max_cost_units: 5 },
      granted_by: { actor_id: 'alice', actor_role: 'tenant-operator' },
      rationale: 'weekly briefing pack run',
      revoked_at: null,
      revoked_by: null,
      renewed_from: null,
      status: 'live',
    });
    expect(res.body.id).toMatch(/^grt_/);
    const [event] = (await auditEvents('grant.created')).filter((e) => e.details.grant_id === res.body.id);
    expect(event).toMatchObject({
      actor: 'operator:alice',
      tenant_id: A,
      agent_id: agent,
      tool_id: 'scf.read',
      tool_category: 'read_only',
      details: { scope: 'per-tenant', rationale: 'weekly briefing pack run', actor_role: 'tenant-operator' },
    });
    const read = await client.get(`/grants/${res.body.id}`, { token: opA });
    expect(read.body).toEqual(res.body);
  });

  it('lets a platform-operator grant in a tenant it names', async () => {
    const res = await grant({ tenant_id: B, agent_id: newAgent() }, platform);
    expect(res.status).toBe(201);
    expect(res.body).toMatchObject({ tenant_id: B, scope_ref: B, granted_by: { actor_role: 'platform-operator' } });
  });

  it('grants an external_call tool with egress domains inside its allowlist', async () => {
    const res = await grant({
      tool_id: 'web.fetch',
      scope: 'per-run',
      scope_ref: 'run-egress',
      capability_modifiers: { egress_domains: ['press.un.org', '*.data.un.org', 'API.example.com'] },
    });
    expect(res.status).toBe(201);
    expect(res.body.capability_modifiers.egress_domains).toEqual(['press.un.org', '*.data.un.org', 'api.example.com']);
  });

  it.each([
    ['a blank rationale', { rationale: '  \n ' }, 'body.rationale'],
    ['no rationale', { rationale: undefined }, 'body.rationale'],
    ['an expiry in the past', { expires_at: new Date(Date.now() - 60_000).toISOString() }, 'body.expires_at'],
    ['an expiry that is not a timestamp', { expires_at: 'next tuesday' }, 'body.expires_at'],
    ['an agent id that is a family', { agent_id: 'family:veritas' }, 'body.agent_id'],
    ['an agent id with spaces', { agent_id: 'rm -rf' }, 'body.agent_id'],
    ['a tool id that is not one', { tool_id: 'Web Fetch' }, 'body.tool_id'],
    ['an unknown scope', { scope: 'per-galaxy' }, 'body.scope'],
    ['a per-run grant without scope_ref', { scope: 'per-run' }, 'body.scope_ref'],
    ['a per-tenant grant for another tenant id', { scope_ref: 'elsewhere' }, 'body.scope_ref'],
    ['an unknown capability modifier', { capability_modifiers: { sudo: true } }, 'body.capability_modifiers'],
    [
      'a non-positive cost cap',
      { capability_modifiers: { max_cost_units: 0 } },
      'body.capability_modifiers.max_cost_units',
    ],
    [
      'a cost cap that rounds to zero units',
      { capability_modifiers: { max_cost_units: 1e-300 } },
      'body.capability_modifiers.max_cost_units',
    ],
    [
      'a cost cap above the most units any amount may be',
      { capability_modifiers: { max_cost_units: 1e308 } },
      'body.capability_modifiers.max_cost_units',
    ],
    [
      'egress domains on a tool without egress',
      { capability_modifiers: { egress_domains: ['api.example.com'] } },
      'body.capability_modifiers.egress_domains',
    ],
    ['an unknown field', { colour: 'blue' }, 'body'],
  ])('refuses %s with 400 naming the field', async (_name, body, field) => {
    const res = await grant(body as Record<string, unknown>);
    expect(res.status).toBe(400);
    expect(res.body.error.code).toBe('invalid_request');
    expect(res.body.error.message).toContain(field);
  });

  it.each([
    ['the whole internet', ['*']],
    ['the apex of a subdomain wildcard', ['un.org']],
    ['a wider wildcard', ['*.org']],
    ['a host outside the allowlist', ['evil.example.net']],
    ['a sibling of an exact host', ['www.example.com']],
  ])('refuses egress domains wider than the tool allows: %s', async (_name, domains) => {
    const res = await grant({ tool_id: 'web.fetch', capability_modifiers: { egress_domains: domains } });
    expect(res.status).toBe(400);
    expect(res.body.error.message).toMatch(/egress_domains.*wider/);
  });

  it('refuses a tool that is not registered with 404 tool_not_registered', async () => {
    const res = await grant({ tool_id: 'no.such.tool' });
    expect(res.status).toBe(404);
    expect(res.body.error.code).toBe('tool_not_registered');
  });

  it('never grants a final_write or admin tool (403 tool_category_blocked), and records the attempt', async () => {
    for (const tool of ['final.publish', 'admin.reset']) {
      const res = await grant({ tool_id: tool }, platform);
      expect([tool, res.status, res.body.error.code]).toEqual([tool, 403, 'tool_category_blocked']);
    }
    const events = (await auditEvents('security.category_blocked')).filter((e) => e.actor === 'operator:ops.platform');
    expect(events.map((e) => e.tool_id).sort()).toEqual(['admin.reset', 'final.publish']);
    const listed = await client.get('/grants', { token: platform, query: { tool_id: 'final.publish' } });
    expect(listed.body.items).toEqual([]);
  });
});

describe('POST /grants run twice', () => {
  it('answers the live grant an identical request already made, with 200, and records nothing more', async () => {
    const agent = newAgent();
    const expires_at = inHours(2);
    const first = await grant({ agent_id: agent, expires_at });
    const again = await grant({ agent_id: agent, expires_at });
    expect(first.status).toBe(201);
    expect(again.status).toBe(200);
    expect(again.body).toEqual(first.body);
    // The same modifiers, as stored and read back, are the same grant.
    const modifiers = await grant({
      agent_id: agent,
      expires_at,
      scope: 'per-session',
      scope_ref: 's1',
      capability_modifiers: { max_cost_units: 3 },
    });
    const same = await grant({
      agent_id: agent,
      expires_at,
      scope: 'per-session',
      scope_ref: 's1',
      capability_modifiers: { max_cost_units: 3 },
    });
    expect(modifiers.status).toBe(201);
    expect([same.status, same.body.id]).toEqual([200, modifiers.body.id]);
    const created = (await auditEvents('grant.created')).filter(
      (e) => e.agent_id === agent || e.details?.agent_id === agent,
    );
    expect(created).toHaveLength(2);
    // Revoking the one grant leaves nothing granting.
    expect(
      (await client.post(`/grants/${first.body.id}/revoke`, { token: opA, body: { reason: 'done' } })).status,
    ).toBe(200);
    expect((await explain({ agent_id: agent })).body).toMatchObject({ ok: false, code: 'grant_revoked' });
    // Once it is revoked, the same request grants anew.
    const anew = await grant({ agent_id: agent, expires_at });
    expect(anew.status).toBe(201);
    expect(anew.body.id).not.toBe(first.body.id);
  });

  it('refuses one differing from a live grant only in expiry or rationale with 409 grant_conflict naming it', async () => {
    const agent = newAgent();
    const live = await grant({ agent_id: agent, expires_at: inHours(2) });
    for (const change of [{ expires_at: inHours(3) }, { expires_at: inHours(2), rationale: 'another reason' }]) {
      const res = await grant({ agent_id: agent, ...change });
      expect(res.status, JSON.stringify(change)).toBe(409);
      expect(res.body.error).toMatchObject({ code: 'grant_conflict', details: { grant_id: live.body.id } });
    }
    // Other modifiers are another grant.
    expect(
      (await grant({ agent_id: agent, expires_at: inHours(3), capability_modifiers: { max_cost_units: 2 } })).status,
    ).toBe(201);
  });

  it('lets identical requests arriving together make one grant', async () => {
    const agent = newAgent();
    const expires_at = inHours(2);
    const results = await Promise.all(Array.from({ length: 6 }, () => grant({ agent_id: agent, expires_at })));
    expect(results.map((r) => r.status).sort()).toEqual([200, 200, 200, 200, 200, 201]);
    expect(new Set(results.map((r) => r.body.id)).size).toBe(1);
  });
});

describe('GET /grants/resolve and services.grants.resolve: SPEC §3 at every call', () => {
  it('picks the most specific scope that matches the run context', async () => {
    const agent = newAgent();
    const tenantWide = await grant({ agent_id: agent });
    const user = await grant({ agent_id: agent, scope: 'per-user', scope_ref: 'user-1' });
    const session = await grant({ agent_id: agent, scope: 'per-session', scope_ref: 'sess-1' });
    const pipeline = await grant({ agent_id: agent, scope: 'per-pipeline-instance', scope_ref: 'pipe-1' });
    const run = await grant({ agent_id: agent, scope: 'per-run', scope_ref: 'run-1' });
    const full = {
      agent_id: agent,
      run_id: 'run-1',
      pipeline_instance_id: 'pipe-1',
      session_id: 'sess-1',
      user_id: 'user-1',
    };

    const res = await explain(full);
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ ok: true, code: null, grant: { id: run.body.id } });
    expect(res.body.candidates.map((c: { priority: number }) => c.priority)).toEqual([100, 80, 60, 40, 20]);
    expect(res.body.candidates.map((c: { selected: boolean }) => c.selected)).toEqual([
      true,
      false,
      false,
      false,
      false,
    ]);

    expect((await explain({ ...full, run_id: 'run-2' })).body.grant.id).toBe(pipeline.body.id);
    expect((await explain({ agent_id: agent, session_id: 'sess-1', user_id: 'user-1' })).body.grant.id).toBe(
      session.body.id,
    );
    expect((await explain({ agent_id: agent, user_id: 'user-1' })).body.grant.id).toBe(user.body.id);
    expect((await explain({ agent_id: agent, user_id: 'someone-else' })).body.grant.id).toBe(tenantWide.body.id);

    // The hot path the admission pipeline calls gives the same answer.
    const decision = await client.app.services.grants.resolve({
      tenantId: A,
      agentId: agent,
      toolId: 'scf.read',
      context: { run_id: 'run-1', pipeline_instance_id: 'pipe-1' },
    });
    expect(decision).toMatchObject({ ok: true, grant: { id: run.body.id } });
  });

  it('breaks a tie within one scope in favour of the most recent grant', async () => {
    const agent = newAgent();
    await grant({ agent_id: agent, scope: 'per-session', scope_ref: 'tie' });
    const newer = await grant({
      agent_id: agent,
      scope: 'per-session',
      scope_ref: 'tie',
      rationale: 'second thoughts',
      capability_modifiers: { max_cost_units: 5 },
    });
    expect(newer.status).toBe(201);
    const res = await explain({ agent_id: agent, session_id: 'tie' });
    expect(res.body.grant.id).toBe(newer.body.id);
    expect(res.body.candidates).toHaveLength(2);
  });

  it('says grant_missing for an agent that never had the tool, or for another tool or tenant', async () => {
    const agent = newAgent();
    expect((await explain({ agent_id: agent })).body).toMatchObject({
      ok: false,
      code: 'grant_missing',
      grant: null,
      candidates: [],
    });
    await grant({ agent_id: agent });
    expect((await explain({ agent_id: agent, tool_id: 'draft.write' })).body.code).toBe('grant_missing');
    expect((await explain({ agent_id: agent }, opB)).body.code).toBe('grant_missing');
    const decision = await client.app.services.grants.resolve({
      tenantId: B,
      agentId: agent,
      toolId: 'scf.read',
      context: { tenant_id: A },
    });
    expect(decision).toMatchObject({ ok: false, code: 'grant_missing' });
  });

  it('says grant_expired once every match has lapsed, at the next call', async () => {
    // On an app whose clock the test moves: the expiry is reached, not waited for.
    const clock = new ManualClock(new Date());
    const clocked = await startClient(db.database, clock);
    try {
      const agent = newAgent();
      const soon = await grant(
        { agent_id: agent, expires_at: new Date(clock.now().getTime() + 60_000).toISOString() },
        opA,
        clocked,
      );
      expect(soon.status).toBe(201);
      // Live until the last millisecond before its expiry; lapsed at it.
      clock.advance(59_999);
      expect((await explain({ agent_id: agent }, opA, clocked)).body.ok).toBe(true);
      clock.advance(1);
      const res = await explain({ agent_id: agent }, opA, clocked);
      expect(res.body).toMatchObject({ ok: false, code: 'grant_expired', candidates: [{ status: 'expired' }] });
      const listed = await clocked.get('/grants', { token: opA, query: { agent_id: agent, status: 'expired' } });
      expect(listed.body.items.map((g: { id: string }) => g.id)).toEqual([soon.body.id]);
    } finally {
      await clocked.close();
    }
  });
});

describe('POST /grants/{id}/revoke', () => {
  it('ends the grant at the next call, records the reason, and says grant_revoked', async () => {
    const agent = newAgent();
    const g = await grant({ agent_id: agent });
    const res = await client.post(`/grants/${g.body.id}/revoke`, { token: opA, body: { reason: 'agent misbehaved' } });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({
      id: g.body.id,
      status: 'revoked',
      revoked_by: { actor_id: 'alice', actor_role: 'tenant-operator' },
      revocation_reason: 'agent misbehaved',
    });
    expect((await explain({ agent_id: agent })).body).toMatchObject({ ok: false, code: 'grant_revoked' });
    const decision = await client.app.services.grants.resolve({
      tenantId: A,
      agentId: agent,
      toolId: 'scf.read',
      context: {},
    });
    expect(decision).toMatchObject({ ok: false, code: 'grant_revoked' });
    const events = (await auditEvents('grant.revoked')).filter((e) => e.details.grant_id === g.body.id);
    expect(events).toEqual([
      expect.objectContaining({
        actor: 'operator:alice',
        tenant_id: A,
        agent_id: agent,
        details: expect.objectContaining({ reason: 'agent misbehaved', cascade_depth: 0 }),
      }),
    ]);
  });

  it('falls back to a broader live grant when the specific one is revoked', async () => {
    const agent = newAgent();
    const broad = await grant({ agent_id: agent });
    const narrow = await grant({ agent_id: agent, scope: 'per-run', scope_ref: 'r-9' });
    await client.post(`/grants/${narrow.body.id}/revoke`, { token: opA, body: { reason: 'too much' } });
    const res = await explain({ agent_id: agent, run_id: 'r-9' });
    expect(res.body).toMatchObject({ ok: true, grant: { id: broad.body.id } });
    expect(res.body.candidates.map((c: { status: string }) => c.status)).toEqual(['revoked', 'live']);
  });

  it('is idempotent and needs a reason', async () => {
    const g = await grant({ agent_id: newAgent() });
    expect((await client.post(`/grants/${g.body.id}/revoke`, { token: opA, body: {} })).status).toBe(400);
    expect((await client.post(`/grants/${g.body.id}/revoke`, { token: opA, body: { reason: '' } })).status).toBe(400);
    await client.post(`/grants/${g.body.id}/revoke`, { token: opA, body: { reason: 'first' } });
    const again = await client.post(`/grants/${g.body.id}/revoke`, { token: opA, body: { reason: 'second' } });
    expect(again.status).toBe(200);
    expect(again.body.revocation_reason).toBe('first');
    expect((await auditEvents('grant.revoked')).filter((e) => e.details.grant_id === g.body.id)).toHaveLength(1);
    expect((await client.post('/grants/grt_missing/revoke', { token: opA, body: { reason: 'x' } })).status).toBe(404);
  });
});

describe('POST /grants/{id}/renew', () => {
  it('mints a new grant id and ends the old one, which then resolves as revoked', async () => {
    const agent = newAgent();
    const old = await grant({
      agent_id: agent,
      scope: 'per-user',
      scope_ref: 'u-7',
      capability_modifiers: { max_cost_units: 3 },
    });
    const res = await client.post(`/grants/${old.body.id}/renew`, {
      token: opA,
      body: { rationale: 'quarter two', expires_at: inHours(48) },
    });
    expect(res.status).toBe(201);
    expect(res.body.id).not.toBe(old.body.id);
    expect(res.body).toMatchObject({
      agent_id: agent,
      scope: 'per-user',
      scope_ref: 'u-7',
      rationale: 'quarter two',
      renewed_from: old.body.id,
      capability_modifiers: { max_cost_units: 3 },
      status: 'live',
    });

    const before = await client.get(`/grants/${old.body.id}`, { token: opA });
    expect(before.body).toMatchObject({
      status: 'revoked',
      superseded_by: res.body.id,
      revocation_reason: `renewed as ${res.body.id}`,
    });

    const resolved = await explain({ agent_id: agent, user_id: 'u-7' });
    expect(resolved.body.grant.id).toBe(res.body.id);
    expect(resolved.body.candidates.find((c: { grant: { id: string } }) => c.grant.id === old.body.id).status).toBe(
      'revoked',
    );

    // With the new grant revoked too, what is left is the old one, and it is revoked.
    await client.post(`/grants/${res.body.id}/revoke`, { token: opA, body: { reason: 'done' } });
    expect((await explain({ agent_id: agent, user_id: 'u-7' })).body.code).toBe('grant_revoked');

    const events = (await auditEvents('grant.renewed')).filter((e) => e.details.renewed_from === old.body.id);
    expect(events).toEqual([
      expect.objectContaining({
        actor: 'operator:alice',
        details: expect.objectContaining({ grant_id: res.body.id, rationale: 'quarter two' }),
      }),
    ]);
  });

  it('renews a grant that has expired', async () => {
    const clock = new ManualClock(new Date());
    const clocked = await startClient(db.database, clock);
    try {
      const agent = newAgent();
      const old = await grant(
        { agent_id: agent, expires_at: new Date(clock.now().getTime() + 60_000).toISOString() },
        opA,
        clocked,
      );
      clock.advance(60_001);
      expect((await explain({ agent_id: agent }, opA, clocked)).body.code).toBe('grant_expired');
      const renewedUntil = new Date(clock.now().getTime() + 3600_000).toISOString();
      const res = await clocked.post(`/grants/${old.body.id}/renew`, {
        token: opA,
        body: { rationale: 'still needed', expires_at: renewedUntil },
      });
      expect(res.status).toBe(201);
      expect((await explain({ agent_id: agent }, opA, clocked)).body.grant.id).toBe(res.body.id);
    } finally {
      await clocked.close();
    }
  });

  it('refuses to renew a revoked grant, a blank rationale, a past expiry, or wider modifiers', async () => {
    const g = await grant({
      agent_id: newAgent(),
      tool_id: 'web.fetch',
      capability_modifiers: { egress_domains: ['press.un.org'] },
    });
    const blank = await client.post(`/grants/${g.body.id}/renew`, {
      token: opA,
      body: { rationale: ' ', expires_at: inHours(1) },
    });
    const past = await client.post(`/grants/${g.body.id}/renew`, {
      token: opA,
      body: { rationale: 'x', expires_at: new Date(Date.now() - 1000).toISOString() },
    });
    const wider = await client.post(`/grants/${g.body.id}/renew`, {
      token: opA,
      body: { rationale: 'x', expires_at: inHours(1), capability_modifiers: { egress_domains: ['*'] } },
    });
    expect([blank.status, past.status, wider.status]).toEqual([400, 400, 400]);
    expect((await client.get(`/grants/${g.body.id}`, { token: opA })).body.status).toBe('live');

    await client.post(`/grants/${g.body.id}/revoke`, { token: opA, body: { reason: 'pulled' } });
    const revoked = await client.post(`/grants/${g.body.id}/renew`, {
      token: opA,
      body: { rationale: 'sneak back', expires_at: inHours(1) },
    });
    expect(revoked.status).toBe(403);
    expect(revoked.body.error.code).toBe('grant_revoked');
  });

  it('lets only one of two concurrent renewals of a grant succeed', async () => {
    const g = await grant({ agent_id: newAgent() });
    const body = { rationale: 'renew', expires_at: inHours(2) };
    const results = await Promise.all(
      [0, 1, 2].map(() => client.post(`/grants/${g.body.id}/renew`, { token: opA, body })),
    );
    expect(results.map((r) => r.status).sort()).toEqual([201, 403, 403]);
    const live = await client.get('/grants', { token: opA, query: { agent_id: g.body.agent_id, status: 'live' } });
    expect(live.body.items).toHaveLength(1);
  });
});

describe('GET /grants', () => {
  it('filters by agent, tool, scope and status, newest first', async () => {
    const agent = newAgent();
    const one = await grant({ agent_id: agent });
    const two = await grant({ agent_id: agent, tool_id: 'draft.write', scope: 'per-run', scope_ref: 'r1' });
    const three = await grant({ agent_id: agent, tool_id: 'draft.write' });
    await client.post(`/grants/${three.body.id}/revoke`, { token: opA, body: { reason: 'x' } });
    const ids = async (query: Record<string, string>) =>
      (await client.get('/grants', { token: opA, query: { agent_id: agent, ...query } })).body.items.map(
        (g: { id: string }) => g.id,
      );
    expect(await ids({})).toEqual([three.body.id, two.body.id, one.body.id]);
    expect(await ids({ tool_id: 'draft.write' })).toEqual([three.body.id, two.body.id]);
    expect(await ids({ scope: 'per-run' })).toEqual([two.body.id]);
    expect(await ids({ status: 'revoked' })).toEqual([three.body.id]);
    expect(await ids({ status: 'live' })).toEqual([two.body.id, one.body.id]);
    expect(await ids({ scope: 'per-run', scope_ref: 'r2' })).toEqual([]);
  });

  it('pages with an opaque cursor without repeating or skipping', async () => {
    const agent = newAgent();
    for (let i = 0; i < 7; i += 1) await grant({ agent_id: agent, scope: 'per-run', scope_ref: `page-${i}` });
    const seen: string[] = [];
    let cursor: string | undefined;
    for (let page = 0; page < 10; page += 1) {
      const res = await client.get('/grants', { token: opA, query: { agent_id: agent, limit: 3, cursor } });
      seen.push(...res.body.items.map((g: { id: string }) => g.id));
      cursor = res.body.next_cursor ?? undefined;
      if (!cursor) break;
    }
    const all = await client.get('/grants', { token: opA, query: { agent_id: agent, limit: 500 } });
    expect(seen).toEqual(all.body.items.map((g: { id: string }) => g.id));
    expect(seen).toHaveLength(7);
    expect((await client.get('/grants', { token: opA, query: { cursor: 'bogus' } })).status).toBe(400);
  });
});

describe('grants: tenant isolation', () => {
  it("answers 404 to everything a tenant-operator tries on another tenant's grant, and records each attempt platform-wide", async () => {
    const theirs = await grant({ agent_id: newAgent(), rationale: 'b secret rationale' }, opB);
    const attempts = [
      await client.get(`/grants/${theirs.body.id}`, { token: opA }),
      await client.post(`/grants/${theirs.body.id}/revoke`, { token: opA, body: { reason: 'mine' } }),
      await client.post(`/grants/${theirs.body.id}/renew`, {
        token: opA,
        body: { rationale: 'mine', expires_at: inHours(1) },
      }),
    ];
    for (const res of attempts) {
      expect(res.status).toBe(404);
      expect(res.body.error.code).toBe('not_found');
      expect(res.text).not.toContain('secret');
    }
    expect((await client.get(`/grants/${theirs.body.id}`, { token: opB })).body.status).toBe('live');
    const events = (await auditEvents('security.cross_tenant_attempt')).filter(
      (e) => e.details.grant_id === theirs.body.id,
    );
    expect(events).toHaveLength(3);
    // Outside the caller's tenant: in its own audit view, a real id would differ from an invented one.
    expect(
      events.every((e) => e.actor === 'operator:alice' && e.tenant_id === null && e.details.caller_tenant_id === A),
    ).toBe(true);
    const ownView = await client.get('/audit', {
      token: opA,
      query: { event_type: 'security.cross_tenant_attempt', limit: 500 },
    });
    expect(ownView.body.items.filter((e: Record<string, any>) => e.details.grant_id === theirs.body.id)).toEqual([]);
  });

  it('answers 404 to a tenant-operator naming another tenant to grant, list or explain, and records it', async () => {
    const create = await grant({ tenant_id: B, agent_id: newAgent() });
    const list = await client.get('/grants', { token: opA, query: { tenant_id: B } });
    const resolve = await explain({ tenant_id: B });
    expect([create.status, list.status, resolve.status]).toEqual([404, 404, 404]);
    const events = (await auditEvents('security.cross_tenant_attempt')).filter(
      (e) => e.actor === 'operator:alice' && e.details.requested_tenant_id === B,
    );
    expect(events.length).toBeGreaterThanOrEqual(3);
  });

  it("lists only a tenant-operator's own grants", async () => {
    await grant({ agent_id: newAgent() }, opB);
    const res = await client.get('/grants', { token: opA, query: { limit: 500 } });
    expect(res.body.items.length).toBeGreaterThan(0);
    expect(new Set(res.body.items.map((g: { tenant_id: string }) => g.tenant_id))).toEqual(new Set([A]));
  });

  it('refuses agents on every grant route (403 agent_forbidden)', async () => {
    const agent = tokens.agent(AGENT, { tenant: A });
    expect((await grant({}, agent)).body.error.code).toBe('agent_forbidden');
    expect((await client.get('/grants', { token: agent })).status).toBe(403);
    expect((await explain({}, agent)).status).toBe(403);
  });
});
