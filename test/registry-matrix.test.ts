import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readCatalogFile, seedCatalog, type CatalogFile } from './helpers/seed-catalog.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';
import { toolBody } from './helpers/world.js';

/**
 * The registry matrix of seed 001 §21, proven through the API on the example catalog
 * (examples/scf-catalog.json, loaded the way `npm run seed:example` loads it).
 */

const TENANT = 'tenant-scf';
const platform = tokens.platform();
let h: Harness;
let catalog: CatalogFile;

const agentToken = (id: string, family = 'standard') => tokens.agent(id, { tenant: TENANT, family });
const offeredTo = async (token: string) => {
  const res = await h.client.get('/tools', { token });
  expect(res.status).toBe(200);
  return res.body.items as Array<Record<string, unknown> & { id: string; category: string }>;
};

beforeAll(async () => {
  h = await startHarness();
  catalog = await readCatalogFile(fileURLToPath(new URL('../examples/scf-catalog.json', import.meta.url)));
  const outcomes = await seedCatalog(catalog, (body) => h.client.post('/tools', { token: platform, body }));
  expect(outcomes.filter((o) => o.result !== 'registered')).toEqual([]);
});
afterAll(() => h.close());

describe('the example catalog', () => {
  it('registers every tool of seed 001 §6–13 and loads again without change', async () => {
    expect(catalog.tools).toHaveLength(31);
    const again = await seedCatalog(catalog, (body) => h.client.post('/tools', { token: platform, body }));
    expect(new Set(again.map((o) => o.result))).toEqual(new Set(['unchanged']));
  });

  it('lists every tool with an explicit allowlist that matches the agent matrix of §14', async () => {
    const all = (await h.client.get('/tools', { token: platform, query: { limit: 500 } })).body.items as Array<{
      id: string;
      allowed_agents: string[];
    }>;
    expect(all).toHaveLength(31);
    for (const tool of all) {
      const expected = catalog.agents!.filter((agent) => agent.may_use.includes(tool.id)).map((agent) => agent.id);
      expect(new Set(tool.allowed_agents), tool.id).toEqual(new Set(expected));
      expect(
        tool.allowed_agents.some((entry) => entry.startsWith('family:')),
        tool.id,
      ).toBe(false);
    }
  });
});

describe('each agent is offered exactly its allowed tools', () => {
  it.each([
    'standard.knowledge_steward',
    'standard.scf_control_analyst',
    'standard.framework_mapper',
    'standard.scope_soa_architect',
    'standard.evidence_analyst',
    'standard.gap_analyst',
    'standard.maturity_assessor',
    'standard.poam_planner',
    'standard.report_writer',
  ])('%s', async (agentId) => {
    const agent = catalog.agents!.find((a) => a.id === agentId)!;
    const offered = await offeredTo(agentToken(agentId));
    expect(offered.map((t) => t.id).sort()).toEqual([...agent.may_use].sort());
    expect(offered.every((t) => t.category === 'read_only' || t.category === 'draft_write')).toBe(true);
  });

  it('shows an agent no backend, target, registrant or allowlist, and no other agent', async () => {
    const res = await h.client.get('/tools', { token: agentToken('standard.knowledge_steward') });
    for (const tool of res.body.items) {
      for (const hidden of ['backend', 'allowed_agents', 'target', 'registered_by'])
        expect(tool).not.toHaveProperty(hidden);
    }
    expect(res.text).not.toContain('standard.evidence_analyst');
  });

  it('offers nothing to an agent the matrix does not name, even of the same family', async () => {
    expect(await offeredTo(agentToken('standard.intruder'))).toEqual([]);
    expect(await offeredTo(agentToken('family:standard'))).toEqual([]);
  });
});

