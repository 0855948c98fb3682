import { pino } from 'pino';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { KillSwitchSnapshot } from '../src/kill-switches/kill-switch-snapshot.js';
import { hasPostgresServer, openPool } from './helpers/database.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';
import { TestBackend } from './helpers/backend.js';
import { egressSchemas, grantTool, newRunId, registerTool } from './helpers/world.js';

const A = 'tenant-ks-a';
const B = 'tenant-ks-b';
const platform = tokens.platform('ops.platform');
const opA = tokens.tenantOperator(A, 'alice');
const opB = tokens.tenantOperator(B, 'bob');

let h: Harness;
beforeAll(async () => {
  h = await startHarness();
});
afterAll(() => h.close());

function arm(token: string, body: Record<string, unknown>) {
  return h.client.post('/kill-switches', {
    token,
    body: { reason: 'incident 42', user_visible_status_copy: 'Paused while we investigate', ...body },
  });
}

function decide(token: string, query: Record<string, string>) {
  return h.client.get('/kill-switches/decide', { token, query });
}

async function auditEvents(eventType: string, extra: Record<string, string> = {}) {
  const res = await h.client.get('/audit', { token: platform, query: { event_type: eventType, limit: 500, ...extra } });
  return res.body.items as Array<Record<string, any>>;
}

describe('POST /kill-switches: arming', () => {
  it('arms a tenant-confined agent switch for a tenant-operator, records it, and denies at once', async () => {
    const res = await arm(opA, { scope: 'agent', target: 'rogue.agent', safe_degradation_mode_id: 'read-only' });
    expect(res.status).toBe(201);
    expect(res.body).toMatchObject({
      scope: 'agent',
      target: 'rogue.agent',
      tenant_id: A,
      state: 'armed',
      reason: 'incident 42',
      user_visible_status_copy: 'Paused while we investigate',
      safe_degradation_mode_id: 'read-only',
      armed_by: { actor_id: 'alice', actor_role: 'tenant-operator' },
      disarmed_at: null,
    });
    expect(res.body.id).toMatch(/^ks_/);

    const denied = await decide(opA, { agent_id: 'rogue.agent' });
    expect(denied.body).toMatchObject({ ok: false, code: 'kill_switch_active', blamed: { id: res.body.id } });

    const [event] = (await auditEvents('kill_switch.armed')).filter((e) => e.details.kill_switch_id === res.body.id);
    expect(event).toMatchObject({
      actor: 'operator:alice',
      tenant_id: A,
      details: { scope: 'agent', target: 'rogue.agent', reason: 'incident 42', platform_wide: false },
    });
  });

  it('is idempotent: arming the same target again answers 200 with the armed switch and records nothing', async () => {
    const first = await arm(opA, { scope: 'tool', target: 'dup.tool' });
    const again = await arm(opA, { scope: 'tool', target: 'dup.tool', reason: 'someone else noticed too' });
    expect(first.status).toBe(201);
    expect(again.status).toBe(200);
    expect(again.body.id).toBe(first.body.id);
    expect(again.body.reason).toBe('incident 42');
    const events = (await auditEvents('kill_switch.armed')).filter((e) => e.details.target === 'dup.tool');
    expect(events).toHaveLength(1);
  });

  it('lets concurrent arms of one target settle on a single switch', async () => {
    const results = await Promise.all(Array.from({ length: 6 }, () => arm(opA, { scope: 'family', target: 'racers' })));
    expect(new Set(results.map((r) => r.body.id)).size).toBe(1);
    expect(results.filter((r) => r.status === 201)).toHaveLength(1);
  });

  it('treats the same target in two tenants, or platform-wide, as different switches', async () => {
    const inA = await arm(opA, { scope: 'tool', target: 'shared.tool' });
    const inB = await arm(opB, { scope: 'tool', target: 'shared.tool' });
    const everywhere = await arm(platform, { scope: 'tool', target: 'shared.tool' });
    expect([inA.status, inB.status, everywhere.status]).toEqual([201, 201, 201]);
    expect(new Set([inA.body.id, inB.body.id, everywhere.body.id]).size).toBe(3);
    expect(everywhere.body.tenant_id).toBeNull();
  });

  it('lets a platform-operator arm global, region and provider switches, platform-wide', async () => {
    for (const [scope, target] of [
      ['region', 'mars-north'],
      ['provider', 'flaky-llm'],
    ] as const) {
      const res = await arm(platform, { scope, target });
      expect(res.status).toBe(201);
      expect(res.body).toMatchObject({ scope, target, tenant_id: null });
    }
    const global = await arm(platform, { scope: 'global' });
    expect(global.body).toMatchObject({ scope: 'global', target: '*', tenant_id: null });
    const disarmed = await h.client.post(`/kill-switches/${global.body.id}/disarm`, {
      token: platform,
      body: { reason: 'drill over' },
    });
    expect(disarmed.status).toBe(200);
  });

  it('refuses bad input with 400 naming the field', async () => {
    const cases: Array<[Record<string, unknown>, string]> = [
      [{ scope: 'tool', target: 'x.tool', reason: '   ' }, 'body.reason'],
      [{ scope: 'tool', target: 'x.tool', user_visible_status_copy: '' }, 'body.user_visible_status_copy'],
      [{ scope: 'tool' }, 'body.target'],
      [{ scope: 'planet', target: 'earth' }, 'body.scope'],
      [{ scope: 'tool', target: 'x.tool', colour: 'red' }, 'body'],
      [{ scope: 'global', target: 'everything' }, 'body.target'],
    ];
    for (const [body, field] of cases) {
      const res = await arm(platform, body);
      expect([JSON.stringify(body), res.status]).toEqual([JSON.stringify(body), 400]);
      expect(res.body.error.message).toContain(field);
    }
    const platformTenantOnRegion = await arm(platform, { scope: 'region', target: 'x', tenant_id: A });
    expect(platformTenantOnRegion.status).toBe(400);
  });
});

