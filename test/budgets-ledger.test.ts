import { sql } from 'kysely';
import { pino } from 'pino';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BudgetLedger } from '../src/budgets/budget-ledger.js';
import type { ReserveRequest, ReserveResult } from '../src/budgets/budget-reservation.js';
import { holdAuditChain } from '../src/db/lock-order.js';
import { counterId, readCounters } from '../src/budgets/budget-counter-repository.js';
import { closeAndUncharge } from '../src/budgets/reservation-close-repository.js';
import { holdRunUnits, lockRunAllowance, returnSubRunAllowances, runTotalRef } from '../src/budgets/run-allowance.js';
import { openDatabase } from '../src/db/database.js';
import { isDatabaseUnavailable } from '../src/db/unavailable.js';
import { createTestDatabase, hasPostgresServer, type TestDatabase } from './helpers/database.js';
import type { AppClient } from './helpers/harness.js';
import { ManualClock, startClient } from './helpers/manual-clock.js';
import { tokens } from './helpers/tokens.js';
import { lockWaits, until } from './helpers/waits.js';

// The admission API the pipeline calls: reserve before dispatch, settle or release after.
let testDb: TestDatabase;
let client: AppClient;
let ledger: BudgetLedger;
const clock = new ManualClock('2030-01-15T12:00:00.000Z');
const platform = tokens.platform();
let tenantSeq = 0;

beforeAll(async () => {
  testDb = await createTestDatabase();
  client = await startClient(testDb.database, clock);
  ledger = client.app.services.budgets;
});
afterAll(async () => {
  await client.close();
  await testDb.drop();
});

/** A tenant of its own for each test, so that budgets never meet. */
function freshTenant(): string {
  tenantSeq += 1;
  return `ledger-t${tenantSeq}`;
}

async function createBudget(tenant: string, body: Record<string, unknown>): Promise<string> {
  const res = await client.post('/budgets', {
    token: platform,
    body: { tenant_id: tenant, warn_ratio: 1, grace_units: 0, ...body },
  });
  expect(res.status, res.text).toBe(201);
  return res.body.id as string;
}

async function usage(id: string): Promise<{ spent_units: number; reserved_units: number; period_start: string }> {
  const res = await client.get(`/budgets/${id}`, { token: platform });
  expect(res.status).toBe(200);
  return res.body;
}

const call = (tenant: string, units: number, extra: Partial<ReserveRequest> = {}): ReserveRequest => ({
  tenantId: tenant,
  agentId: 'agent.one',
  runId: 'run-1',
  units,
  ...extra,
});

function admitted(result: ReserveResult) {
  if (!result.ok) throw new Error(`expected an admission, got ${JSON.stringify(result)}`);
  return result;
}

