import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TestBackend } from './helpers/backend.js';
import { hasPostgresServer } from './helpers/database.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';
import { createBudget, grantTool, newRunId, registerTool } from './helpers/world.js';
import { lockWaits, until } from './helpers/waits.js';

// The grant stage resolves a live grant, then records the run's reliance on it under the grant's
// share lock. A revocation that lands in between refuses the call at the grant stage: nothing is
// reserved or spent for it, and the next call finds the budget and the bucket whole.
describe.skipIf(!hasPostgresServer)('a revocation landing while a call is admitted (needs a PostgreSQL server)', () => {
  const T = 'tenant-admission-races';
  const agent = 'raced.agent';
  let h: Harness;
  let backend: TestBackend;
  let watcher: pg.Client;

  beforeAll(async () => {
    h = await startHarness();
    backend = await new TestBackend().start();
    watcher = new pg.Client({ connectionString: h.db.url });
    await watcher.connect();
    // One token that never refills, and a budget of exactly one call: a call refused after taking
    // either would leave the next call refused.
    await registerTool(h.client, {
      id: 'raced',
      backendUrl: `${backend.url}/echo`,
      cost_units: 2,
      allowed_agents: [agent],
      rate_limit: { capacity: 1, refill_per_second: 0.0001 },
    });
  });

  afterAll(async () => {
    await watcher?.end();
    await backend?.close();
    await h?.close();
  });

  const call = (runId: string) =>
    h.client.post('/runs/execute', {
      token: tokens.agent(agent, { tenant: T }),
      body: { run_id: runId, context: {}, plan: [{ tool_id: 'raced', input: { q: 'x' } }] },
    });
  const reservationsOf = async (runId: string) =>
    (
      await watcher.query('select status from budget_reservations where tenant_id = $1 and run_id = $2', [T, runId])
    ).rows.map((row) => row.status as string);

  /**
   * Sends a call while a revocation of its grant holds the grant's row, uncommitted: the call still reads the grant as
   * live, and its grant-use record waits for the revocation to commit. The call is refused as revoked.
   */
  async function refusedForRevocationLandingMeanwhile(grantId: string, send: () => ReturnType<typeof call>) {
    const revoker = new pg.Client({ connectionString: h.db.url });
    await revoker.connect();
    try {
      await revoker.query('begin');
      await revoker.query(
        "update grants set revoked_at = now(), revoked_by_actor_id = 'ops', revoked_by_actor_role = 'tenant-operator', revocation_reason = 'raced' where id = $1",
        [grantId],
      );
      const answer = send();
      await until('the grant-use record to wait for the revocation', async () => (await lockWaits(watcher)) === 1);
      await revoker.query('commit');
      const res = await answer;
      expect(res.status, JSON.stringify(res.body)).toBe(403);
      expect(res.body.steps).toMatchObject([{ status: 'denied', error: { code: 'grant_revoked' } }]);
    } finally {
      await revoker.end();
    }
  }

  it('is refused at the grant stage, with nothing reserved and no token taken', async () => {
    const revoked = await grantTool(h.client, { tenant: T, agent, tool: 'raced' });
    const budget = await createBudget(h.client, {
      tenant: T,
      scope: 'agent',
      agent_id: agent,
      limit_units: 2,
      warn_ratio: 1,
    });
    const runId = newRunId('raced');
    await refusedForRevocationLandingMeanwhile(revoked.id, () => call(runId));
    expect(backend.hitsOn('/echo')).toHaveLength(0);
    expect(await reservationsOf(runId)).toEqual([]);
    const shown = await h.client.get(`/budgets/${budget.id}`, { token: tokens.tenantOperator(T) });
    expect(shown.body).toMatchObject({ spent_units: 0, reserved_units: 0 });
    const denial = await watcher.query(
      'select event_type, reason_code from audit_events where tenant_id = $1 and run_id = $2',
      [T, runId],
    );
    expect(denial.rows).toEqual([{ event_type: 'run.step.denied', reason_code: 'grant_revoked' }]);

    // The budget and the bucket are whole: a call under a new grant gets the one token and the
    // two units.
    await grantTool(h.client, { tenant: T, agent, tool: 'raced' });
    const next = await call(newRunId('raced'));
    expect(next.status, JSON.stringify(next.body)).toBe(200);
    expect(backend.hitsOn('/echo')).toHaveLength(1);
  });

  it("reserves nothing with the run's claim either, once the gateway knows the budget", async () => {
    const warmAgent = 'raced.warm';
    await registerTool(h.client, {
      id: 'raced.warm',
      backendUrl: `${backend.url}/echo`,
      cost_units: 2,
      allowed_agents: [warmAgent],
    });
    const revoked = await grantTool(h.client, { tenant: T, agent: warmAgent, tool: 'raced.warm' });
    const budget = await createBudget(h.client, {
      tenant: T,
      scope: 'agent',
      agent_id: warmAgent,
      limit_units: 100,
      warn_ratio: 1,
    });
    const callWarm = (runId: string) =>
      h.client.post('/runs/execute', {
        token: tokens.agent(warmAgent, { tenant: T }),
        body: { run_id: runId, context: {}, plan: [{ tool_id: 'raced.warm', input: { q: 'x' } }] },
      });
    // Calls before it teach the gateway the budget, so the next claim reserves its first call itself.
    for (let i = 0; i < 3; i += 1) expect((await callWarm(newRunId('warm'))).status).toBe(200);
    const runId = newRunId('raced-warm');
    await refusedForRevocationLandingMeanwhile(revoked.id, () => callWarm(runId));
    expect(await reservationsOf(runId)).toEqual([]);
    const shown = await h.client.get(`/budgets/${budget.id}`, { token: tokens.tenantOperator(T) });
    expect(shown.body).toMatchObject({ spent_units: 6, reserved_units: 0 });
  });
});
