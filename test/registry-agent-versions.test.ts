import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Resolver } from '../src/egress/resolver.js';
import { TestBackend } from './helpers/backend.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { execute, step } from './helpers/runs.js';
import { tokens } from './helpers/tokens.js';
import { egressSchemas, grantTool, newRunId, registerTool } from './helpers/world.js';

/**
 * What an agent sees of a tool (`GET /tools`, `GET /tools/{id}`) is what its calls get
 * (`POST /runs/execute`, dry or not), when a newer version is one it may not use: another
 * allowlist, a blocked category, or an `external_call` its tenant has not enabled.
 */

const T = 'tenant-versions';
const AGENT = 'split.agent';
const agent = tokens.agent(AGENT, { tenant: T });
const other = tokens.agent('someone.else', { tenant: T });
const platform = tokens.platform();
// No name resolves: nothing here may reach the network.
const resolver: Resolver = async (hostname) => {
  throw Object.assign(new Error(`ENOTFOUND ${hostname}`), { code: 'ENOTFOUND' });
};

let h: Harness;
let backend: TestBackend;
let shiftGrant: { id: string };

const offered = async (token = agent) => {
  const res = await h.client.get('/tools', { token });
  expect(res.status).toBe(200);
  return res.body.items as Array<{ id: string; version: string }>;
};
const setExternalCalls = (enabled: boolean) =>
  h.client.put(`/tenants/${T}/policy`, { token: platform, body: { external_call_enabled: enabled } });
/** The backend paths a run's dispatches reached. */
const reached = (runId: string) => backend.hitsOfRun(runId).map((hit) => hit.path);

beforeAll(async () => {
  h = await startHarness({}, { resolver });
  backend = await new TestBackend().start();
  // Each version has its own backend path, so a dispatch shows which version ran.
  await registerTool(h.client, {
    id: 'split.tool',
    version: '1.0.0',
    allowed_agents: [AGENT],
    backendUrl: `${backend.url}/echo`,
  });
  await registerTool(h.client, {
    id: 'split.tool',
    version: '2.0.0',
    allowed_agents: ['someone.else'],
    backendUrl: `${backend.url}/cost/2`,
  });
  await registerTool(h.client, {
    id: 'shift.tool',
    version: '1.0.0',
    allowed_agents: [AGENT],
    backendUrl: `${backend.url}/echo`,
  });
  await registerTool(h.client, {
    id: 'shift.tool',
    version: '2.0.0',
    category: 'final_write',
    risk_level: 'high',
    backendUrl: `${backend.url}/cost/2`,
  });
  await registerTool(h.client, {
    id: 'locked.tool',
    version: '1.0.0',
    category: 'admin',
    risk_level: 'high',
    backendUrl: `${backend.url}/echo`,
  });
  await registerTool(h.client, {
    id: 'locked.tool',
    version: '2.0.0',
    category: 'final_write',
    risk_level: 'critical',
    backendUrl: `${backend.url}/cost/2`,
  });
  await registerTool(h.client, {
    id: 'reach.tool',
    version: '1.0.0',
    allowed_agents: [AGENT],
    backendUrl: `${backend.url}/echo`,
  });
  await registerTool(h.client, {
    id: 'reach.tool',
    version: '2.0.0',
    category: 'external_call',
    risk_level: 'medium',
    allowed_agents: [AGENT],
    egress: { allowed_hosts: ['api.example.test'] },
    ...egressSchemas,
  });
  await registerTool(h.client, {
    id: 'retired.tool',
    version: '1.0.0',
    allowed_agents: [AGENT],
    backendUrl: `${backend.url}/echo`,
  });
  await registerTool(h.client, {
    id: 'retired.tool',
    version: '2.0.0',
    allowed_agents: ['someone.else'],
    backendUrl: `${backend.url}/cost/2`,
  });
  const deprecated = await h.client.post('/tools/retired.tool/versions/1.0.0/deprecate', { token: platform, body: {} });
  expect(deprecated.status).toBe(200);
  await registerTool(h.client, {
    id: 'only.external',
    category: 'external_call',
    risk_level: 'medium',
    allowed_agents: [AGENT],
    egress: { allowed_hosts: ['api.example.test'] },
    ...egressSchemas,
  });
  await registerTool(h.client, {
    id: 'family.tool',
    allowed_agents: ['family:splitters'],
    backendUrl: `${backend.url}/echo`,
  });
  for (const tool of ['split.tool', 'reach.tool', 'retired.tool'])
    await grantTool(h.client, { tenant: T, agent: AGENT, tool });
  // Granted though its newest version is final_write: its older version is one agents may use.
  shiftGrant = await grantTool(h.client, { tenant: T, agent: AGENT, tool: 'shift.tool' });
  await grantTool(h.client, { tenant: T, agent: 'someone.else', tool: 'split.tool' });
});