describe('§21: what no agent can reach', () => {
  const forbidden = [
    'approve_soa',
    'approve_gap',
    'approve_maturity',
    'approve_poam',
    'approve_report',
    'delete_document',
    'admin_scf_import',
    'raw_database_query',
    'external_api_call',
  ];

  it('registers the forbidden tools of §13 for operators, with no agent on any final_write or admin tool', async () => {
    for (const id of forbidden) {
      const res = await h.client.get(`/tools/${id}`, { token: platform });
      expect(res.status, id).toBe(200);
      expect(res.body.allowed_agents, id).toEqual([]);
      expect(catalog.forbidden_tools!.find((f) => f.id === id)?.category).toBe(res.body.category);
    }
    const all = (await h.client.get('/tools', { token: platform, query: { limit: 500 } })).body.items as Array<{
      category: string;
      allowed_agents: string[];
    }>;
    const privileged = all.filter((t) => t.category === 'final_write' || t.category === 'admin');
    expect(privileged).toHaveLength(8);
    expect(privileged.every((t) => t.allowed_agents.length === 0)).toBe(true);
  });

  it('refuses a new version of a forbidden tool that would name an agent', async () => {
    const res = await h.client.post('/tools', {
      token: platform,
      body: toolBody({
        id: 'approve_soa',
        version: '1.0.1',
        category: 'final_write',
        risk_level: 'critical',
        allowed_agents: ['standard.scope_soa_architect'],
      }),
    });
    expect(res.status).toBe(400);
    expect(res.body.error.details.issues[0].field).toBe('body.allowed_agents');
  });

  it('never offers a forbidden tool to any agent, even with external calls enabled for its tenant', async () => {
    const enable = await h.client.put(`/tenants/${TENANT}/policy`, {
      token: platform,
      body: { external_call_enabled: true },
    });
    expect(enable.status).toBe(200);
    try {
      for (const agent of [...catalog.agents!.map((a) => a.id), 'standard.intruder']) {
        const ids = (await offeredTo(agentToken(agent))).map((t) => t.id);
        expect(
          ids.filter((id) => forbidden.includes(id)),
          agent,
        ).toEqual([]);
        for (const id of ['approve_gap', 'external_api_call']) {
          const direct = await h.client.get(`/tools/${id}`, { token: agentToken(agent) });
          expect(direct.status).toBe(404);
          expect(direct.body.error.code).toBe('tool_not_registered');
        }
      }
    } finally {
      await h.client.put(`/tenants/${TENANT}/policy`, { token: platform, body: { external_call_enabled: false } });
    }
  });

  it('keeps approval, mapping and finding-changing tools away from the agents §21 names', async () => {
    const mapper = (await offeredTo(agentToken('standard.framework_mapper'))).map((t) => t.id);
    expect(mapper.filter((id) => id.includes('mapping') && !id.startsWith('get_'))).toEqual([]);
    expect((await offeredTo(agentToken('standard.framework_mapper'))).every((t) => t.category === 'read_only')).toBe(
      true,
    );
    const evidence = (await offeredTo(agentToken('standard.evidence_analyst'))).map((t) => t.id);
    expect(evidence.filter((id) => id.startsWith('approve_'))).toEqual([]);
    const writer = await offeredTo(agentToken('standard.report_writer'));
    expect(writer.filter((t) => t.category === 'draft_write').map((t) => t.id)).toEqual([
      'suggest_report_section_draft',
    ]);
  });

  it('makes an unregistered tool not exist for agents', async () => {
    const res = await h.client.get('/tools/approve_everything', { token: agentToken('standard.gap_analyst') });
    expect(res.status).toBe(404);
    expect(res.body.error.code).toBe('tool_not_registered');
    expect(h.client.app.services.catalog.resolve('approve_everything')).toEqual({
      ok: false,
      code: 'tool_not_registered',
    });
  });
});

describe('external_call tools and the tenant policy', () => {
  beforeAll(async () => {
    const res = await h.client.post('/tools', {
      token: platform,
      body: toolBody({
        id: 'un.fetch',
        category: 'external_call',
        risk_level: 'high',
        allowed_agents: ['standard.report_writer'],
        egress: { allowed_hosts: ['*.un.org'] },
      }),
    });
    expect(res.status).toBe(201);
  });

  it('offers an allowlisted external_call tool only while the tenant enables external calls', async () => {
    const writer = agentToken('standard.report_writer');
    expect((await offeredTo(writer)).map((t) => t.id)).not.toContain('un.fetch');
    expect((await h.client.get('/tools/un.fetch', { token: writer })).status).toBe(404);
    await h.client.put(`/tenants/${TENANT}/policy`, { token: platform, body: { external_call_enabled: true } });
    try {
      const offered = await offeredTo(writer);
      expect(offered.find((t) => t.id === 'un.fetch')).toMatchObject({
        category: 'external_call',
        egress: { allowed_hosts: ['*.un.org'] },
      });
      const otherTenant = tokens.agent('standard.report_writer', { tenant: 'tenant-other', family: 'standard' });
      expect((await offeredTo(otherTenant)).map((t) => t.id)).not.toContain('un.fetch');
    } finally {
      await h.client.put(`/tenants/${TENANT}/policy`, { token: platform, body: { external_call_enabled: false } });
    }
  });
});