describe('verdicts', () => {
  it('admits ok, then warn at warn_ratio, grace past the limit, and refuses past limit + grace', async () => {
    const tenant = freshTenant();
    const id = await createBudget(tenant, {
      scope: 'tenant',
      period: 'month',
      limit_units: 10,
      warn_ratio: 0.5,
      grace_units: 2,
    });
    const verdicts: string[] = [];
    for (const units of [4, 1, 5, 1, 1]) verdicts.push(admitted(await ledger.reserve(call(tenant, units))).verdict);
    // Consumption 4 (ok), 5 (= 0.5 × 10: warn), 10 (the limit itself: warn), 11 and 12 (grace).
    expect(verdicts).toEqual(['ok', 'warn', 'warn', 'grace', 'grace']);
    const refused = await ledger.reserve(call(tenant, 0.000001));
    expect(refused).toEqual({
      ok: false,
      code: 'budget_exceeded',
      details: {
        source: 'budget',
        budget_id: id,
        scope: 'tenant',
        period: 'month',
        limit_units: 10,
        grace_units: 2,
        consumed_units: 12,
        requested_units: 0.000001,
        exceeded_budget_ids: [id],
      },
    });
    expect(await usage(id)).toMatchObject({ spent_units: 0, reserved_units: 12 });
  });

  it('carries a warning for each budget past its warn ratio or in its grace', async () => {
    const tenant = freshTenant();
    const monthly = await createBudget(tenant, {
      scope: 'tenant',
      period: 'month',
      limit_units: 100,
      warn_ratio: 0.05,
    });
    const daily = await createBudget(tenant, {
      scope: 'agent',
      agent_id: 'agent.one',
      period: 'day',
      limit_units: 4,
      grace_units: 1,
    });
    const result = admitted(await ledger.reserve(call(tenant, 5)));
    expect(result.verdict).toBe('grace');
    expect(result.warnings).toEqual([
      `budget_warn: budget ${monthly} (tenant/month) at 5 of 100 units, past warn ratio 0.05`,
      `budget_grace: budget ${daily} (agent/day) at 5 of 4 units, within 1 grace units`,
    ]);
  });

  it('is ok with no warnings when no budget applies', async () => {
    const result = admitted(await ledger.reserve(call(freshTenant(), 1_000_000)));
    expect(result).toMatchObject({ verdict: 'ok', warnings: [], reservation: { units: 1_000_000 } });
    expect(result.reservation.id).toMatch(/^bres_/);
  });

  it('charges fractional units exactly', async () => {
    const tenant = freshTenant();
    const id = await createBudget(tenant, { scope: 'tenant', period: 'total', limit_units: 0.3 });
    admitted(await ledger.reserve(call(tenant, 0.1)));
    // 0.1 + 0.2 is exactly the 0.3 limit: admitted (a double would have made it 0.30000000000000004).
    admitted(await ledger.reserve(call(tenant, 0.2)));
    expect((await ledger.reserve(call(tenant, 0.000001))).ok).toBe(false);
    expect(await usage(id)).toMatchObject({ reserved_units: 0.3 });
  });
});

describe('every applicable budget, all or nothing', () => {
  it('checks the tenant, agent and run budgets together and holds nothing when one refuses', async () => {
    const tenant = freshTenant();
    const tenantBudget = await createBudget(tenant, { scope: 'tenant', period: 'day', limit_units: 100 });
    const agentBudget = await createBudget(tenant, {
      scope: 'agent',
      agent_id: 'agent.one',
      period: 'total',
      limit_units: 5,
    });
    const runBudget = await createBudget(tenant, { scope: 'run', run_id: 'run-1', period: 'month', limit_units: 50 });

    const refused = await ledger.reserve(call(tenant, 6));
    expect(refused).toMatchObject({
      ok: false,
      details: { budget_id: agentBudget, exceeded_budget_ids: [agentBudget] },
    });
    for (const id of [tenantBudget, agentBudget, runBudget])
      expect(await usage(id)).toMatchObject({ reserved_units: 0 });

    // Another agent in another run is held only by the tenant budget.
    admitted(await ledger.reserve(call(tenant, 6, { agentId: 'agent.two', runId: 'run-2' })));
    expect(await usage(tenantBudget)).toMatchObject({ reserved_units: 6 });
    expect(await usage(agentBudget)).toMatchObject({ reserved_units: 0 });
    expect(await usage(runBudget)).toMatchObject({ reserved_units: 0 });

    admitted(await ledger.reserve(call(tenant, 5)));
    for (const id of [agentBudget, runBudget]) expect(await usage(id)).toMatchObject({ reserved_units: 5 });
    expect(await usage(tenantBudget)).toMatchObject({ reserved_units: 11 });
  });

  it("never applies another tenant's budgets", async () => {
    const tenant = freshTenant();
    const other = freshTenant();
    await createBudget(other, { scope: 'tenant', period: 'total', limit_units: 1 });
    await createBudget(other, { scope: 'agent', agent_id: 'agent.one', period: 'total', limit_units: 1 });
    await createBudget(other, { scope: 'run', run_id: 'run-1', period: 'total', limit_units: 1 });
    expect(admitted(await ledger.reserve(call(tenant, 50))).verdict).toBe('ok');
  });
});

