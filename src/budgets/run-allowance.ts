import type { Kysely, Transaction } from 'kysely';
import type { DB } from '../db/schema.js';
import { runCounterKey } from './budget.js';
import {
  counterChanges,
  counterId,
  lockBudgetCounters,
  readCounters,
  type CounterRef,
} from './budget-counter-repository.js';
import { writeLedger } from './budget-ledger-repository.js';
import {
  findOpenReservationsCharging,
  lockOpenReservationsCharging,
  rechargeReservations,
  type OpenReservation,
} from './open-reservation-repository.js';
import { periodStart } from './budget-period.js';
import { fromMicros, toMicros } from './budget-units.js';
import type { CounterLevel } from './budget-verdict.js';

// A run's allowance is its run-total counter: its calls are charged there and a sub-run's budget is held there until
// the sub-run ends (docs/design/budget-ledger.md#a-runs-allowance).

const EPOCH = new Date(0);

/** The counter a run's own total is kept on. */
export function runTotalRef(tenantId: string, runId: string): CounterRef {
  return { key: runCounterKey(tenantId, runId), periodStart: periodStart('total', EPOCH) };
}

/** What a run with a budget has used and has left. */
export interface RunAllowance {
  budget_units: number;
  spent_units: number;
  /** Calls in flight and budgets held for open sub-runs. */
  reserved_units: number;
  remaining_units: number;
}

function allowanceOf(budgetUnits: number, level: CounterLevel | undefined): RunAllowance {
  const spent = level?.spentMicros ?? 0;
  const reserved = level?.reservedMicros ?? 0;
  return {
    budget_units: budgetUnits,
    spent_units: fromMicros(spent),
    reserved_units: fromMicros(reserved),
    remaining_units: fromMicros(Math.max(0, toMicros(budgetUnits) - spent - reserved)),
  };
}

/** A run's allowance as it stands (no lock). */
export async function readRunAllowance(
  db: Kysely<DB>,
  tenantId: string,
  runId: string,
  budgetUnits: number,
): Promise<RunAllowance> {
  const ref = runTotalRef(tenantId, runId);
  const levels = await readCounters(db, [ref]);
  return allowanceOf(budgetUnits, levels.get(counterId(ref)));
}

/** What a run has used so far: spent, plus reserved (in flight or held), counted as used. */
export async function readRunUsage(db: Kysely<DB>, tenantId: string, runId: string): Promise<number> {
  const ref = runTotalRef(tenantId, runId);
  const level = (await readCounters(db, [ref])).get(counterId(ref));
  return fromMicros((level?.spentMicros ?? 0) + (level?.reservedMicros ?? 0));
}

const NO_WINDOWS = { day: EPOCH, month: EPOCH, total: EPOCH };

/** A run's allowance, its counter locked for the rest of the transaction (before holding from it). */
export async function lockRunAllowance(
  trx: Transaction<DB>,
  tenantId: string,
  runId: string,
  budgetUnits: number,
): Promise<RunAllowance> {
  const ref = runTotalRef(tenantId, runId);
  const { levels } = await lockBudgetCounters(trx, [], NO_WINDOWS, [ref]);
  return allowanceOf(budgetUnits, levels.get(counterId(ref)));
}

/** Holds `units` of a run's allowance for a sub-run; check first with `lockRunAllowance`. */
export async function holdRunUnits(
  trx: Transaction<DB>,
  tenantId: string,
  runId: string,
  units: number,
  at: Date,
): Promise<void> {
  await writeLedger(
    trx,
    [{ ...runTotalRef(tenantId, runId), spentMicros: 0, reservedMicros: toMicros(units) }],
    [],
    at,
    at,
  );
}

/** A run to end, with its parent (whose run total its hand-off's close changes). */
export interface RunToEnd {
  tenant_id: string;
  run_id: string;
  parent_run_id: string | null;
}

/**
 * Locks what ending these runs changes in the ledger, in every writer's order: their reservations, then all the
 * counters in one statement. False when a reservation landed between the two: the caller starts over
 * (docs/design/budget-ledger.md#a-runs-allowance).
 */
export async function lockRunTreeLedger(trx: Transaction<DB>, runs: RunToEnd[]): Promise<boolean> {
  if (runs.length === 0) return true;
  const tenants = runs.map((r) => r.tenant_id);
  const totals = runs.map((r) => runTotalRef(r.tenant_id, r.run_id));
  const reservations = await lockOpenReservationsCharging(trx, tenants, totals);
  const parents = runs.flatMap((r) => (r.parent_run_id === null ? [] : [runTotalRef(r.tenant_id, r.parent_run_id)]));
  await lockBudgetCounters(trx, [], NO_WINDOWS, [...totals, ...parents, ...reservations.flatMap((r) => r.charges)]);
  const locked = new Set(reservations.map((r) => r.id));
  return (await findOpenReservationsCharging(trx, tenants, totals)).every((id) => locked.has(id));
}

/** A sub-run that ended, and the budget its parent held for it. */
export interface EndedAllowance {
  tenantId: string;
  parentRunId: string;
  subRunId: string;
  heldUnits: number;
}

/** What became of a held budget: used by the sub-run, returned to the parent, used beyond it. */
export interface AllowanceReturn {
  usedUnits: number;
  returnedUnits: number;
  overshootUnits: number;
}

/**
 * Turns ended sub-runs' holds into what they used, calls in flight counted as used and charged to the parent too when
 * they settle (docs/design/budget-ledger.md#a-runs-allowance). `ended` lists deeper sub-runs before their parents.
 */
export async function returnSubRunAllowances(
  trx: Transaction<DB>,
  ended: EndedAllowance[],
  at: Date,
): Promise<AllowanceReturn[]> {
  if (ended.length === 0) return [];
  const subRefs = ended.map((e) => runTotalRef(e.tenantId, e.subRunId));
  const inFlight = await lockOpenReservationsCharging(
    trx,
    ended.map((e) => e.tenantId),
    subRefs,
  );
  const refs = ended.flatMap((e) => [runTotalRef(e.tenantId, e.subRunId), runTotalRef(e.tenantId, e.parentRunId)]);
  const { levels } = await lockBudgetCounters(trx, [], NO_WINDOWS, refs);
  const { deltas, add } = counterChanges(levels);
  const recharged = new Set<OpenReservation>();
  const results = ended.map((e) => {
    const subId = counterId(runTotalRef(e.tenantId, e.subRunId));
    const parentRef = runTotalRef(e.tenantId, e.parentRunId);
    const sub = levels.get(subId);
    const used = (sub?.spentMicros ?? 0) + (sub?.reservedMicros ?? 0);
    const held = toMicros(e.heldUnits);
    // (A reservation recorded after the lock above is not among them: it is charged as spent.)
    let stillReserved = 0;
    for (const reservation of inFlight) {
      if (!reservation.charges.some((charge) => counterId(charge) === subId)) continue;
      reservation.charges = [...reservation.charges, parentRef];
      recharged.add(reservation);
      // An expired one holds nothing any more; settled late, it charges the parent as the sub-run.
      if (!reservation.expired) stillReserved += reservation.unitsMicros;
    }
    add(parentRef, used - stillReserved, stillReserved - held);
    return {
      usedUnits: fromMicros(used),
      returnedUnits: fromMicros(Math.max(0, held - used)),
      overshootUnits: fromMicros(Math.max(0, used - held)),
    };
  });
  await writeLedger(trx, [...deltas.values()], [], at, at);
  await rechargeReservations(trx, [...recharged]);
  return results;
}
