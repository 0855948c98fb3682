import type { Kysely, KyselyPlugin } from 'kysely';
import { Registry } from 'prom-client';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { BudgetLedger } from '../src/budgets/budget-ledger.js';
import type { ReserveRequest, ReserveResult } from '../src/budgets/budget-reservation.js';
import {
  changeBudgetLimits,
  createBudget,
  getBudget,
  removeBudget,
  type BudgetDraft,
} from '../src/budgets/budget-service.js';
import { runCounterKey } from '../src/budgets/budget.js';
import { readCounters } from '../src/budgets/budget-counter-repository.js';
import { runTotalCounter } from '../src/budgets/known-ledger.js';
import type { DB } from '../src/db/schema.js';
import { createTestDatabase, type TestDatabase } from './helpers/database.js';
import { ManualClock } from './helpers/manual-clock.js';

// A ledger remembers the budgets and counter levels it last saw and decides a batch from them,
// in one statement that writes only if the database still holds all of it. Whatever another
// replica (or an operator) changed in between must still be honoured, exactly.
let testDb: TestDatabase;
const clock = new ManualClock('2030-09-10T09:00:00.000Z');
let seq = 0;
const ledgers: BudgetLedger[] = [];

beforeAll(async () => {
  testDb = await createTestDatabase();
});
afterEach(async () => {
  await Promise.all(ledgers.splice(0).map((ledger) => ledger.close()));
});
afterAll(async () => {
  await testDb.drop();
});

const fresh = (prefix: string) => `${prefix}-${(seq += 1)}`;
const context = () => ({ actor: 'operator:test', traceId: null, now: clock.now() });

/** A ledger of its own (a replica), and how many statements it has sent. */
function replica(): { ledger: BudgetLedger; statements: () => number } {
  let statements = 0;
  const counting: KyselyPlugin = {
    transformQuery: (args) => {
      statements += 1;
      return args.node;
    },
    transformResult: async (args) => args.result,
  };
  const db: Kysely<DB> = testDb.database.control.withPlugin(counting);
  const ledger = new BudgetLedger(
    { ...testDb.database, hot: db, hotDeferred: db },
    {
      now: clock.now,
      registry: new Registry(),
      reservationTtlMs: 900_000,
      sweepIntervalMs: 0,
    },
  );
  ledgers.push(ledger);
  return { ledger, statements: () => statements };
}

async function budget(draft: Partial<BudgetDraft> & Pick<BudgetDraft, 'tenant_id'>): Promise<string> {
  const result = await createBudget(
    testDb.database.control,
    {
      scope: 'tenant',
      agent_id: null,
      run_id: null,
      period: 'total',
      limit_units: 10,
      warn_ratio: 1,
      grace_units: 0,
      ...draft,
    },
    context(),
  );
  if (!result.ok) throw new Error('budget conflict');
  return result.usage.budget.id;
}

const usage = async (id: string) => {
  const u = (await getBudget(testDb.database.control, id, clock.now()))!;
  return { spent: u.spent_units, reserved: u.reserved_units };
};

const call = (tenantId: string, units: number, extra: Partial<ReserveRequest> = {}): ReserveRequest => ({
  tenantId,
  agentId: 'agent.known',
  runId: fresh('run'),
  units,
  ...extra,
});

function admitted(result: ReserveResult) {
  if (!result.ok) throw new Error(`expected an admission, got ${JSON.stringify(result)}`);
  return result.reservation;
}