describe("the request's own budget_units", () => {
  it('can tighten a run below its policy budget', async () => {
    const tenant = freshTenant();
    await createBudget(tenant, { scope: 'run', run_id: 'run-1', period: 'total', limit_units: 10 });
    const refused = await ledger.reserve(call(tenant, 4, { requestLimitUnits: 3 }));
    expect(refused).toMatchObject({
      ok: false,
      details: { source: 'request', budget_id: null, limit_units: 3, exceeded_budget_ids: [] },
    });
    expect(admitted(await ledger.reserve(call(tenant, 3, { requestLimitUnits: 3 }))).verdict).toBe('ok');
  });

  it('can never loosen it', async () => {
    const tenant = freshTenant();
    const policy = await createBudget(tenant, { scope: 'run', run_id: 'run-1', period: 'total', limit_units: 10 });
    const refused = await ledger.reserve(call(tenant, 11, { requestLimitUnits: 1000 }));
    expect(refused).toMatchObject({ ok: false, details: { source: 'budget', budget_id: policy } });
  });

  it('counts what the run spent before, even in requests that gave no budget_units', async () => {
    const tenant = freshTenant();
    const first = admitted(await ledger.reserve(call(tenant, 2)));
    await ledger.settle(first.reservation, 2);
    admitted(await ledger.reserve(call(tenant, 1)));
    // 2 spent + 1 reserved: one more unit reaches a limit of 4, two pass it.
    expect((await ledger.reserve(call(tenant, 2, { requestLimitUnits: 4 }))).ok).toBe(false);
    expect((await ledger.reserve(call(tenant, 1, { requestLimitUnits: 4 }))).ok).toBe(true);
    // Another run of the same agent starts from nothing.
    expect((await ledger.reserve(call(tenant, 4, { runId: 'run-2', requestLimitUnits: 4 }))).ok).toBe(true);
  });
});

