import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startHarness, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';

let h: Harness;
beforeAll(async () => {
  h = await startHarness();
});
afterAll(() => h.close());

describe('tenant policy', () => {
  it('denies external calls by default', async () => {
    const res = await h.client.get('/tenants/t1/policy', { token: tokens.tenantOperator('t1') });
    expect(res.status).toBe(200);
    expect(res.body).toEqual({ tenant_id: 't1', external_call_enabled: false, updated_at: null, updated_by: null });
  });

  it('is changed by a platform-operator only, and the change is audited', async () => {
    const denied = await h.client.put('/tenants/t1/policy', {
      token: tokens.tenantOperator('t1'),
      body: { external_call_enabled: true },
    });
    expect(denied.status).toBe(403);
    const agent = await h.client.put('/tenants/t1/policy', {
      token: tokens.agent('a.one', { tenant: 't1' }),
      body: { external_call_enabled: true },
    });
    expect(agent.body.error.code).toBe('agent_forbidden');
    const res = await h.client.put('/tenants/t1/policy', {
      token: tokens.platform('ops.root'),
      body: { external_call_enabled: true },
    });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ tenant_id: 't1', external_call_enabled: true, updated_by: 'operator:ops.root' });
    expect(
      (await h.client.get('/tenants/t1/policy', { token: tokens.tenantOperator('t1') })).body.external_call_enabled,
    ).toBe(true);
    const events = await h.client.get('/audit', {
      token: tokens.platform(),
      query: { event_type: 'tenant.policy_changed' },
    });
    expect(events.body.items[0]).toMatchObject({
      tenant_id: 't1',
      details: { before: { external_call_enabled: false }, after: { external_call_enabled: true } },
    });
    // Setting it again changes nothing and records nothing.
    const again = await h.client.put('/tenants/t1/policy', {
      token: tokens.platform('ops.other'),
      body: { external_call_enabled: true },
    });
    expect(again.body).toMatchObject({ external_call_enabled: true, updated_by: 'operator:ops.root' });
    expect(
      (await h.client.get('/audit', { token: tokens.platform(), query: { event_type: 'tenant.policy_changed' } })).body
        .items,
    ).toHaveLength(events.body.items.length);
  });

  it('hides another tenant from a tenant-operator', async () => {
    const res = await h.client.get('/tenants/t2/policy', { token: tokens.tenantOperator('t1') });
    expect(res.status).toBe(404);
    expect(res.body.error.code).toBe('not_found');
  });

  it('rejects a malformed policy', async () => {
    const res = await h.client.put('/tenants/t1/policy', {
      token: tokens.platform(),
      body: { external_call_enabled: 'yes' },
    });
    expect(res.status).toBe(400);
    expect(res.body.error.message).toContain('body.external_call_enabled');
  });
});