describe('kill switches: who may arm what', () => {
  it('refuses a tenant-operator global, region, provider and platform-wide switches (403), as a security event', async () => {
    const attempts = [
      { scope: 'global' },
      { scope: 'region', target: 'eu-west' },
      { scope: 'provider', target: 'acme' },
      { scope: 'tool', target: 'web.fetch', tenant_id: null },
    ];
    for (const body of attempts) {
      const res = await arm(opA, body);
      expect([body.scope, res.status, res.body.error.code]).toEqual([body.scope, 403, 'forbidden']);
    }
    const events = (await auditEvents('security.escalation_attempt')).filter((e) => e.actor === 'operator:alice');
    expect(events.length).toBeGreaterThanOrEqual(attempts.length);
    const armed = await h.client.get('/kill-switches', {
      token: platform,
      query: { scope: 'provider', target: 'acme' },
    });
    expect(armed.body.items).toEqual([]);
  });

  it('answers 404 to a tenant-operator arming in another tenant, and records the attempt', async () => {
    const viaTenantId = await arm(opA, { scope: 'agent', target: 'victim.agent', tenant_id: B });
    const viaTenantScope = await arm(opA, { scope: 'tenant', target: B });
    const viaBoth = await arm(opA, { scope: 'tenant', target: A, tenant_id: B });
    for (const res of [viaTenantId, viaTenantScope, viaBoth]) {
      expect(res.status).toBe(404);
      expect(res.body.error.code).toBe('not_found');
    }
    const events = (await auditEvents('security.cross_tenant_attempt')).filter((e) => e.actor === 'operator:alice');
    expect(events.map((e) => e.details.requested_tenant_id)).toEqual(expect.arrayContaining([B]));
    const inB = await h.client.get('/kill-switches', { token: opB, query: { target: 'victim.agent' } });
    expect(inB.body.items).toEqual([]);
  });

  it('lets a tenant-operator switch off its whole tenant', async () => {
    const res = await arm(opB, { scope: 'tenant', target: B, reason: 'offboarding' });
    expect(res.status).toBe(201);
    expect(res.body).toMatchObject({ scope: 'tenant', target: B, tenant_id: B });
    expect((await decide(opB, { agent_id: 'any.agent', tool_id: 'any.tool' })).body).toMatchObject({
      ok: false,
      blamed: { scope: 'tenant' },
    });
    expect((await decide(opA, { agent_id: 'any.agent', tool_id: 'any.tool' })).body.ok).toBe(true);
    await h.client.post(`/kill-switches/${res.body.id}/disarm`, { token: opB, body: { reason: 'back' } });
  });

  it("hides another tenant's switches: reading or disarming one is 404 and a security event", async () => {
    const theirs = await arm(opB, { scope: 'agent', target: 'b.private' });
    const read = await h.client.get(`/kill-switches/${theirs.body.id}`, { token: opA });
    const disarm = await h.client.post(`/kill-switches/${theirs.body.id}/disarm`, {
      token: opA,
      body: { reason: 'mine now' },
    });
    expect([read.status, disarm.status]).toEqual([404, 404]);
    expect(read.text).not.toContain('b.private');
    const still = await h.client.get(`/kill-switches/${theirs.body.id}`, { token: opB });
    expect(still.body.state).toBe('armed');
    const events = (await auditEvents('security.cross_tenant_attempt')).filter(
      (e) => e.details.kill_switch_id === theirs.body.id,
    );
    expect(events).toHaveLength(2);
    const listA = await h.client.get('/kill-switches', { token: opA, query: { limit: 500 } });
    expect(listA.body.items.map((k: { id: string }) => k.id)).not.toContain(theirs.body.id);
  });

  it('shows a tenant-operator the platform-wide switches that apply to it, but not their disarm', async () => {
    const platformWide = await arm(platform, { scope: 'agent', target: 'everywhere.agent' });
    const read = await h.client.get(`/kill-switches/${platformWide.body.id}`, { token: opA });
    expect(read.status).toBe(200);
    const disarm = await h.client.post(`/kill-switches/${platformWide.body.id}/disarm`, {
      token: opA,
      body: { reason: 'nope' },
    });
    expect(disarm.status).toBe(403);
    expect(disarm.body.error.code).toBe('forbidden');
    expect((await decide(opA, { agent_id: 'everywhere.agent' })).body.ok).toBe(false);
  });

  it('refuses agents: 403 agent_forbidden', async () => {
    const agent = tokens.agent('veritas.fact-checker', { tenant: A });
    expect((await arm(agent, { scope: 'global' })).body.error.code).toBe('agent_forbidden');
    expect((await decide(agent, {})).body.error.code).toBe('agent_forbidden');
  });
});