afterAll(async () => {
  await backend?.close();
  await h?.close();
});

describe('a newer version with an allowlist that omits the agent', () => {
  it('is neither offered nor shown: the agent sees the newest version it may use', async () => {
    expect((await offered()).find((t) => t.id === 'split.tool')).toMatchObject({ version: '1.0.0' });
    const shown = await h.client.get('/tools/split.tool', { token: agent });
    expect(shown.status).toBe(200);
    expect(shown.body.version).toBe('1.0.0');
  });

  it('does not shadow that version for a call without a version: the call runs 1.0.0, as shown', async () => {
    const runId = newRunId();
    const res = await execute(h.client, agent, { run_id: runId, plan: [step('split.tool', 'hi')] });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.steps).toMatchObject([
      { tool_id: 'split.tool', version: '1.0.0', status: 'completed', output: { echo: { q: 'hi' } } },
    ]);
    expect(reached(runId)).toEqual(['/echo']);
  });

  it('admits the shown version in a dry run too', async () => {
    const res = await execute(h.client, agent, {
      run_id: newRunId(),
      dry_run: true,
      plan: [step('split.tool', 'hi'), step('split.tool', 'hi', '^1 || ^2')],
    });
    expect(res.status).toBe(200);
    expect(res.body.steps).toMatchObject([
      { version: '1.0.0', status: 'admissible' },
      { version: '1.0.0', status: 'admissible' },
    ]);
  });

  it('still refuses the newer version by name with 403 unauthorized_tool_access, which the views do not show', async () => {
    for (const version of ['2.0.0', '^2']) {
      const res = await execute(h.client, agent, { run_id: newRunId(), plan: [step('split.tool', 'hi', version)] });
      expect(res.status, version).toBe(403);
      expect(res.body.steps[0]).toMatchObject({
        version: '2.0.0',
        status: 'denied',
        error: { code: 'unauthorized_tool_access' },
      });
      const shown = await h.client.get('/tools/split.tool', { token: agent, query: { version } });
      expect(shown.status, version).toBe(404);
    }
  });

  it('gives the agents on the newer allowlist the newer version, and operators the newest, as before', async () => {
    expect((await offered(other)).find((t) => t.id === 'split.tool')).toMatchObject({ version: '2.0.0' });
    const runId = newRunId();
    const res = await execute(h.client, other, { run_id: runId, plan: [step('split.tool', 'hi')] });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.steps[0].version).toBe('2.0.0');
    expect(reached(runId)).toEqual(['/cost/2']);
    expect((await h.client.get('/tools/split.tool', { token: platform })).body.version).toBe('2.0.0');
  });

  it('leaves an agent that may use no version with a clear denial: 403 to its call, 404 to its views', async () => {
    const stranger = tokens.agent('stranger.agent', { tenant: T });
    const res = await execute(h.client, stranger, { run_id: newRunId(), plan: [step('split.tool', 'hi')] });
    expect(res.status).toBe(403);
    expect(res.body.steps[0]).toMatchObject({ version: '2.0.0', error: { code: 'unauthorized_tool_access' } });
    expect((await h.client.get('/tools/split.tool', { token: stranger })).body.error.code).toBe('tool_not_registered');
    expect((await offered(stranger)).map((t) => t.id)).not.toContain('split.tool');
  });
});

