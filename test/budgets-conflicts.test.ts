import pg from 'pg';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BudgetLedger } from '../src/budgets/budget-ledger.js';
import { createBudget, getBudget } from '../src/budgets/budget-service.js';
import type { Database } from '../src/db/database.js';
import { createTestDatabase, hasPostgresServer, openPool, type TestDatabase } from './helpers/database.js';
import { ManualClock } from './helpers/manual-clock.js';
import { lockWaits, until } from './helpers/waits.js';

// A ledger decides a batch against the counters as it read them and writes with a compare and
// set. When another replica moved a counter in between, it must see so, count it
// (toolgate_budget_write_conflicts_total) and decide again from the counter as it stands, exactly.
let testDb: TestDatabase;
const clock = new ManualClock('2030-07-01T08:00:00.000Z');
let seq = 0;

beforeAll(async () => {
  testDb = await createTestDatabase();
});
afterAll(async () => {
  await testDb.drop();
});

function freshTenant(): string {
  seq += 1;
  return `conflicts-t${seq}`;
}

async function totalBudget(tenantId: string, limitUnits: number, graceUnits = 0, warnRatio = 1): Promise<string> {
  const result = await createBudget(
    testDb.database.control,
    {
      tenant_id: tenantId,
      scope: 'tenant',
      agent_id: null,
      run_id: null,
      period: 'total',
      limit_units: limitUnits,
      warn_ratio: warnRatio,
      grace_units: graceUnits,
    },
    { actor: 'operator:test', traceId: null, now: clock.now() },
  );
  if (!result.ok) throw new Error('budget conflict');
  return result.usage.budget.id;
}

const usage = async (id: string) => {
  const u = (await getBudget(testDb.database.control, id, clock.now()))!;
  return { spent: u.spent_units, reserved: u.reserved_units };
};

const newLedger = (database: Database, registry: Registry) =>
  new BudgetLedger(database, { now: clock.now, registry, reservationTtlMs: 900_000, sweepIntervalMs: 0 });

/** Runs `test` with a ledger of its own (and its metrics), closed afterwards. */
async function withLedger(test: (ledger: BudgetLedger, registry: Registry) => Promise<void>): Promise<void> {
  const registry = new Registry();
  const ledger = newLedger(testDb.database, registry);
  try {
    await test(ledger, registry);
  } finally {
    await ledger.close();
  }
}

async function conflicts(registry: Registry): Promise<number> {
  return (await registry.getSingleMetric('toolgate_budget_write_conflicts_total')!.get()).values[0]?.value ?? 0;
}

const reservationsOf = async (tenantId: string) =>
  Number(
    (
      await testDb.database.control
        .selectFrom('budget_reservations')
        .select((eb) => eb.fn.countAll<number>().as('n'))
        .where('tenant_id', '=', tenantId)
        .executeTakeFirstOrThrow()
    ).n,
  );