describe('POST /kill-switches/{id}/disarm', () => {
  it('disarms, records who and why, and lets calls through again', async () => {
    const armed = await arm(opA, { scope: 'agent', target: 'disarm.me' });
    expect((await decide(opA, { agent_id: 'disarm.me' })).body.ok).toBe(false);
    const res = await h.client.post(`/kill-switches/${armed.body.id}/disarm`, {
      token: opA,
      body: { reason: 'root cause fixed' },
    });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({
      state: 'disarmed',
      disarmed_by: { actor_id: 'alice', actor_role: 'tenant-operator' },
      disarm_reason: 'root cause fixed',
    });
    expect((await decide(opA, { agent_id: 'disarm.me' })).body.ok).toBe(true);
    const events = (await auditEvents('kill_switch.disarmed')).filter(
      (e) => e.details.kill_switch_id === armed.body.id,
    );
    expect(events).toEqual([
      expect.objectContaining({
        actor: 'operator:alice',
        tenant_id: A,
        details: expect.objectContaining({ reason: 'root cause fixed' }),
      }),
    ]);
  });

  it('is idempotent, and arming the target again makes a new switch', async () => {
    const armed = await arm(opA, { scope: 'agent', target: 'twice.off' });
    await h.client.post(`/kill-switches/${armed.body.id}/disarm`, { token: opA, body: { reason: 'one' } });
    const again = await h.client.post(`/kill-switches/${armed.body.id}/disarm`, {
      token: opA,
      body: { reason: 'two' },
    });
    expect(again.status).toBe(200);
    expect(again.body.disarm_reason).toBe('one');
    expect(
      (await auditEvents('kill_switch.disarmed')).filter((e) => e.details.kill_switch_id === armed.body.id),
    ).toHaveLength(1);
    const rearmed = await arm(opA, { scope: 'agent', target: 'twice.off' });
    expect(rearmed.status).toBe(201);
    expect(rearmed.body.id).not.toBe(armed.body.id);
  });

  it('needs a reason, and a switch that exists', async () => {
    const armed = await arm(opA, { scope: 'agent', target: 'needs.reason' });
    expect((await h.client.post(`/kill-switches/${armed.body.id}/disarm`, { token: opA, body: {} })).status).toBe(400);
    expect(
      (await h.client.post(`/kill-switches/${armed.body.id}/disarm`, { token: opA, body: { reason: ' ' } })).status,
    ).toBe(400);
    expect((await h.client.post('/kill-switches/ks_nope/disarm', { token: opA, body: { reason: 'x' } })).status).toBe(
      404,
    );
    expect((await h.client.get('/kill-switches/ks_nope', { token: platform })).status).toBe(404);
  });
});