describe('a newer version in a category agents may not use', () => {
  it('leaves the agent on the version it sees, for its views and its calls alike', async () => {
    expect((await offered()).find((t) => t.id === 'shift.tool')).toMatchObject({
      version: '1.0.0',
      category: 'read_only',
    });
    expect((await h.client.get('/tools/shift.tool', { token: agent })).body.version).toBe('1.0.0');
    const runId = newRunId();
    const res = await execute(h.client, agent, { run_id: runId, plan: [step('shift.tool', 'hi')] });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.steps[0]).toMatchObject({ version: '1.0.0', status: 'completed' });
    expect(reached(runId)).toEqual(['/echo']);
  });

  it('does not stop the tool being granted: the grant is on record with the category of the version it lets the agent call', async () => {
    const audit = await h.client.get('/audit', {
      token: platform,
      query: { event_type: 'grant.created', tool_id: 'shift.tool' },
    });
    expect(audit.status).toBe(200);
    expect(
      audit.body.items.find((e: { details: { grant_id: string } }) => e.details.grant_id === shiftGrant.id),
    ).toMatchObject({ tool_category: 'read_only' });
  });

  it('still refuses a grant when no version is one agents may use (403 tool_category_blocked)', async () => {
    const res = await h.client.post('/grants', {
      token: tokens.tenantOperator(T),
      body: {
        agent_id: AGENT,
        tool_id: 'locked.tool',
        scope: 'per-tenant',
        scope_ref: T,
        expires_at: new Date(Date.now() + 3600_000).toISOString(),
        rationale: 'wants the admin tool',
      },
    });
    expect(res.status).toBe(403);
    expect(res.body.error).toMatchObject({
      code: 'tool_category_blocked',
      details: { tool_id: 'locked.tool', category: 'final_write' },
    });
  });

  it('refuses the blocked version by name with 403 tool_category_blocked', async () => {
    const res = await execute(h.client, agent, { run_id: newRunId(), plan: [step('shift.tool', 'hi', '2.0.0')] });
    expect(res.status).toBe(403);
    expect(res.body.steps[0]).toMatchObject({ version: '2.0.0', error: { code: 'tool_category_blocked' } });
  });
});

describe('a grant made while the newest version is final_write (SPEC §1: it never confers that version)', () => {
  const SUB = 'split.sub';
  const sub = tokens.agent(SUB, { tenant: T });
  const operator = tokens.tenantOperator(T);

  it('runs the usable version for a range that also matches the blocked one, and refuses a range only the blocked one matches', async () => {
    for (const range of ['*', '>=1.0.0', '^1 || ^2']) {
      const runId = newRunId();
      const res = await execute(h.client, agent, { run_id: runId, plan: [step('shift.tool', 'hi', range)] });
      expect(res.status, range).toBe(200);
      expect(res.body.steps[0], range).toMatchObject({ version: '1.0.0', status: 'completed' });
      expect(reached(runId), range).toEqual(['/echo']);
    }
    for (const range of ['^2', '>1.0.0']) {
      const runId = newRunId();
      const res = await execute(h.client, agent, { run_id: runId, plan: [step('shift.tool', 'hi', range)] });
      expect(res.status, range).toBe(403);
      expect(res.body.steps[0], range).toMatchObject({ version: '2.0.0', error: { code: 'tool_category_blocked' } });
      const dry = await execute(h.client, agent, {
        run_id: newRunId(),
        dry_run: true,
        plan: [step('shift.tool', 'hi', range)],
      });
      expect(dry.body.steps[0], range).toMatchObject({
        version: '2.0.0',
        status: 'denied',
        error: { code: 'tool_category_blocked' },
      });
      expect(reached(runId), range).toEqual([]);
    }
  });

  it('resumes a call approved before a blocked version was registered on the version approved', async () => {
    await registerTool(h.client, {
      id: 'held.tool',
      version: '1.0.0',
      category: 'draft_write',
      allowed_agents: [AGENT],
      requires_approval: true,
      backendUrl: `${backend.url}/echo`,
    });
    await grantTool(h.client, { tenant: T, agent: AGENT, tool: 'held.tool' });
    const runId = newRunId();
    const held = await execute(h.client, agent, { run_id: runId, plan: [step('held.tool', 'hi', '*')] });
    expect(held.status).toBe(202);
    await registerTool(h.client, {
      id: 'held.tool',
      version: '1.1.0',
      category: 'final_write',
      risk_level: 'high',
      backendUrl: `${backend.url}/cost/2`,
    });
    expect(
      (
        await h.client.post(`/approvals/${held.body.steps[0].approval_id}/approve`, {
          token: operator,
          body: { rationale: 'checked' },
        })
      ).status,
    ).toBe(200);
    const resumed = await h.client.post(`/runs/${runId}/resume`, { token: agent, body: {} });
    expect(resumed.status, JSON.stringify(resumed.body)).toBe(200);
    expect(resumed.body.steps[0]).toMatchObject({ version: '1.0.0', status: 'completed' });
    expect(reached(runId)).toEqual(['/echo']);
  });

  it('gives a sub-agent it was handed to the usable version only, a blocked version registered after the grants included', async () => {
    await registerTool(h.client, {
      id: 'handed.tool',
      version: '1.0.0',
      allowed_agents: [AGENT, SUB],
      backendUrl: `${backend.url}/echo`,
    });
    for (const agentId of [AGENT, SUB]) await grantTool(h.client, { tenant: T, agent: agentId, tool: 'handed.tool' });
    await registerTool(h.client, {
      id: 'handed.tool',
      version: '2.0.0',
      category: 'admin',
      risk_level: 'critical',
      backendUrl: `${backend.url}/cost/2`,
    });
    for (const [range, status, expected] of [
      ['*', 200, { version: '1.0.0', status: 'completed' }],
      ['2.0.0', 403, { version: '2.0.0', error: { code: 'tool_category_blocked' } }],
    ] as const) {
      const root = newRunId('root');
      expect(
        (
          await execute(h.client, agent, {
            run_id: root,
            keep_open: true,
            budget_units: 10,
            plan: [step('handed.tool', 'hi')],
          })
        ).status,
      ).toBe(200);
      const subRun = newRunId('sub');
      const handed = await h.client.post(`/runs/${root}/handoffs`, {
        token: agent,
        body: {
          sub_agent_id: SUB,
          sub_run_id: subRun,
          budget_units: 5,
          delegable_tool_ids: ['handed.tool'],
          max_fanout: 0,
        },
      });
      expect(handed.status, JSON.stringify(handed.body)).toBe(201);
      const res = await execute(h.client, sub, {
        run_id: subRun,
        parent_run_id: root,
        plan: [step('handed.tool', 'hi', range)],
      });
      expect(res.status, range).toBe(status);
      expect(res.body.steps[0], range).toMatchObject(expected);
      expect(reached(subRun), range).toEqual(status === 200 ? ['/echo'] : []);
    }
  });
});

