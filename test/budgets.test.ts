import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startHarness, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';

let h: Harness;
const platform = tokens.platform();
const opsA = tokens.tenantOperator('tenant-a');
const opsB = tokens.tenantOperator('tenant-b');

beforeAll(async () => {
  h = await startHarness();
});
afterAll(() => h.close());

async function auditEvents(query: Record<string, string>) {
  const res = await h.client.get('/audit', { token: platform, query: { limit: 500, ...query } });
  return res.body.items as Array<Record<string, any>>;
}

describe('POST /budgets', () => {
  it('creates a budget in the operator’s own tenant and audits it', async () => {
    const res = await h.client.post('/budgets', {
      token: opsA,
      body: {
        scope: 'agent',
        agent_id: 'a.writer',
        period: 'day',
        limit_units: 250.5,
        warn_ratio: 0.75,
        grace_units: 10,
      },
    });
    expect(res.status).toBe(201);
    expect(res.body).toMatchObject({
      tenant_id: 'tenant-a',
      scope: 'agent',
      agent_id: 'a.writer',
      run_id: null,
      period: 'day',
      limit_units: 250.5,
      warn_ratio: 0.75,
      grace_units: 10,
      spent_units: 0,
      reserved_units: 0,
      period_end: expect.any(String),
      created_by: 'operator:ops.tenant-a',
      removed_at: null,
    });
    expect(res.body.id).toMatch(/^bud_/);
    const [event] = await auditEvents({ event_type: 'budget.created', agent_id: 'a.writer' });
    expect(event).toMatchObject({
      tenant_id: 'tenant-a',
      actor: 'operator:ops.tenant-a',
      details: {
        budget_id: res.body.id,
        budget: { limit_units: 250.5, warn_ratio: 0.75, grace_units: 10, period: 'day' },
      },
    });
  });

  it('defaults warn_ratio to 0.8 and grace_units to 0', async () => {
    const res = await h.client.post('/budgets', {
      token: opsA,
      body: { scope: 'tenant', period: 'month', limit_units: 1000 },
    });
    expect(res.status).toBe(201);
    expect(res.body).toMatchObject({ warn_ratio: 0.8, grace_units: 0, agent_id: null, run_id: null });
  });

  it('answers an identical request again with the existing budget, and different limits with 409', async () => {
    const body = { scope: 'run', run_id: 'run-42', period: 'total', limit_units: 30, warn_ratio: 0.9, grace_units: 0 };
    const first = await h.client.post('/budgets', { token: opsA, body });
    expect(first.status).toBe(201);
    const again = await h.client.post('/budgets', { token: opsA, body });
    expect(again.status).toBe(200);
    expect(again.body.id).toBe(first.body.id);
    const different = await h.client.post('/budgets', { token: opsA, body: { ...body, limit_units: 31 } });
    expect(different.status).toBe(409);
    expect(different.body.error).toMatchObject({ code: 'budget_conflict', details: { budget_id: first.body.id } });
    // The same subject in another period, or in another tenant, is another budget.
    expect((await h.client.post('/budgets', { token: opsA, body: { ...body, period: 'day' } })).status).toBe(201);
    expect((await h.client.post('/budgets', { token: opsB, body })).status).toBe(201);
    expect(await auditEvents({ event_type: 'budget.created', run_id: 'run-42' })).toHaveLength(3);
  });

  it('creates one budget when identical requests race', async () => {
    const body = { scope: 'agent', agent_id: 'a.racer', period: 'month', limit_units: 5 };
    const results = await Promise.all(
      Array.from({ length: 8 }, () => h.client.post('/budgets', { token: opsA, body })),
    );
    expect(results.map((r) => r.status).sort()).toEqual([200, 200, 200, 200, 200, 200, 200, 201]);
    expect(new Set(results.map((r) => r.body.id)).size).toBe(1);
  });

  it.each([
    [{ scope: 'agent', period: 'day', limit_units: 1 }, 'body.agent_id'],
    [{ scope: 'run', period: 'day', limit_units: 1 }, 'body.run_id'],
    [{ scope: 'tenant', agent_id: 'x', period: 'day', limit_units: 1 }, 'body.agent_id'],
    [{ scope: 'agent', agent_id: 'x', run_id: 'r', period: 'day', limit_units: 1 }, 'body.run_id'],
    [{ scope: 'tenant', period: 'day', limit_units: 0 }, 'body.limit_units'],
    [{ scope: 'tenant', period: 'day', limit_units: -5 }, 'body.limit_units'],
    [{ scope: 'tenant', period: 'day', limit_units: 0.0000001 }, 'body.limit_units'],
    [{ scope: 'tenant', period: 'day', limit_units: 1, grace_units: -1 }, 'body.grace_units'],
    [{ scope: 'tenant', period: 'day', limit_units: 1, warn_ratio: 0 }, 'body.warn_ratio'],
    [{ scope: 'tenant', period: 'day', limit_units: 1, warn_ratio: 1.01 }, 'body.warn_ratio'],
    [{ scope: 'tenant', period: 'week', limit_units: 1 }, 'body.period'],
    [{ scope: 'team', period: 'day', limit_units: 1 }, 'body.scope'],
    [{ scope: 'tenant', period: 'day', limit_units: '5' }, 'body.limit_units'],
    [{ scope: 'tenant', period: 'day', limit_units: 1, colour: 'blue' }, 'body'],
  ])('refuses %j with 400 invalid_request naming %s', async (body, field) => {
    const res = await h.client.post('/budgets', { token: opsA, body });
    expect(res.status).toBe(400);
    expect(res.body.error.code).toBe('invalid_request');
    expect(res.body.error.message).toContain(field);
  });

  it('accepts warn_ratio 1 and grace_units 0 at the edges', async () => {
    const res = await h.client.post('/budgets', {
      token: opsA,
      body: { scope: 'agent', agent_id: 'a.edge', period: 'day', limit_units: 0.000001, warn_ratio: 1, grace_units: 0 },
    });
    expect(res.status).toBe(201);
  });

  it('lets a platform-operator create a budget in any tenant it names', async () => {
    const body = { tenant_id: 'tenant-c', scope: 'tenant', period: 'total', limit_units: 9 };
    const res = await h.client.post('/budgets', { token: platform, body });
    expect(res.status).toBe(201);
    expect(res.body.tenant_id).toBe('tenant-c');
  });

  it('answers a tenant-operator naming another tenant with 404, creates nothing, and records the attempt', async () => {
    const res = await h.client.post('/budgets', {
      token: tokens.tenantOperator('tenant-a', 'mallory'),
      body: { tenant_id: 'tenant-b', scope: 'tenant', period: 'day', limit_units: 1_000_000 },
    });
    expect(res.status).toBe(404);
    expect(res.body.error.code).toBe('not_found');
    const listed = await h.client.get('/budgets', {
      token: platform,
      query: { tenant_id: 'tenant-b', scope: 'tenant', period: 'day' },
    });
    expect(listed.body.items).toEqual([]);
    const [event] = await auditEvents({ event_type: 'security.cross_tenant_attempt' });
    expect(event).toMatchObject({
      actor: 'operator:mallory',
      tenant_id: 'tenant-a',
      details: { route: 'POST /budgets', requested_tenant_id: 'tenant-b' },
    });
  });

  it('refuses agents with 403 agent_forbidden', async () => {
    const agent = tokens.agent('a.sneaky', { tenant: 'tenant-a' });
    const res = await h.client.post('/budgets', {
      token: agent,
      body: { scope: 'tenant', period: 'day', limit_units: 1e9 },
    });
    expect(res.status).toBe(403);
    expect(res.body.error.code).toBe('agent_forbidden');
  });
});