describe('kill switches on the audit record', () => {
  it('name the agent or tool they target in the event’s own columns, so GET /audit?agent_id= and ?tool_id= find them', async () => {
    const agentSwitch = await arm(opA, { scope: 'agent', target: 'audited.agent' });
    const toolSwitch = await arm(platform, { scope: 'tool', target: 'audited.tool' });
    const regionSwitch = await arm(platform, { scope: 'region', target: 'audited-region' });
    for (const [ks, token] of [
      [agentSwitch, opA],
      [toolSwitch, platform],
      [regionSwitch, platform],
    ] as const) {
      expect(
        (await h.client.post(`/kill-switches/${ks.body.id}/disarm`, { token, body: { reason: 'over' } })).status,
      ).toBe(200);
    }
    const found = async (token: string, query: Record<string, string>) => {
      const res = await h.client.get('/audit', { token, query: { limit: 500, ...query } });
      expect(res.status).toBe(200);
      return (res.body.items as Array<Record<string, any>>)
        .filter((e) => e.event_type.startsWith('kill_switch.'))
        .map((e) => [e.event_type, e.details.kill_switch_id, e.agent_id, e.tool_id]);
    };
    expect(await found(opA, { agent_id: 'audited.agent' })).toEqual([
      ['kill_switch.disarmed', agentSwitch.body.id, 'audited.agent', null],
      ['kill_switch.armed', agentSwitch.body.id, 'audited.agent', null],
    ]);
    expect(await found(platform, { tool_id: 'audited.tool' })).toEqual([
      ['kill_switch.disarmed', toolSwitch.body.id, null, 'audited.tool'],
      ['kill_switch.armed', toolSwitch.body.id, null, 'audited.tool'],
    ]);
    // Other scopes name no agent or tool: their target stays in details alone.
    const region = (await auditEvents('kill_switch.armed')).find(
      (e) => e.details.kill_switch_id === regionSwitch.body.id,
    );
    expect(region).toMatchObject({
      agent_id: null,
      tool_id: null,
      details: { scope: 'region', target: 'audited-region' },
    });
  });
});

