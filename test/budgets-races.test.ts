import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TestBackend } from './helpers/backend.js';
import { hasPostgresServer } from './helpers/database.js';
import { AppClient, startHarness, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';
import { createBudget, grantTool, newRunId, registerTool } from './helpers/world.js';
import { lockWaits, until } from './helpers/waits.js';

// A budget changed while a reservation is in flight (SPEC §5: exact under concurrency). The
// reservation is held on a counter row by another session, on a replica that knows nothing of
// the budget yet, while an operator changes the budgets through another replica.
describe.skipIf(!hasPostgresServer)('budget changes racing reservations (needs a PostgreSQL server)', () => {
  const T = 'tenant-budget-races';
  const operator = tokens.tenantOperator(T);
  let h: Harness;
  let backend: TestBackend;
  let watcher: pg.Client;

  beforeAll(async () => {
    h = await startHarness();
    backend = await new TestBackend().start();
    watcher = new pg.Client({ connectionString: h.db.url });
    await watcher.connect();
    const agents = ['lowered.agent', 'created.agent'];
    await registerTool(h.client, {
      id: 'one',
      backendUrl: `${backend.url}/echo`,
      cost_units: 1,
      allowed_agents: agents,
    });
    await registerTool(h.client, {
      id: 'three',
      backendUrl: `${backend.url}/echo`,
      cost_units: 3,
      allowed_agents: agents,
    });
    for (const agent of agents)
      for (const tool of ['one', 'three']) await grantTool(h.client, { tenant: T, agent, tool });
  });

  afterAll(async () => {
    await watcher?.end();
    await backend?.close();
    await h?.close();
  });

  const call = (client: AppClient, agent: string, tool: string) =>
    client.post('/runs/execute', {
      token: tokens.agent(agent, { tenant: T }),
      body: { run_id: newRunId(), context: {}, plan: [{ tool_id: tool, input: { q: 'x' } }] },
    });
  const spentPerLedger = async (agent: string) =>
    Number(
      (
        await watcher.query(
          `select coalesce(sum(case status when 'settled' then actual_units when 'reserved' then units else 0 end), 0) as n from budget_reservations where tenant_id = $1 and agent_id = $2`,
          [T, agent],
        )
      ).rows[0].n,
    );

  /** Holds a counter row, runs `during` while a reservation on a fresh replica waits for it, then lets go. */
  async function withReservationInFlight(counterKey: string, agent: string, during: () => Promise<void>) {
    const fresh = await AppClient.start(h.db.database);
    const holder = new pg.Client({ connectionString: h.db.url });
    await holder.connect();
    try {
      await holder.query('begin');
      await holder.query('select * from budget_counters where counter_key = $1 for update', [counterKey]);
      const inFlight = call(fresh, agent, 'three');
      await until('the reservation to wait for the counter', async () => (await lockWaits(watcher)) >= 1);
      const change = during();
      // Give the change its chance to answer while the reservation is still in flight (it used
      // to; now it waits for it), then let the reservation go on.
      for (let i = 0; i < 100 && (await lockWaits(watcher)) < 2; i += 1) await new Promise((r) => setTimeout(r, 10));
      await holder.query('commit');
      expect((await inFlight).status).toBe(200);
      await change;
    } finally {
      await holder.end();
      await fresh.close();
    }
  }

  it('a limit lowered while a call is being admitted is decided after that call, and binds every later one', async () => {
    const agent = 'lowered.agent';
    const budget = await createBudget(h.client, {
      tenant: T,
      scope: 'agent',
      agent_id: agent,
      limit_units: 10,
      warn_ratio: 1,
    });
    for (let i = 0; i < 4; i += 1) expect((await call(h.client, agent, 'one')).status).toBe(200);
    let lowered: { status: number; body: any } | undefined;
    await withReservationInFlight(budget.id, agent, async () => {
      lowered = await h.client.put(`/budgets/${budget.id}`, { token: operator, body: { limit_units: 5 } });
    });
    expect(lowered!.status).toBe(200);
    // The answer to the change already counts the call admitted under the old limit.
    expect(lowered!.body.spent_units + lowered!.body.reserved_units).toBe(7);
    expect((await call(h.client, agent, 'one')).status).toBe(402);
    expect(await spentPerLedger(agent)).toBe(7);
  });

  it('a budget created while a call is in flight counts that call', async () => {
    const agent = 'created.agent';
    const tenantBudget = await createBudget(h.client, { tenant: T, limit_units: 1000, warn_ratio: 1 });
    let created: { status: number; body: any } | undefined;
    await withReservationInFlight(tenantBudget.id, agent, async () => {
      created = await h.client.post('/budgets', {
        token: operator,
        body: { scope: 'agent', agent_id: agent, period: 'total', limit_units: 5, warn_ratio: 1, grace_units: 0 },
      });
    });
    expect(created!.status).toBe(201);
    expect(created!.body.spent_units + created!.body.reserved_units).toBe(3);
    const answers = [];
    for (let i = 0; i < 6; i += 1) answers.push((await call(h.client, agent, 'one')).status);
    expect(answers.filter((s) => s === 200)).toHaveLength(2);
    expect(await spentPerLedger(agent)).toBe(5);
    const shown = await h.client.get(`/budgets/${created!.body.id}`, { token: operator });
    expect(shown.body).toMatchObject({ spent_units: 5, reserved_units: 0 });
  });
});