describe('a ledger that knows its budgets and counters', () => {
  it('reserves in one statement once it has read them, settles in one, and reserves in one after that', async () => {
    const tenant = fresh('known-t');
    const id = await budget({ tenant_id: tenant, limit_units: 100 });
    const { ledger, statements } = replica();

    admitted(await ledger.reserve(call(tenant, 1)));
    const afterRead = statements();
    expect(afterRead).toBe(2); // read, then compare and set

    const second = admitted(await ledger.reserve(call(tenant, 2)));
    expect(statements() - afterRead).toBe(1);

    expect(await ledger.settle(second, 1.5)).toBe('settled');
    expect(statements() - afterRead).toBe(2);

    // The settlement's answer carried the levels it left: the next guess is right.
    admitted(await ledger.reserve(call(tenant, 3)));
    expect(statements() - afterRead).toBe(3);
    expect(await usage(id)).toEqual({ spent: 1.5, reserved: 4 });
  });

  it('refuses past a counter another replica moved since (no over-admission from a stale level)', async () => {
    const tenant = fresh('known-t');
    const id = await budget({ tenant_id: tenant, limit_units: 10 });
    const a = replica();
    const b = replica();
    admitted(await a.ledger.reserve(call(tenant, 6))); // a knows 6 of 10
    admitted(await b.ledger.reserve(call(tenant, 3))); // now 9 of 10
    const result = await a.ledger.reserve(call(tenant, 2));
    expect(result).toMatchObject({
      ok: false,
      code: 'budget_exceeded',
      details: { budget_id: id, consumed_units: 9, requested_units: 2 },
    });
    expect(await usage(id)).toEqual({ spent: 0, reserved: 9 });
  });

  it('admits what a stale level would refuse, once the room is really there', async () => {
    const tenant = fresh('known-t');
    const id = await budget({ tenant_id: tenant, limit_units: 10 });
    const a = replica();
    const b = replica();
    const held = admitted(await a.ledger.reserve(call(tenant, 9))); // a knows 9 of 10
    expect(await b.ledger.release(held)).toBe('released'); // another replica gives it back
    admitted(await a.ledger.reserve(call(tenant, 5)));
    expect(await usage(id)).toEqual({ spent: 0, reserved: 5 });
  });

  it('applies a budget another replica created since, on the very next call', async () => {
    const tenant = fresh('known-t');
    await budget({ tenant_id: tenant, limit_units: 100 });
    const { ledger } = replica();
    admitted(await ledger.reserve(call(tenant, 1)));
    // Created mid-day, the agent's budget starts from what the agent holds today: 1 of 2.
    const agentBudget = await budget({
      tenant_id: tenant,
      scope: 'agent',
      agent_id: 'agent.known',
      period: 'day',
      limit_units: 2,
    });
    expect(await ledger.reserve(call(tenant, 2))).toMatchObject({
      ok: false,
      code: 'budget_exceeded',
      details: { budget_id: agentBudget, consumed_units: 1 },
    });
    admitted(await ledger.reserve(call(tenant, 1)));
    expect(await usage(agentBudget)).toEqual({ spent: 1, reserved: 1 }); // the seed counts as spent
  });

  it('applies a lowered limit, and a raised one, on the very next call', async () => {
    const tenant = fresh('known-t');
    const id = await budget({ tenant_id: tenant, limit_units: 100 });
    const { ledger } = replica();
    admitted(await ledger.reserve(call(tenant, 1)));
    await changeBudgetLimits(testDb.database.control, id, { limit_units: 3 }, context());
    expect(await ledger.reserve(call(tenant, 3))).toMatchObject({
      ok: false,
      code: 'budget_exceeded',
      details: { budget_id: id, limit_units: 3 },
    });
    await changeBudgetLimits(testDb.database.control, id, { limit_units: 4, grace_units: 1 }, context());
    expect(await ledger.reserve(call(tenant, 4))).toMatchObject({ ok: true, verdict: 'grace' });
    expect(await usage(id)).toEqual({ spent: 0, reserved: 5 });
  });

  it('stops charging a budget removed since', async () => {
    const tenant = fresh('known-t');
    const id = await budget({ tenant_id: tenant, limit_units: 10 });
    const { ledger } = replica();
    admitted(await ledger.reserve(call(tenant, 4)));
    await removeBudget(testDb.database.control, id, context());
    admitted(await ledger.reserve(call(tenant, 4)));
    admitted(await ledger.reserve(call(tenant, 4)));
    const [counter] = await testDb.database.control
      .selectFrom('budget_counters')
      .select('reserved_units')
      .where('counter_key', '=', id)
      .execute();
    expect(counter).toEqual({ reserved_units: '4.000000' });
  });

  it("applies a run's own budget on the run's first call, though new runs are guessed to have none", async () => {
    const tenant = fresh('known-t');
    await budget({ tenant_id: tenant, limit_units: 100 });
    const { ledger } = replica();
    admitted(await ledger.reserve(call(tenant, 1)));
    const runId = fresh('run');
    const runBudget = await budget({ tenant_id: tenant, scope: 'run', run_id: runId, limit_units: 2 });
    expect(await ledger.reserve(call(tenant, 3, { runId }))).toMatchObject({
      ok: false,
      code: 'budget_exceeded',
      details: { budget_id: runBudget },
    });
    admitted(await ledger.reserve(call(tenant, 2, { runId })));
    expect(await usage(runBudget)).toEqual({ spent: 0, reserved: 2 });
  });

  it("counts what a run spent on another replica, though it guessed the run's total did not exist", async () => {
    const tenant = fresh('known-t');
    await budget({ tenant_id: tenant, limit_units: 100 });
    const a = replica();
    const b = replica();
    admitted(await a.ledger.reserve(call(tenant, 1)));
    const runId = fresh('run');
    admitted(await b.ledger.reserve(call(tenant, 3, { runId, requestLimitUnits: 5 })));
    // The run goes on on replica a: its request allows 5 in all, 3 are already reserved.
    expect(await a.ledger.reserve(call(tenant, 3, { runId, requestLimitUnits: 5 }))).toMatchObject({
      ok: false,
      code: 'budget_exceeded',
      details: { source: 'request' },
    });
    admitted(await a.ledger.reserve(call(tenant, 2, { runId, requestLimitUnits: 5 })));
    const total = runTotalCounter({ tenantId: tenant, agentId: 'agent.known', runId });
    expect(total.key).toBe(runCounterKey(tenant, runId));
    expect([...(await readCounters(testDb.database.control, [total])).values()]).toEqual([
      { spentMicros: 0, reservedMicros: 5_000_000 },
    ]);
  });
});