describe('settle and release', () => {
  it('settle turns reserved units into the actual cost; the ledger keeps both', async () => {
    const tenant = freshTenant();
    const id = await createBudget(tenant, { scope: 'tenant', period: 'total', limit_units: 10 });
    const { reservation } = admitted(await ledger.reserve(call(tenant, 3)));
    expect(await ledger.settle(reservation, 1.5)).toBe('settled');
    expect(await usage(id)).toMatchObject({ spent_units: 1.5, reserved_units: 0 });
    const row = await testDb.database.control
      .selectFrom('budget_reservations')
      .selectAll()
      .where('id', '=', reservation.id)
      .executeTakeFirstOrThrow();
    expect(row).toMatchObject({ status: 'settled', units: '3.000000', actual_units: '1.500000' });
    // What the actual cost left unused is available again: 10 - 1.5.
    admitted(await ledger.reserve(call(tenant, 8.5)));
    expect((await ledger.reserve(call(tenant, 0.000001))).ok).toBe(false);
  });

  it('settles a cost above the reservation as spent, and later calls feel it', async () => {
    const tenant = freshTenant();
    const id = await createBudget(tenant, { scope: 'tenant', period: 'total', limit_units: 10 });
    const { reservation } = admitted(await ledger.reserve(call(tenant, 1)));
    await ledger.settle(reservation, 9.5);
    expect(await usage(id)).toMatchObject({ spent_units: 9.5, reserved_units: 0 });
    expect((await ledger.reserve(call(tenant, 1))).ok).toBe(false);
  });

  it('release returns the units untouched', async () => {
    const tenant = freshTenant();
    const id = await createBudget(tenant, { scope: 'tenant', period: 'total', limit_units: 5 });
    const { reservation } = admitted(await ledger.reserve(call(tenant, 5)));
    expect((await ledger.reserve(call(tenant, 1))).ok).toBe(false);
    expect(await ledger.release(reservation)).toBe('released');
    expect(await usage(id)).toMatchObject({ spent_units: 0, reserved_units: 0 });
    admitted(await ledger.reserve(call(tenant, 5)));
  });

  it('closes a reservation once: a second settle or release changes nothing', async () => {
    const tenant = freshTenant();
    const id = await createBudget(tenant, { scope: 'tenant', period: 'total', limit_units: 5 });
    const { reservation } = admitted(await ledger.reserve(call(tenant, 2)));
    // All three in one batch: the first wins, the others were too late.
    const outcomes = await Promise.all([
      ledger.settle(reservation, 2),
      ledger.settle(reservation, 3),
      ledger.release(reservation),
    ]);
    expect(outcomes).toEqual(['settled', 'already_closed', 'already_closed']);
    expect(await ledger.settle(reservation, 4)).toBe('already_closed');
    expect(await ledger.release(reservation)).toBe('already_closed');
    expect(await usage(id)).toMatchObject({ reserved_units: 0, spent_units: 2 });
  });

  it('releases reservations abandoned past their TTL, once, each on record', async () => {
    const tenant = freshTenant();
    const runId = `abandoned-${tenant}`;
    const id = await createBudget(tenant, { scope: 'tenant', period: 'total', limit_units: 5 });
    const { reservation } = admitted(await ledger.reserve(call(tenant, 4, { runId })));
    expect(await ledger.releaseExpired()).toBe(0);
    clock.advance(client.app.services.config.budgetReservationTtlSeconds * 1000);
    expect(await ledger.releaseExpired()).toBeGreaterThanOrEqual(1);
    expect(await usage(id)).toMatchObject({ reserved_units: 0, spent_units: 0 });
    expect(await ledger.releaseExpired()).toBe(0);
    const events = await client.get('/audit', { token: platform, query: { tenant_id: tenant, run_id: runId } });
    expect(events.body.items).toEqual([
      expect.objectContaining({
        event_type: 'budget.reservation_expired',
        actor: 'system.expiry',
        tenant_id: tenant,
        agent_id: 'agent.one',
        run_id: runId,
        status: 'expired',
        details: expect.objectContaining({ reservation_id: reservation.id, released_units: 4, released_late_ms: 0 }),
      }),
    ]);
  });

  it('releases many abandoned reservations a chunk per transaction, so the audit chain is never held for all of them', async () => {
    const tenant = freshTenant();
    const id = await createBudget(tenant, { scope: 'tenant', period: 'total', limit_units: 1000 });
    await Promise.all(
      Array.from({ length: 120 }, (_, i) =>
        ledger.reserve(call(tenant, 1, { runId: `abandoned-${i}` })).then(admitted),
      ),
    );
    expect(await usage(id)).toMatchObject({ reserved_units: 120 });
    clock.advance(client.app.services.config.budgetReservationTtlSeconds * 1000);
    expect(await ledger.releaseExpired()).toBeGreaterThanOrEqual(120);
    expect(await usage(id)).toMatchObject({ reserved_units: 0, spent_units: 0 });
    const commits = await sql<{ xid: string; n: number }>`
      select xmin::text as xid, count(*)::int as n from audit_events
      where tenant_id = ${tenant} and event_type = 'budget.reservation_expired' group by 1`.execute(
      testDb.database.control,
    );
    expect(commits.rows.reduce((sum, row) => sum + row.n, 0)).toBe(120);
    expect(commits.rows.length).toBeGreaterThanOrEqual(3);
    expect(Math.max(...commits.rows.map((row) => row.n))).toBeLessThanOrEqual(50);
  });

  it('charges a call that settles after its reservation expired, once', async () => {
    const tenant = freshTenant();
    const id = await createBudget(tenant, { scope: 'tenant', period: 'total', limit_units: 5 });
    const { reservation } = admitted(await ledger.reserve(call(tenant, 4)));
    clock.advance(client.app.services.config.budgetReservationTtlSeconds * 1000);
    await ledger.releaseExpired();
    expect(await usage(id)).toMatchObject({ reserved_units: 0, spent_units: 0 });
    // The units were given back as abandoned, but the call happened: what it cost is charged.
    expect(await ledger.settle(reservation, 3)).toBe('settled_after_expiry');
    expect(await usage(id)).toMatchObject({ reserved_units: 0, spent_units: 3 });
    expect(await ledger.settle(reservation, 3)).toBe('already_closed');
    expect(await ledger.release(reservation)).toBe('already_closed');
    expect(await usage(id)).toMatchObject({ reserved_units: 0, spent_units: 3 });
    const row = await testDb.database.control
      .selectFrom('budget_reservations')
      .selectAll()
      .where('id', '=', reservation.id)
      .executeTakeFirstOrThrow();
    expect(row).toMatchObject({ status: 'settled', units: '4.000000', actual_units: '3.000000' });
  });

  it.skipIf(!hasPostgresServer)(
    'charges a call whose settlement meets the sweep expiring its reservation (needs a PostgreSQL server)',
    async () => {
      const tenant = freshTenant();
      const id = await createBudget(tenant, { scope: 'tenant', period: 'total', limit_units: 5 });
      const { reservation } = admitted(await ledger.reserve(call(tenant, 4)));
      const db = testDb.database.control;
      let settling: Promise<string> | undefined;
      // The sweep has closed the reservation but not committed when the settlement reaches its row.
      await db.transaction().execute(async (trx) => {
        expect(
          (await closeAndUncharge(trx, [{ id: reservation.id, status: 'expired', actualMicros: null }], clock.now()))
            .closed,
        ).toEqual(new Set([reservation.id]));
        settling = ledger.settle(reservation, 3);
        await until('the settlement to wait for the sweep', async () => (await lockWaits(db)) > 0);
        expect(await lockWaits(db)).toBe(1);
      });
      expect(await settling).toBe('settled_after_expiry');
      expect(await usage(id)).toMatchObject({ reserved_units: 0, spent_units: 3 });
    },
  );
});