describe('GET /kill-switches', () => {
  it('lists armed and disarmed switches, newest first, filtered by state and scope', async () => {
    const all = await h.client.get('/kill-switches', { token: platform, query: { limit: 500 } });
    const times = all.body.items.map((k: { armed_at: string }) => k.armed_at);
    expect(times).toEqual([...times].sort().reverse());
    const states = new Set(all.body.items.map((k: { state: string }) => k.state));
    expect(states).toEqual(new Set(['armed', 'disarmed']));
    const disarmed = await h.client.get('/kill-switches', { token: platform, query: { state: 'disarmed' } });
    expect(disarmed.body.items.every((k: { state: string }) => k.state === 'disarmed')).toBe(true);
    const agents = await h.client.get('/kill-switches', { token: platform, query: { scope: 'agent', limit: 500 } });
    expect(agents.body.items.length).toBeGreaterThan(0);
    expect(agents.body.items.every((k: { scope: string }) => k.scope === 'agent')).toBe(true);
  });

  it('pages with an opaque cursor without repeating or skipping', async () => {
    const seen: string[] = [];
    let cursor: string | undefined;
    for (let page = 0; page < 100; page += 1) {
      const res = await h.client.get('/kill-switches', { token: platform, query: { limit: 3, cursor } });
      seen.push(...res.body.items.map((k: { id: string }) => k.id));
      cursor = res.body.next_cursor ?? undefined;
      if (!cursor) break;
    }
    const all = await h.client.get('/kill-switches', { token: platform, query: { limit: 500 } });
    expect(seen).toEqual(all.body.items.map((k: { id: string }) => k.id));
    expect((await h.client.get('/kill-switches', { token: platform, query: { cursor: 'garbage' } })).status).toBe(400);
  });

  it('confines a tenant-operator to its tenant and the platform-wide switches', async () => {
    const res = await h.client.get('/kill-switches', { token: opA, query: { limit: 500 } });
    const tenants = new Set(res.body.items.map((k: { tenant_id: string | null }) => k.tenant_id));
    expect([...tenants].every((t) => t === A || t === null)).toBe(true);
    expect(tenants.has(A)).toBe(true);
    const other = await h.client.get('/kill-switches', { token: opA, query: { tenant_id: B } });
    expect(other.status).toBe(404);
  });
});

describe('what an agent refused by a switch learns', () => {
  it('the status copy, the scope and the switch id: never the reason or who armed it', async () => {
    const backend = await new TestBackend().start();
    try {
      await registerTool(h.client, {
        id: 'ks.told',
        allowed_agents: ['told.agent'],
        backendUrl: `${backend.url}/echo`,
      });
      await grantTool(h.client, { tenant: A, agent: 'told.agent', tool: 'ks.told' });
      const armed = await arm(opA, {
        scope: 'tool',
        target: 'ks.told',
        reason: 'suspected exfiltration by told.agent',
        user_visible_status_copy: 'This tool is paused',
      });
      expect(armed.status).toBe(201);
      const res = await h.client.post('/runs/execute', {
        token: tokens.agent('told.agent', { tenant: A }),
        body: { run_id: newRunId(), context: {}, plan: [{ tool_id: 'ks.told', input: { q: 'x' } }] },
      });
      expect(res.status).toBe(403);
      expect(res.body.steps[0].error).toEqual({
        code: 'kill_switch_active',
        message: 'This tool is paused',
        details: { kill_switch_id: armed.body.id, scope: 'tool', user_visible_status_copy: 'This tool is paused' },
      });
      expect(res.text).not.toContain('exfiltration');
      expect(res.text).not.toContain('alice');
      expect(backend.hitsOn('/echo')).toHaveLength(0);
      // Operators still find everything through their own routes.
      expect((await h.client.get(`/kill-switches/${armed.body.id}`, { token: opA })).body).toMatchObject({
        reason: 'suspected exfiltration by told.agent',
        armed_by: { actor_id: 'alice' },
      });
    } finally {
      await backend.close();
    }
  });
});