describe("a grant's capability modifiers are bounded by the version its agent's calls run", () => {
  const operator = tokens.tenantOperator(T);
  const grantWith = (
    agentId: string,
    egress_domains: string[],
    scope: { scope: string; scope_ref: string } = { scope: 'per-tenant', scope_ref: T },
  ) =>
    h.client.post('/grants', {
      token: operator,
      body: {
        agent_id: agentId,
        tool_id: 'egress.split',
        ...scope,
        capability_modifiers: { egress_domains },
        expires_at: new Date(Date.now() + 3600_000).toISOString(),
        rationale: 'narrowed egress',
      },
    });
  const wider = {
    code: 'invalid_request',
    details: { issues: [{ field: 'body.capability_modifiers.egress_domains.0' }] },
  };

  beforeAll(async () => {
    // Each version reaches its own host and is on its own allowlist: AGENT's calls run 1.0.0 (once
    // its tenant enables external calls; T has them off, and a grant outlives that policy).
    const external = { category: 'external_call' as const, risk_level: 'medium' as const, ...egressSchemas };
    await registerTool(h.client, {
      id: 'egress.split',
      version: '1.0.0',
      allowed_agents: [AGENT],
      egress: { allowed_hosts: ['one.example.test'] },
      ...external,
    });
    await registerTool(h.client, {
      id: 'egress.split',
      version: '2.0.0',
      allowed_agents: ['someone.else'],
      egress: { allowed_hosts: ['two.example.test'] },
      ...external,
    });
  });

  it('admits modifiers within the version the grantee runs, and refuses ones only a version it never gets would allow', async () => {
    expect((await grantWith(AGENT, ['one.example.test'])).status).toBe(201);
    const refused = await grantWith(AGENT, ['two.example.test']);
    expect(refused.status).toBe(400);
    expect(refused.body.error).toMatchObject(wider);
    // The agents on the newer allowlist run 2.0.0: the other way round.
    expect((await grantWith('someone.else', ['two.example.test'])).status).toBe(201);
    expect((await grantWith('someone.else', ['one.example.test'])).body.error).toMatchObject(wider);
  });

  it('judges a renewal the same way', async () => {
    // Its own session: the per-tenant grant of the test before still holds these modifiers.
    const granted = await grantWith(AGENT, ['one.example.test'], { scope: 'per-session', scope_ref: 'renewal' });
    expect(granted.status).toBe(201);
    const renew = (egress_domains: string[]) =>
      h.client.post(`/grants/${granted.body.id}/renew`, {
        token: operator,
        body: {
          rationale: 'still needed',
          expires_at: new Date(Date.now() + 7200_000).toISOString(),
          capability_modifiers: { egress_domains },
        },
      });
    expect((await renew(['two.example.test'])).body.error).toMatchObject(wider);
    expect((await renew(['one.example.test'])).status).toBe(201);
  });

  it('judges by the newest version agents may use, as before, a grantee no allowlist names by id', async () => {
    expect((await grantWith('stranger.agent', ['two.example.test'])).status).toBe(201);
    expect((await grantWith('stranger.agent', ['one.example.test'])).body.error).toMatchObject(wider);
  });
});