describe.skipIf(!hasPostgresServer)('a close meeting a hand-off ending (needs a PostgreSQL server)', () => {
  const runTotal = async (tenant: string, runId: string) => {
    const ref = runTotalRef(tenant, runId);
    return (await readCounters(testDb.database.control, [ref])).get(counterId(ref));
  };

  /**
   * A sub-run holding 5 of its parent's units has a call in flight (`units`); the sub-run's
   * hand-off closes (its parent ended it), and `close` reaches the call's reservation while the
   * hand-off, which has just charged it to the parent too, has not committed.
   */
  async function closeDuringHandoffEnd(
    units: number,
    close: (reservation: {
      id: string;
      tenantId: string;
      agentId: string;
      runId: string;
      units: number;
    }) => Promise<string>,
  ) {
    const tenant = freshTenant();
    const db = testDb.database.control;
    await db.transaction().execute(async (trx) => {
      await lockRunAllowance(trx, tenant, 'parent', 10);
      await holdRunUnits(trx, tenant, 'parent', 5, clock.now());
    });
    const { reservation } = admitted(await ledger.reserve(call(tenant, units, { runId: 'sub' })));
    let closing: Promise<string> | undefined;
    await db.transaction().execute(async (trx) => {
      await holdAuditChain(trx);
      await returnSubRunAllowances(
        trx,
        [{ tenantId: tenant, parentRunId: 'parent', subRunId: 'sub', heldUnits: 5 }],
        clock.now(),
      );
      closing = close(reservation);
      await until('the close to wait for the hand-off', async () => (await lockWaits(db)) > 0);
      expect(await lockWaits(db)).toBe(1);
    });
    return { tenant, reservation, outcome: await closing! };
  }

  it('gives back a released call on the sub-run and its parent', async () => {
    const { tenant, reservation, outcome } = await closeDuringHandoffEnd(2, (r) => ledger.release(r));
    // The hand-off changed the reservation (not closed it): the release still happens, now.
    expect(outcome).toBe('released');
    expect(await runTotal(tenant, 'sub')).toEqual({ spentMicros: 0, reservedMicros: 0 });
    expect(await runTotal(tenant, 'parent')).toEqual({ spentMicros: 0, reservedMicros: 0 });
    const row = await testDb.database.control
      .selectFrom('budget_reservations')
      .select('status')
      .where('id', '=', reservation.id)
      .executeTakeFirstOrThrow();
    expect(row.status).toBe('released');
  });

  it('charges a settled call what it cost to the sub-run and its parent', async () => {
    const { tenant, outcome } = await closeDuringHandoffEnd(2, (r) => ledger.settle(r, 7));
    expect(outcome).toBe('settled');
    expect(await runTotal(tenant, 'sub')).toEqual({ spentMicros: 7_000_000, reservedMicros: 0 });
    expect(await runTotal(tenant, 'parent')).toEqual({ spentMicros: 7_000_000, reservedMicros: 0 });
  });
});