describe('GET /budgets', () => {
  let listTenant: string[];

  beforeAll(async () => {
    listTenant = [];
    for (const [i, body] of [
      { scope: 'tenant', period: 'day', limit_units: 1 },
      { scope: 'agent', agent_id: 'l.one', period: 'day', limit_units: 2 },
      { scope: 'agent', agent_id: 'l.two', period: 'month', limit_units: 3 },
      { scope: 'run', run_id: 'l-run', period: 'total', limit_units: 4 },
      { scope: 'agent', agent_id: 'l.one', period: 'month', limit_units: 5 },
    ].entries()) {
      const res = await h.client.post('/budgets', { token: platform, body: { tenant_id: 'tenant-list', ...body } });
      expect(res.status, String(i)).toBe(201);
      listTenant.push(res.body.id);
    }
  });

  it('lists a tenant’s live budgets newest first, with their usage', async () => {
    const res = await h.client.get('/budgets', { token: tokens.tenantOperator('tenant-list') });
    expect(res.status).toBe(200);
    expect(res.body.items.map((b: { id: string }) => b.id)).toEqual([...listTenant].reverse());
    expect(res.body.items[0]).toMatchObject({ spent_units: 0, reserved_units: 0 });
    expect(res.body.next_cursor).toBeNull();
  });

  it('filters by scope, agent, run and period', async () => {
    const ops = tokens.tenantOperator('tenant-list');
    const ids = async (query: Record<string, string>) =>
      (await h.client.get('/budgets', { token: ops, query })).body.items.map(
        (b: { limit_units: number }) => b.limit_units,
      );
    expect(await ids({ scope: 'agent' })).toEqual([5, 3, 2]);
    expect(await ids({ agent_id: 'l.one' })).toEqual([5, 2]);
    expect(await ids({ agent_id: 'l.one', period: 'day' })).toEqual([2]);
    expect(await ids({ run_id: 'l-run' })).toEqual([4]);
    expect(await ids({ period: 'day' })).toEqual([2, 1]);
  });

  it('pages with an opaque cursor without repeating or skipping', async () => {
    const seen: string[] = [];
    let cursor: string | undefined;
    for (let page = 0; page < 10; page += 1) {
      const res = await h.client.get('/budgets', {
        token: platform,
        query: { tenant_id: 'tenant-list', limit: 2, cursor },
      });
      expect(res.body.items.length).toBeLessThanOrEqual(2);
      seen.push(...res.body.items.map((b: { id: string }) => b.id));
      cursor = res.body.next_cursor ?? undefined;
      if (!cursor) break;
    }
    expect(seen).toEqual([...listTenant].reverse());
  });

  it('shows a tenant-operator only its own tenant, and a platform-operator every tenant', async () => {
    const own = await h.client.get('/budgets', { token: opsB, query: { limit: 500 } });
    expect(new Set(own.body.items.map((b: { tenant_id: string }) => b.tenant_id))).toEqual(new Set(['tenant-b']));
    const all = await h.client.get('/budgets', { token: platform, query: { limit: 500 } });
    const tenants = new Set(all.body.items.map((b: { tenant_id: string }) => b.tenant_id));
    expect(tenants.has('tenant-a') && tenants.has('tenant-b') && tenants.has('tenant-list')).toBe(true);
  });

  it('answers a tenant-operator naming another tenant with 404 and records the attempt', async () => {
    const res = await h.client.get('/budgets', { token: opsB, query: { tenant_id: 'tenant-list' } });
    expect(res.status).toBe(404);
    expect(res.text).not.toContain('l.one');
    const events = await auditEvents({ event_type: 'security.cross_tenant_attempt', tenant_id: 'tenant-b' });
    expect(events[0]).toMatchObject({ details: { route: 'GET /budgets', requested_tenant_id: 'tenant-list' } });
  });

  it('refuses bad filters with 400', async () => {
    for (const query of [{ scope: 'team' }, { limit: '0' }, { cursor: '!!nope' }, { colour: 'blue' }]) {
      const res = await h.client.get('/budgets', { token: platform, query });
      expect(res.status, JSON.stringify(query)).toBe(400);
    }
  });
});