describe('a newer external_call version', () => {
  it('is skipped while the tenant has external calls off, for views and calls alike', async () => {
    expect((await offered()).find((t) => t.id === 'reach.tool')).toMatchObject({ version: '1.0.0' });
    expect((await h.client.get('/tools/reach.tool', { token: agent })).body.version).toBe('1.0.0');
    const runId = newRunId();
    const res = await execute(h.client, agent, { run_id: runId, plan: [step('reach.tool', 'hi')] });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.steps[0]).toMatchObject({ version: '1.0.0', status: 'completed' });
    expect(reached(runId)).toEqual(['/echo']);
  });

  it('is what the agent sees and what its calls resolve once the tenant enables external calls', async () => {
    expect((await setExternalCalls(true)).status).toBe(200);
    try {
      expect((await offered()).find((t) => t.id === 'reach.tool')).toMatchObject({
        version: '2.0.0',
        category: 'external_call',
      });
      expect((await h.client.get('/tools/reach.tool', { token: agent })).body.version).toBe('2.0.0');
      const res = await h.client.post('/runs/execute', {
        token: agent,
        body: {
          run_id: newRunId(),
          context: {},
          dry_run: true,
          plan: [{ tool_id: 'reach.tool', input: { url: 'https://api.example.test/' } }],
        },
      });
      expect(res.body.steps[0].version).toBe('2.0.0');
      expect(res.body.steps[0].verdicts.slice(0, 3)).toEqual([
        { stage: 'registry', ok: true },
        { stage: 'category', ok: true },
        { stage: 'allowlist', ok: true },
      ]);
    } finally {
      await setExternalCalls(false);
    }
  });
});

describe('retiring a version', () => {
  it('is deprecation: a deprecated version the agent may use is not fallen back to', async () => {
    expect((await offered()).map((t) => t.id)).not.toContain('retired.tool');
    const res = await execute(h.client, agent, { run_id: newRunId(), plan: [step('retired.tool', 'hi')] });
    expect(res.status).toBe(403);
    expect(res.body.steps[0]).toMatchObject({ version: '2.0.0', error: { code: 'unauthorized_tool_access' } });
  });
});

describe('the allowlist stage agrees with the views on family entries', () => {
  it('never matches a family entry by an agent id that looks like one', async () => {
    const impostor = tokens.agent('family:splitters', { tenant: T });
    expect((await offered(impostor)).map((t) => t.id)).not.toContain('family.tool');
    const res = await execute(h.client, impostor, { run_id: newRunId(), plan: [step('family.tool', 'hi')] });
    expect(res.status).toBe(403);
    expect(res.body.steps[0].error.code).toBe('unauthorized_tool_access');
  });
});

describe('the catalog resolving a call', () => {
  const asAgent = { agentId: AGENT, family: undefined };
  const asCaller = (policy: () => Promise<boolean>) =>
    ({ as: 'caller', agent: asAgent, externalCallEnabled: policy }) as const;
  const counting = (answer: boolean) => {
    const asked = { count: 0 };
    return { asked, policy: async () => (asked.count++, answer) };
  };

  it('reads the tenant policy only when the version depends on it', async () => {
    const { catalog } = h.client.app.services;
    for (const [toolId, expected] of [
      ['split.tool', 0],
      ['only.external', 0],
      ['reach.tool', 1],
    ] as const) {
      const { asked, policy } = counting(false);
      expect((await catalog.resolve(toolId, undefined, asCaller(policy))).ok, toolId).toBe(true);
      expect(asked.count, toolId).toBe(expected);
    }
  });

  it('fails only when no version matches for anyone', async () => {
    const { catalog } = h.client.app.services;
    const { policy } = counting(true);
    expect(await catalog.resolve('no.such.tool', undefined, asCaller(policy))).toEqual({
      ok: false,
      code: 'tool_not_registered',
    });
    expect(await catalog.resolve('split.tool', '^3', asCaller(policy))).toEqual({
      ok: false,
      code: 'tool_version_not_found',
    });
    expect(await catalog.resolve('reach.tool', undefined, asCaller(policy))).toMatchObject({
      ok: true,
      tool: { version: '2.0.0' },
    });
  });
});