describe('periods', () => {
  it('rolls a daily budget over at UTC midnight while the monthly one keeps counting', async () => {
    clock.set('2030-02-10T23:59:59.000Z');
    const tenant = freshTenant();
    const daily = await createBudget(tenant, { scope: 'tenant', period: 'day', limit_units: 5 });
    const monthly = await createBudget(tenant, { scope: 'tenant', period: 'month', limit_units: 100 });
    const yesterday = admitted(await ledger.reserve(call(tenant, 5)));
    expect((await ledger.reserve(call(tenant, 1))).ok).toBe(false);

    clock.set('2030-02-11T00:00:00.000Z');
    admitted(await ledger.reserve(call(tenant, 5)));
    expect((await ledger.reserve(call(tenant, 1))).ok).toBe(false);
    expect(await usage(daily)).toMatchObject({
      period_start: '2030-02-11T00:00:00.000Z',
      reserved_units: 5,
      spent_units: 0,
    });
    expect(await usage(monthly)).toMatchObject({ period_start: '2030-02-01T00:00:00.000Z', reserved_units: 10 });

    // Yesterday's call settles against yesterday's window, not today's.
    await ledger.settle(yesterday.reservation, 5);
    expect(await usage(daily)).toMatchObject({ reserved_units: 5, spent_units: 0 });
    expect(await usage(monthly)).toMatchObject({ reserved_units: 5, spent_units: 5 });

    clock.set('2030-03-01T00:00:00.000Z');
    expect(await usage(monthly)).toMatchObject({
      period_start: '2030-03-01T00:00:00.000Z',
      reserved_units: 0,
      spent_units: 0,
    });
  });

  it('starts a new budget from what its subject already spent in the current period', async () => {
    clock.set('2030-04-20T10:00:00.000Z');
    const tenant = freshTenant();
    const lastMonth = admitted(await ledger.reserve(call(tenant, 50)));
    await ledger.settle(lastMonth.reservation, 50);
    clock.set('2030-05-03T10:00:00.000Z');
    const settled = admitted(await ledger.reserve(call(tenant, 7)));
    await ledger.settle(settled.reservation, 6);
    admitted(await ledger.reserve(call(tenant, 2, { agentId: 'agent.two' })));

    const monthly = await createBudget(tenant, { scope: 'tenant', period: 'month', limit_units: 10 });
    const agent = await createBudget(tenant, {
      scope: 'agent',
      agent_id: 'agent.one',
      period: 'month',
      limit_units: 10,
    });
    // May so far: 6 settled and 2 still open (counted at their reserved amount); April not at all.
    expect(await usage(monthly)).toMatchObject({ spent_units: 8, reserved_units: 0 });
    expect(await usage(agent)).toMatchObject({ spent_units: 6, reserved_units: 0 });
    expect((await ledger.reserve(call(tenant, 3))).ok).toBe(false);
    admitted(await ledger.reserve(call(tenant, 2)));
  });
});

describe('changing and removing budgets', () => {
  it('applies new limits at the next reservation', async () => {
    const tenant = freshTenant();
    const id = await createBudget(tenant, { scope: 'tenant', period: 'total', limit_units: 5 });
    admitted(await ledger.reserve(call(tenant, 5)));
    expect((await ledger.reserve(call(tenant, 1))).ok).toBe(false);
    await client.put(`/budgets/${id}`, { token: platform, body: { grace_units: 1 } });
    expect(admitted(await ledger.reserve(call(tenant, 1))).verdict).toBe('grace');
    await client.put(`/budgets/${id}`, { token: platform, body: { limit_units: 3 } });
    // Already past the new limit + grace: even a free call stops.
    expect((await ledger.reserve(call(tenant, 0))).ok).toBe(false);
  });

  it('stops applying a removed budget at once', async () => {
    const tenant = freshTenant();
    const id = await createBudget(tenant, { scope: 'tenant', period: 'total', limit_units: 1 });
    expect((await ledger.reserve(call(tenant, 2))).ok).toBe(false);
    await client.request('DELETE', `/budgets/${id}`, { token: platform });
    admitted(await ledger.reserve(call(tenant, 2)));
  });
});