describe.skipIf(!hasPostgresServer)('a compare-and-set lost to another replica (needs a PostgreSQL server)', () => {
  let other: pg.Client;

  beforeAll(async () => {
    other = new pg.Client({ connectionString: testDb.url });
    await other.connect();
  });
  afterAll(async () => {
    await other.end();
  });

  /**
   * Reserves `units` while another replica holds the budget's counter locked, and lets that
   * replica add `movedUnits` to the counter (and commit) while the ledger's write waits for the
   * lock: the ledger read the counter before the move and writes after it.
   */
  async function reserveAcrossAMove(
    ledger: BudgetLedger,
    tenantId: string,
    budgetId: string,
    units: number,
    movedUnits: number,
  ) {
    await other.query('begin');
    try {
      await other.query('select * from budget_counters where counter_key = $1 for update', [budgetId]);
      const pending = ledger.reserve({ tenantId, agentId: 'agent.one', runId: 'run-moved', units });
      await until('a statement to wait for the row lock', async () => (await lockWaits(testDb.database.control)) > 0, {
        timeoutMs: 15_000,
      });
      await other.query('update budget_counters set reserved_units = reserved_units + $2 where counter_key = $1', [
        budgetId,
        movedUnits,
      ]);
      await other.query('commit');
      return await pending;
    } catch (error) {
      await other.query('rollback');
      throw error;
    }
  }

  it('refuses a call the moved counter no longer has room for, counting the conflict', async () => {
    const tenant = freshTenant();
    const budget = await totalBudget(tenant, 10);
    await withLedger(async (ledger, registry) => {
      // As read, the counter had room for 5 (0 of 10); as it stands when written, only 2.
      const result = await reserveAcrossAMove(ledger, tenant, budget, 5, 8);
      expect(result).toMatchObject({
        ok: false,
        code: 'budget_exceeded',
        details: { budget_id: budget, limit_units: 10, consumed_units: 8, requested_units: 5 },
      });
      expect(await conflicts(registry)).toBe(1);
      expect(await usage(budget)).toEqual({ spent: 0, reserved: 8 });
      expect(await reservationsOf(tenant)).toBe(0);
    });
  });

  it('admits a call that still fits, on top of the move, with the verdict of the true level', async () => {
    const tenant = freshTenant();
    const id = await totalBudget(tenant, 10, 0, 0.75);
    await withLedger(async (ledger, registry) => {
      // As read: 0 + 5 of 10, ok. As it stands: 3 + 5 = 8, past 0.75 × 10: warn.
      const result = await reserveAcrossAMove(ledger, tenant, id, 5, 3);
      expect(result).toMatchObject({ ok: true, verdict: 'warn' });
      expect(await conflicts(registry)).toBe(1);
      // Both the move and the reservation count; neither overwrote the other.
      expect(await usage(id)).toEqual({ spent: 0, reserved: 8 });
      expect(await reservationsOf(tenant)).toBe(1);
      // The rest of the budget, exactly, is still there to take.
      expect((await ledger.reserve({ tenantId: tenant, agentId: 'agent.one', runId: 'run-2', units: 2 })).ok).toBe(
        true,
      );
      expect(
        (await ledger.reserve({ tenantId: tenant, agentId: 'agent.one', runId: 'run-2', units: 0.000001 })).ok,
      ).toBe(false);
      expect(await usage(id)).toEqual({ spent: 0, reserved: 10 });
    });
  });

  it('admits a plain ok call over a move that leaves it ok, without a conflict', async () => {
    const tenant = freshTenant();
    const budget = await totalBudget(tenant, 100);
    await withLedger(async (ledger, registry) => {
      // As read: 0 + 5 of 100. As it stands: 30 + 5, still ok: no need to decide it again.
      const result = await reserveAcrossAMove(ledger, tenant, budget, 5, 30);
      expect(result).toMatchObject({ ok: true, verdict: 'ok', warnings: [] });
      expect(await conflicts(registry)).toBe(0);
      expect(await usage(budget)).toEqual({ spent: 0, reserved: 35 });
      expect(await reservationsOf(tenant)).toBe(1);
    });
  });

  it('decides again a plain ok call that a move brings exactly to the warn ratio', async () => {
    const tenant = freshTenant();
    const id = await totalBudget(tenant, 10, 0, 0.5);
    await withLedger(async (ledger, registry) => {
      // As read: 0 + 4 of 10, ok. As it stands: 1 + 4 = 5, which is 0.5 × 10: warn.
      const result = await reserveAcrossAMove(ledger, tenant, id, 4, 1);
      expect(result).toMatchObject({ ok: true, verdict: 'warn' });
      expect(await conflicts(registry)).toBe(1);
      expect(await usage(id)).toEqual({ spent: 0, reserved: 5 });
    });
  });

  it('counts no conflict when nobody else moved the counter', async () => {
    const tenant = freshTenant();
    const budget = await totalBudget(tenant, 10);
    await withLedger(async (ledger, registry) => {
      for (let i = 0; i < 3; i += 1)
        expect((await ledger.reserve({ tenantId: tenant, agentId: 'agent.one', runId: `run-${i}`, units: 3 })).ok).toBe(
          true,
        );
      expect((await ledger.reserve({ tenantId: tenant, agentId: 'agent.one', runId: 'run-x', units: 2 })).ok).toBe(
        false,
      );
      expect(await conflicts(registry)).toBe(0);
      expect(await usage(budget)).toEqual({ spent: 0, reserved: 9 });
    });
  });
});

describe.skipIf(!hasPostgresServer)('three replicas meeting on one counter (needs a PostgreSQL server)', () => {
  let databases: Database[];

  beforeAll(async () => {
    databases = await Promise.all([0, 1, 2].map(() => openPool(testDb.url, 5)));
    await Promise.all(databases.map((d) => d.ping()));
  });
  afterAll(async () => {
    await Promise.all(databases.map((d) => d.close()));
  });

  it('admit exactly what the budget allows', async () => {
    const tenant = freshTenant();
    const budget = await totalBudget(tenant, 60, 4);
    const registries = databases.map(() => new Registry());
    const ledgers = databases.map((d, i) => newLedger(d, registries[i]!));
    try {
      // Ten callers per replica, each reserving again as soon as it is answered, until 300 calls
      // were made: many small batches from three replicas, interleaving on one counter.
      let next = 0;
      let admitted = 0;
      await Promise.all(
        ledgers.flatMap((ledger) =>
          Array.from({ length: 10 }, async () => {
            while (next < 300) {
              next += 1;
              const result = await ledger.reserve({
                tenantId: tenant,
                agentId: 'agent.one',
                runId: `run-${next}`,
                units: 1,
              });
              if (result.ok) admitted += 1;
            }
          }),
        ),
      );
      expect(admitted).toBe(64);
      expect(await usage(budget)).toEqual({ spent: 0, reserved: 64 });
      expect(await reservationsOf(tenant)).toBe(64);
    } finally {
      await Promise.all(ledgers.map((l) => l.close()));
    }
  });

  it('count the races they lost: each decides from a level it knew, one write wins, the others are decided again', async () => {
    const tenant = freshTenant();
    const budget = await totalBudget(tenant, 60, 4);
    const registries = databases.map(() => new Registry());
    const ledgers = databases.map((d, i) => newLedger(d, registries[i]!));
    const reserve = (ledger: BudgetLedger, units: number) =>
      ledger.reserve({ tenantId: tenant, agentId: 'agent.one', runId: 'run-race', units });
    try {
      // One after the other: each learns the level it left (1, 2, 3), so the first two know stale ones.
      for (const ledger of ledgers) expect((await reserve(ledger, 1)).ok).toBe(true);
      // 40 units fit what each knows, but only one of them fits what is there: whatever the order the
      // writes arrive in, the first lands and the other two find the counter moved past their bound.
      const results = await Promise.all(ledgers.map((ledger) => reserve(ledger, 40)));
      expect(results.filter((r) => r.ok)).toHaveLength(1);
      expect(await usage(budget)).toEqual({ spent: 0, reserved: 43 });
      const lost = await Promise.all(registries.map(conflicts));
      expect(lost.reduce((a, b) => a + b, 0)).toBe(2);
    } finally {
      await Promise.all(ledgers.map((l) => l.close()));
    }
  });
});
