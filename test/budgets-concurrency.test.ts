import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BudgetLedger } from '../src/budgets/budget-ledger.js';
import type { ReserveResult } from '../src/budgets/budget-reservation.js';
import { createBudget, getBudget } from '../src/budgets/budget-service.js';
import type { Database } from '../src/db/database.js';
import { createTestDatabase, hasPostgresServer, openPool, type TestDatabase } from './helpers/database.js';
import { ManualClock } from './helpers/manual-clock.js';

// Three gateway instances, each with its own connection pool, sharing one PostgreSQL.
let testDb: TestDatabase;
let databases: Database[];
let ledgers: BudgetLedger[];
const clock = new ManualClock('2030-06-10T09:00:00.000Z');

beforeAll(async () => {
  testDb = await createTestDatabase();
  if (!hasPostgresServer) return;
  databases = await Promise.all([0, 1, 2].map(() => openPool(testDb.url, 5)));
  ledgers = databases.map(
    (d) =>
      new BudgetLedger(d, {
        now: clock.now,
        registry: new Registry(),
        reservationTtlMs: 900_000,
        sweepIntervalMs: 0,
      }),
  );
});
afterAll(async () => {
  if (hasPostgresServer) {
    await Promise.all(ledgers.map((l) => l.close()));
    await Promise.all(databases.map((d) => d.close()));
  }
  await testDb.drop();
});

interface BudgetFields {
  scope: 'tenant' | 'agent';
  agentId?: string;
  limitUnits: number;
  warnRatio: number;
  graceUnits: number;
}

async function budget(tenantId: string, { scope, agentId, limitUnits, warnRatio, graceUnits }: BudgetFields) {
  const result = await createBudget(
    testDb.database.control,
    {
      tenant_id: tenantId,
      scope,
      agent_id: agentId ?? null,
      run_id: null,
      period: 'month',
      limit_units: limitUnits,
      warn_ratio: warnRatio,
      grace_units: graceUnits,
    },
    { actor: 'operator:test', traceId: null, now: clock.now() },
  );
  if (!result.ok) throw new Error('budget conflict');
  return result.usage.budget.id;
}

const usage = async (id: string) => (await getBudget(testDb.database.control, id, clock.now()))!;

function tally(results: ReserveResult[]) {
  const counts: Record<string, number> = { ok: 0, warn: 0, grace: 0, exceeded: 0 };
  for (const r of results) counts[r.ok ? r.verdict : 'exceeded']! += 1;
  return counts;
}

describe.skipIf(!hasPostgresServer)('three instances hammering one budget (needs a PostgreSQL server)', () => {
  it('admit exactly as many calls as limit + grace allows, each with the verdict of its place in line', async () => {
    const id = await budget('conc-1', { scope: 'tenant', limitUnits: 50, warnRatio: 0.8, graceUnits: 7 });
    const results = await Promise.all(
      Array.from({ length: 200 }, (_, i) =>
        ledgers[i % 3]!.reserve({ tenantId: 'conc-1', agentId: `agent.${i % 5}`, runId: `run-${i}`, units: 1 }),
      ),
    );
    // Consumption 1..39 ok, 40..50 warn (0.8 × 50 up to the limit), 51..57 grace, then refused.
    expect(tally(results)).toEqual({ ok: 39, warn: 11, grace: 7, exceeded: 143 });
    expect(await usage(id)).toMatchObject({ reserved_units: 57, spent_units: 0 });

    // Settle half of the admitted calls at half their cost and release the rest, from every instance.
    const admitted = results.flatMap((r) => (r.ok ? [r.reservation] : []));
    const outcomes = await Promise.all(
      admitted.map((reservation, i) =>
        i % 2 === 0 ? ledgers[(i + 1) % 3]!.settle(reservation, 0.5) : ledgers[(i + 2) % 3]!.release(reservation),
      ),
    );
    expect(outcomes.filter((o) => o === 'settled')).toHaveLength(29);
    expect(outcomes.filter((o) => o === 'released')).toHaveLength(28);
    expect(await usage(id)).toMatchObject({ reserved_units: 0, spent_units: 14.5 });

    // 57 - 14.5 = 42.5 units of room: exactly 42 more one-unit calls.
    const again = await Promise.all(
      Array.from({ length: 200 }, (_, i) =>
        ledgers[i % 3]!.reserve({ tenantId: 'conc-1', agentId: 'agent.x', runId: `again-${i}`, units: 1 }),
      ),
    );
    expect(again.filter((r) => r.ok)).toHaveLength(42);
    expect(await usage(id)).toMatchObject({ reserved_units: 42, spent_units: 14.5 });
  });

  it('hold every budget of a call together: agents within theirs, the tenant within its own', async () => {
    const tenantBudget = await budget('conc-2', { scope: 'tenant', limitUnits: 100, warnRatio: 1, graceUnits: 0 });
    const agentBudgets = await Promise.all(
      [0, 1, 2, 3].map((n) =>
        budget('conc-2', { scope: 'agent', agentId: `agent.${n}`, limitUnits: 30, warnRatio: 1, graceUnits: 0 }),
      ),
    );
    const results = await Promise.all(
      Array.from({ length: 200 }, (_, i) =>
        ledgers[i % 3]!.reserve({ tenantId: 'conc-2', agentId: `agent.${i % 4}`, runId: `run-${i}`, units: 1 }),
      ),
    );
    // 4 × 30 would be 120: the tenant's 100 binds first, exactly.
    expect(results.filter((r) => r.ok)).toHaveLength(100);
    expect(await usage(tenantBudget)).toMatchObject({ reserved_units: 100 });
    const perAgent = await Promise.all(agentBudgets.map(async (id) => (await usage(id)).reserved_units));
    expect(perAgent.reduce((a, b) => a + b, 0)).toBe(100);
    for (const reserved of perAgent) expect(reserved).toBeLessThanOrEqual(30);
  });

  it('never spend past the hard limit with calls of mixed cost', async () => {
    const id = await budget('conc-3', { scope: 'tenant', limitUnits: 97.5, warnRatio: 0.9, graceUnits: 2.5 });
    const costs = Array.from({ length: 200 }, (_, i) => [0.5, 1, 2.25, 3][i % 4]!);
    const results = await Promise.all(
      costs.map((units, i) =>
        ledgers[i % 3]!.reserve({ tenantId: 'conc-3', agentId: 'agent.m', runId: `run-${i}`, units }),
      ),
    );
    const admittedUnits = results.reduce((sum, r, i) => sum + (r.ok ? costs[i]! : 0), 0);
    expect(admittedUnits).toBeLessThanOrEqual(100);
    // Refusals came only when the call did not fit: everything refused was bigger than what was left.
    const left = 100 - admittedUnits;
    for (const [i, r] of results.entries()) if (!r.ok) expect(costs[i]!).toBeGreaterThan(left);
    expect((await usage(id)).reserved_units).toBeCloseTo(admittedUnits, 6);
  });
});
