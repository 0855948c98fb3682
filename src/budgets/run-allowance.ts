import type { Kysely, Transaction } from 'kysely';
import type { DB } from '../db/schema.js';
import { runCounterKey } from './budget.js';
import {
  counterChanges,
  counterId,
  findOpenReservationsCharging,
  lockBudgetCounters,
  lockOpenReservationsCharging,
  readCounters,
  rechargeReservations,
  writeLedger,
  type CounterRef,
  type OpenReservation,
} from './budget-ledger-repository.js';
import { periodStart } from './budget-period.js';
import { fromMicros, toMicros } from './budget-units.js';
import type { CounterLevel } from './budget-verdict.js';

/**
 * A run's allowance (SPEC §6 hand-offs) lives on its run-total counter, the one the request's
 * `budget_units` is checked against: its own calls are spent or reserved there, and a sub-run's
 * budget is *held* there (as reserved units) from the hand-off until the sub-run ends. The
 * ledger's checks then see a parent's room shrink at the hand-off, exactly and under the same
 * row locks, and when the sub-run ends the hold becomes what the sub-run really used.
 */

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
 * Locks, before a transaction ends these runs (closing their hand-offs) and closes their
 * reservations, everything of the ledger it will change, in the order every other writer takes
 * it: the reservations charged to their run totals (open or expired), in id order; then, in one
 * statement and in key order, the counters those reservations are charged to (budgets' and runs')
 * and the run totals of these runs and of their parents. Counters taken in two steps would not be
 * in key order: a sub-run's reservation, which locks its budgets' counters then its run total,
 * would deadlock with it. False when a reservation was recorded between the two steps: it is not
 * locked, and locking it now (after counters) could deadlock with its release; the caller starts
 * over. (Once the run totals are locked, none of these runs can record another.)
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
 * Turns the holds of ended sub-runs into what they used: the parent's counter loses the hold and
 * is charged the sub-run's use (its own calls and its sub-runs'). A call still in flight is
 * counted as used (a parent is never given back units that may yet be spent) and stays reserved
 * on the parent: the parent's counter joins the counters its reservation is charged to, so that
 * its settlement charges the parent what the call really cost, more or less than it reserved. A
 * call whose reservation expired (its units already given back) may still settle late: the
 * parent's counter joins its counters too, with nothing held.
 * `ended` must list deeper sub-runs before their parents, so that a parent's use includes its
 * sub-runs'. The open reservations are locked first, then the counters in the ledger's global
 * order, as a settlement does, so this never deadlocks with the ledger.
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