describe('GET /kill-switches/decide', () => {
  it('blames the broadest matching switch and lists every match', async () => {
    const agentSwitch = await arm(opA, { scope: 'agent', target: 'layered.agent' });
    const familySwitch = await arm(opA, {
      scope: 'family',
      target: 'layered',
      user_visible_status_copy: 'The layered family is paused',
    });
    const toolSwitch = await arm(opA, { scope: 'tool', target: 'layered.tool' });
    const res = await decide(opA, { agent_id: 'layered.agent', family: 'layered', tool_id: 'layered.tool' });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({
      ok: false,
      code: 'kill_switch_active',
      blamed: { id: familySwitch.body.id, user_visible_status_copy: 'The layered family is paused' },
      call: { tenant_id: A, agent_id: 'layered.agent', family: 'layered', tool_id: 'layered.tool' },
    });
    expect(res.body.matches.map((k: { id: string }) => k.id)).toEqual([
      familySwitch.body.id,
      agentSwitch.body.id,
      toolSwitch.body.id,
    ]);
    expect(res.body.snapshot.version).toBeGreaterThan(0);
  });

  it("does not let one tenant's switch touch another tenant's calls", async () => {
    await arm(opA, { scope: 'tool', target: 'only.in.a' });
    expect((await decide(opA, { tool_id: 'only.in.a' })).body.ok).toBe(false);
    expect((await decide(opB, { tool_id: 'only.in.a' })).body.ok).toBe(true);
    expect((await decide(platform, { tool_id: 'only.in.a', tenant_id: B })).body.ok).toBe(true);
  });

  it("matches region, provider and family switches on the registered tool's target", async () => {
    await registerTool(h.client, {
      id: 'geo.tool',
      target: { family: 'retrieval', provider: 'acme-llm', region: 'eu-central' },
    });
    await registerTool(h.client, {
      id: 'elsewhere.tool',
      target: { family: 'ranking', provider: 'other-llm', region: 'us-west' },
    });
    const region = await arm(platform, { scope: 'region', target: 'eu-central' });
    const provider = await arm(platform, { scope: 'provider', target: 'acme-llm' });
    const family = await arm(opA, { scope: 'family', target: 'retrieval' });

    const geo = await decide(opA, { tool_id: 'geo.tool', agent_id: 'any.agent', family: 'unrelated' });
    expect(geo.body.call.tool_target).toEqual({ family: 'retrieval', provider: 'acme-llm', region: 'eu-central' });
    expect(geo.body.blamed.id).toBe(region.body.id);
    expect(geo.body.matches.map((k: { id: string }) => k.id)).toEqual([
      region.body.id,
      provider.body.id,
      family.body.id,
    ]);
    // The family switch is tenant A's: in tenant B only the platform-wide ones match.
    const inB = await decide(opB, { tool_id: 'geo.tool' });
    expect(inB.body.matches.map((k: { id: string }) => k.id)).toEqual([region.body.id, provider.body.id]);
    expect((await decide(opA, { tool_id: 'elsewhere.tool' })).body.ok).toBe(true);
    // A tool the registry does not know has no target: only its id can match.
    expect((await decide(opA, { tool_id: 'unknown.tool' })).body).toMatchObject({
      ok: true,
      call: { tool_target: null },
    });

    for (const ks of [region, provider]) {
      await h.client.post(`/kill-switches/${ks.body.id}/disarm`, { token: platform, body: { reason: 'done' } });
    }
    await h.client.post(`/kill-switches/${family.body.id}/disarm`, { token: opA, body: { reason: 'done' } });
  });

  it("judges the target of the version the agent's call would run, when an agent is named", async () => {
    // The newer version is on another allowlist, in another region: the agent's calls run 1.0.0.
    await registerTool(h.client, {
      id: 'decide.split',
      version: '1.0.0',
      allowed_agents: ['decide.agent'],
      target: { family: 'split', provider: 'p', region: 'eu-decide' },
    });
    await registerTool(h.client, {
      id: 'decide.split',
      version: '2.0.0',
      allowed_agents: ['someone.else'],
      target: { family: 'split', provider: 'p', region: 'us-decide' },
    });
    const region = await arm(platform, { scope: 'region', target: 'eu-decide' });
    try {
      const forAgent = await decide(opA, { tool_id: 'decide.split', agent_id: 'decide.agent' });
      expect(forAgent.body).toMatchObject({
        ok: false,
        blamed: { id: region.body.id },
        call: { tool_target: { region: 'eu-decide' } },
      });
      // Without an agent, or for one that may use the newer version, the call gets 2.0.0.
      expect((await decide(opA, { tool_id: 'decide.split' })).body).toMatchObject({
        ok: true,
        call: { tool_target: { region: 'us-decide' } },
      });
      expect((await decide(opA, { tool_id: 'decide.split', agent_id: 'someone.else' })).body).toMatchObject({
        ok: true,
        call: { tool_target: { region: 'us-decide' } },
      });
    } finally {
      await h.client.post(`/kill-switches/${region.body.id}/disarm`, { token: platform, body: { reason: 'done' } });
    }
  });

  it('judges, without an agent, the version a call would run: the newest one agents may use in the tenant, allowlists aside', async () => {
    // Each newer version is one no call runs: final_write, or an external_call while tenant A has
    // external calls off. A call runs 1.0.0, so a switch on its region stops it.
    await registerTool(h.client, {
      id: 'decide.blocked',
      version: '1.0.0',
      allowed_agents: ['decide.agent'],
      target: { family: 'blocked', provider: 'p', region: 'eu-usable' },
    });
    await registerTool(h.client, {
      id: 'decide.blocked',
      version: '2.0.0',
      category: 'final_write',
      risk_level: 'high',
      target: { family: 'blocked', provider: 'p', region: 'us-blocked' },
    });
    await registerTool(h.client, {
      id: 'decide.reach',
      version: '1.0.0',
      allowed_agents: ['decide.agent'],
      target: { family: 'reach', provider: 'p', region: 'eu-usable' },
    });
    await registerTool(h.client, {
      id: 'decide.reach',
      version: '2.0.0',
      category: 'external_call',
      risk_level: 'medium',
      allowed_agents: ['decide.agent'],
      egress: { allowed_hosts: ['api.example.test'] },
      ...egressSchemas,
      target: { family: 'reach', provider: 'p', region: 'us-blocked' },
    });
    // No version is one agents may use: the call path judges the newest, and so does decide.
    await registerTool(h.client, {
      id: 'decide.locked',
      version: '1.0.0',
      category: 'admin',
      risk_level: 'high',
      target: { family: 'locked', provider: 'p', region: 'eu-usable' },
    });
    await registerTool(h.client, {
      id: 'decide.locked',
      version: '2.0.0',
      category: 'final_write',
      risk_level: 'high',
      target: { family: 'locked', provider: 'p', region: 'us-blocked' },
    });
    const region = await arm(platform, { scope: 'region', target: 'eu-usable' });
    try {
      for (const tool_id of ['decide.blocked', 'decide.reach']) {
        const res = await decide(opA, { tool_id });
        expect(res.body, tool_id).toMatchObject({
          ok: false,
          blamed: { id: region.body.id },
          call: { tool_target: { region: 'eu-usable' } },
        });
        // As the agent's own call resolves, and as its run's cascade judges it.
        expect((await decide(opA, { tool_id, agent_id: 'decide.agent' })).body, tool_id).toMatchObject({
          ok: false,
          call: { tool_target: { region: 'eu-usable' } },
        });
      }
      expect((await decide(opA, { tool_id: 'decide.locked' })).body).toMatchObject({
        ok: true,
        call: { tool_target: { region: 'us-blocked' } },
      });
      // In a tenant that enables external calls, the external_call version is what a call runs.
      expect(
        (await h.client.put(`/tenants/${B}/policy`, { token: platform, body: { external_call_enabled: true } })).status,
      ).toBe(200);
      expect((await decide(opB, { tool_id: 'decide.reach' })).body).toMatchObject({
        ok: true,
        call: { tool_target: { region: 'us-blocked' } },
      });
    } finally {
      await h.client.put(`/tenants/${B}/policy`, { token: platform, body: { external_call_enabled: false } });
      await h.client.post(`/kill-switches/${region.body.id}/disarm`, { token: platform, body: { reason: 'done' } });
    }
  });

  it('answers 404 to a tenant-operator asking about another tenant', async () => {
    const res = await decide(opA, { tenant_id: B, tool_id: 'x' });
    expect(res.status).toBe(404);
  });
});