describe('GET, PUT and DELETE /budgets/{id}', () => {
  async function create(token: string, body: Record<string, unknown>): Promise<string> {
    const res = await h.client.post('/budgets', { token, body });
    expect(res.status).toBe(201);
    return res.body.id;
  }

  it('shows the current period’s spent and reserved units', async () => {
    const id = await create(opsA, { scope: 'agent', agent_id: 'u.spender', period: 'month', limit_units: 100 });
    const ledger = h.client.app.services.budgets;
    const first = await ledger.reserve({ tenantId: 'tenant-a', agentId: 'u.spender', runId: 'r1', units: 10 });
    await ledger.reserve({ tenantId: 'tenant-a', agentId: 'u.spender', runId: 'r2', units: 5 });
    if (!first.ok) throw new Error('expected an admission');
    await ledger.settle(first.reservation, 7.25);
    const res = await h.client.get(`/budgets/${id}`, { token: opsA });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ id, spent_units: 7.25, reserved_units: 5 });
    const start = new Date(res.body.period_start);
    expect(start.getUTCDate()).toBe(1);
    expect(new Date(res.body.period_end).getUTCMonth()).toBe((start.getUTCMonth() + 1) % 12);
  });

  it('changes limits with PUT, keeps what was spent, and audits before and after', async () => {
    const id = await create(opsA, {
      scope: 'agent',
      agent_id: 'u.changer',
      period: 'total',
      limit_units: 10,
      warn_ratio: 0.5,
      grace_units: 1,
    });
    const res = await h.client.put(`/budgets/${id}`, { token: opsA, body: { limit_units: 20, grace_units: 0 } });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({
      id,
      limit_units: 20,
      warn_ratio: 0.5,
      grace_units: 0,
      updated_by: 'operator:ops.tenant-a',
    });
    expect((await h.client.get(`/budgets/${id}`, { token: opsA })).body.limit_units).toBe(20);
    const [event] = await auditEvents({ event_type: 'budget.updated', agent_id: 'u.changer' });
    expect(event).toMatchObject({
      tenant_id: 'tenant-a',
      details: {
        budget_id: id,
        before: { limit_units: 10, grace_units: 1 },
        after: { limit_units: 20, grace_units: 0, warn_ratio: 0.5 },
      },
    });
    // The same limits again change nothing and record nothing.
    const same = await h.client.put(`/budgets/${id}`, {
      token: tokens.tenantOperator('tenant-a', 'ops.other'),
      body: { limit_units: 20 },
    });
    expect(same.body).toMatchObject({ limit_units: 20, updated_by: 'operator:ops.tenant-a' });
    expect(await auditEvents({ event_type: 'budget.updated', agent_id: 'u.changer' })).toHaveLength(1);
  });

  it('refuses a PUT that changes nothing or touches what identifies a budget', async () => {
    const id = await create(opsA, { scope: 'agent', agent_id: 'u.fixed', period: 'day', limit_units: 10 });
    for (const body of [{}, { scope: 'tenant' }, { period: 'month' }, { limit_units: 0 }, { warn_ratio: 2 }]) {
      const res = await h.client.put(`/budgets/${id}`, { token: opsA, body });
      expect(res.status, JSON.stringify(body)).toBe(400);
    }
  });

  it('removes a budget with DELETE: gone from reads, audited, and its place free again', async () => {
    const body = { scope: 'agent', agent_id: 'u.removed', period: 'day', limit_units: 10 };
    const id = await create(opsA, body);
    const res = await h.client.request('DELETE', `/budgets/${id}`, { token: opsA });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ id, removed_at: expect.any(String) });
    expect((await h.client.get(`/budgets/${id}`, { token: opsA })).status).toBe(404);
    expect((await h.client.put(`/budgets/${id}`, { token: opsA, body: { limit_units: 1 } })).status).toBe(404);
    expect((await h.client.request('DELETE', `/budgets/${id}`, { token: opsA })).status).toBe(404);
    const listed = await h.client.get('/budgets', { token: opsA, query: { agent_id: 'u.removed' } });
    expect(listed.body.items).toEqual([]);
    const [event] = await auditEvents({ event_type: 'budget.removed', agent_id: 'u.removed' });
    expect(event).toMatchObject({ tenant_id: 'tenant-a', details: { budget_id: id } });
    const again = await create(opsA, body);
    expect(again).not.toBe(id);
  });

  it('answers another tenant’s budget with 404, changes nothing, and records each attempt platform-wide', async () => {
    const id = await create(opsB, { scope: 'agent', agent_id: 'u.private', period: 'day', limit_units: 10 });
    const eve = tokens.tenantOperator('tenant-a', 'eve');
    const get = await h.client.get(`/budgets/${id}`, { token: eve });
    const put = await h.client.put(`/budgets/${id}`, { token: eve, body: { limit_units: 1e9 } });
    const del = await h.client.request('DELETE', `/budgets/${id}`, { token: eve });
    for (const res of [get, put, del]) {
      expect(res.status).toBe(404);
      expect(res.body.error.code).toBe('not_found');
      expect(res.text).not.toContain('u.private');
    }
    expect((await h.client.get(`/budgets/${id}`, { token: opsB })).body).toMatchObject({
      limit_units: 10,
      removed_at: null,
    });
    const events = (await auditEvents({ event_type: 'security.cross_tenant_attempt' })).filter(
      (e) => e.actor === 'operator:eve',
    );
    expect(events.map((e) => e.details.route).sort()).toEqual([
      'DELETE /budgets/{id}',
      'GET /budgets/{id}',
      'PUT /budgets/{id}',
    ]);
    expect(
      events.every(
        (e) => e.details.budget_id === id && e.tenant_id === null && e.details.caller_tenant_id === 'tenant-a',
      ),
    ).toBe(true);
  });

  it('answers a PUT with a refused body alike for another tenant’s budget and an invented id', async () => {
    const id = await create(opsB, { scope: 'agent', agent_id: 'u.probed', period: 'day', limit_units: 10 });
    const eve = tokens.tenantOperator('tenant-a', 'eve');
    for (const body of [{}, { limit_units: 0 }, { scope: 'tenant' }]) {
      const real = await h.client.put(`/budgets/${id}`, { token: eve, body });
      const invented = await h.client.put('/budgets/bud_invented', { token: eve, body });
      expect([real.status, invented.status], JSON.stringify(body)).toEqual([400, 400]);
      expect(real.body.error).toEqual(invented.body.error);
    }
  });

  it('answers an unknown id with 404 and no security event', async () => {
    const before = (await auditEvents({ event_type: 'security.cross_tenant_attempt' })).length;
    const res = await h.client.get('/budgets/bud_doesnotexist', { token: opsA });
    expect(res.status).toBe(404);
    expect((await auditEvents({ event_type: 'security.cross_tenant_attempt' })).length).toBe(before);
  });

  it('lets a platform-operator read, change and remove any tenant’s budget', async () => {
    const id = await create(opsB, { scope: 'agent', agent_id: 'u.managed', period: 'day', limit_units: 10 });
    expect((await h.client.get(`/budgets/${id}`, { token: platform })).status).toBe(200);
    expect((await h.client.put(`/budgets/${id}`, { token: platform, body: { warn_ratio: 0.5 } })).body.warn_ratio).toBe(
      0.5,
    );
    expect((await h.client.request('DELETE', `/budgets/${id}`, { token: platform })).status).toBe(200);
  });
});