describe('dry runs', () => {
  it('check answers what reserve would, holding nothing', async () => {
    const tenant = freshTenant();
    const id = await createBudget(tenant, {
      scope: 'tenant',
      period: 'total',
      limit_units: 10,
      warn_ratio: 0.5,
      grace_units: 1,
    });
    admitted(await ledger.reserve(call(tenant, 4)));
    expect(await ledger.check(call(tenant, 1))).toEqual({
      ok: true,
      verdict: 'warn',
      warnings: [expect.stringContaining(id)],
    });
    expect(await ledger.check(call(tenant, 7))).toMatchObject({ ok: true, verdict: 'grace' });
    expect(await ledger.check(call(tenant, 8))).toMatchObject({
      ok: false,
      code: 'budget_exceeded',
      details: { budget_id: id },
    });
    expect(await ledger.check(call(tenant, 1, { requestLimitUnits: 4 }))).toMatchObject({
      ok: false,
      details: { source: 'request' },
    });
    expect(await usage(id)).toMatchObject({ reserved_units: 4, spent_units: 0 });
  });
});

describe('metrics', () => {
  it('counts reservations by verdict', async () => {
    const metric = () => client.app.services.metrics.registry.getSingleMetric('toolgate_budget_reservations_total');
    const count = async (verdict: string) =>
      (await metric()!.get()).values.find((v) => v.labels.verdict === verdict)?.value ?? 0;
    const before = { grace: await count('grace'), exceeded: await count('exceeded') };
    const tenant = freshTenant();
    await createBudget(tenant, { scope: 'tenant', period: 'total', limit_units: 1, grace_units: 1 });
    await ledger.reserve(call(tenant, 2));
    await ledger.reserve(call(tenant, 1));
    expect(await count('grace')).toBe(before.grace + 1);
    expect(await count('exceeded')).toBe(before.exceeded + 1);
    const text = await client.app.services.metrics.registry.metrics();
    expect(text).toContain('toolgate_budget_reservations_total{verdict="grace"}');
  });
});

describe('input the pipeline must never send', () => {
  it('is a programming error, not a verdict', async () => {
    await expect(ledger.reserve(call(freshTenant(), -1))).rejects.toThrow(RangeError);
    await expect(ledger.reserve(call(freshTenant(), Number.NaN))).rejects.toThrow(RangeError);
    await expect(ledger.reserve(call(freshTenant(), 1, { requestLimitUnits: -1 }))).rejects.toThrow(RangeError);
  });
});

describe.skipIf(!hasPostgresServer)('a database outage (needs a PostgreSQL server)', () => {
  it('fails closed: reserve, check, settle and release throw, nothing is admitted', async () => {
    const unreachable = await openDatabase({
      databaseUrl: 'postgres://postgres@127.0.0.1:1/nowhere',
      dataDir: '',
      poolSize: 1,
      logger: pino({ level: 'silent' }),
    });
    const cut = new BudgetLedger(unreachable, {
      now: clock.now,
      registry: new Registry(),
      reservationTtlMs: 60_000,
      sweepIntervalMs: 0,
    });
    try {
      const fake = { id: 'bres_x', tenantId: 't', agentId: 'a', runId: 'r', units: 1 };
      const attempts = [cut.reserve(call('t', 1)), cut.check(call('t', 1)), cut.settle(fake, 1), cut.release(fake)];
      const errors = await Promise.all(
        attempts.map((attempt) =>
          attempt.then(
            () => 'admitted',
            (e: unknown) => e,
          ),
        ),
      );
      for (const error of errors) expect(isDatabaseUnavailable(error)).toBe(true);
    } finally {
      await cut.close();
      await unreachable.close();
    }
  });
});