describe('the snapshot in operations', () => {
  it('is ready, and exposes the snapshot age and armed count as metrics', async () => {
    expect((await h.client.get('/ready')).status).toBe(200);
    const metrics = await h.client.get('/metrics');
    const age = /^toolgate_kill_switch_snapshot_age_seconds (\S+)$/m.exec(metrics.text);
    expect(age).not.toBeNull();
    expect(Number(age![1])).toBeGreaterThanOrEqual(0);
    expect(Number(age![1])).toBeLessThan(5);
    const armed = /^toolgate_kill_switches_armed (\S+)$/m.exec(metrics.text);
    const listed = await h.client.get('/kill-switches', { token: platform, query: { state: 'armed', limit: 500 } });
    expect(Number(armed![1])).toBe(listed.body.items.length);
  });
});

describe('snapshot freshness, on an injected clock', () => {
  function snapshotOn(database: typeof h.db.database, clock: () => number) {
    return new KillSwitchSnapshot({
      database,
      listener: database.listener,
      registry: new Registry(),
      logger: pino({ level: 'silent' }),
      pollIntervalMs: 1_000,
      maxStalenessMs: 5_000,
      clock,
    });
  }

  it('fails closed before its first load and once 5 s pass without a confirmation, until it reloads', async () => {
    let now = 1_000_000;
    const snapshot = snapshotOn(h.db.database, () => now);
    const call = { tenantId: A, toolId: 'fresh.tool' };
    expect(snapshot.decide(call)).toMatchObject({ ok: false, code: 'gateway_unavailable' });
    expect(snapshot.readiness()).toMatchObject({ ok: false, reason: expect.stringContaining('never loaded') });

    await snapshot.refresh();
    expect(snapshot.decide(call)).toEqual({ ok: true });
    now += 5_000;
    expect(snapshot.decide(call)).toEqual({ ok: true });
    expect(snapshot.readiness()).toEqual({ ok: true });
    now += 1;
    expect(snapshot.decide(call)).toMatchObject({ ok: false, code: 'gateway_unavailable', age_ms: 5_001 });
    expect(snapshot.readiness().ok).toBe(false);

    await snapshot.refresh();
    expect(snapshot.decide(call)).toEqual({ ok: true });
    await snapshot.stop();
  });

  it.skipIf(!hasPostgresServer)(
    'stays stale when its database cannot be read (needs a PostgreSQL server)',
    async () => {
      let now = 0;
      const database = await openPool(h.db.url, 1);
      const snapshot = snapshotOn(database, () => now);
      await snapshot.refresh();
      await database.close();
      now += 6_000;
      await expect(snapshot.refresh()).rejects.toThrow();
      expect(snapshot.decide({ tenantId: A })).toMatchObject({ ok: false, code: 'gateway_unavailable' });
      await snapshot.stop();
    },
  );

  it('loads what was armed before it started', async () => {
    const armed = await arm(opA, { scope: 'tool', target: 'preexisting.tool' });
    const snapshot = snapshotOn(h.db.database, () => 0);
    await snapshot.refresh();
    expect(snapshot.decide({ tenantId: A, toolId: 'preexisting.tool' })).toMatchObject({
      ok: false,
      blamed: { id: armed.body.id },
    });
    expect(snapshot.state().version).toBe(h.client.app.services.killSwitches.state().version);
    await snapshot.stop();
  });
});
