import { budgetApplies, type Budget, type ChargeSubject } from './budget.js';
import {
  counterChanges,
  counterId,
  type CounterDelta,
  type CounterRef,
  type Windows,
} from './budget-counter-repository.js';
import type { NewReservation } from './budget-ledger-repository.js';
import { periodStart } from './budget-period.js';
import {
  newReservationId,
  type BudgetReservation,
  type ReserveRequest,
  type ReserveResult,
} from './budget-reservation.js';
import { runTotalCounter } from './known-ledger.js';
import { fromMicros, toMicros, type Micros } from './budget-units.js';
import { decideReservation, exceededDetails, warningsOf, type CounterLevel, type Limit } from './budget-verdict.js';

/** A reservation asked of a batch, its units checked. */
export type ReserveOp = {
  kind: 'reserve';
  request: ReserveRequest;
  unitsMicros: Micros;
  requestLimitMicros: Micros | undefined;
};

/**
 * Reservations decided in arrival order against `levels` (which it updates as it goes): each
 * one's answer, the counter changes, and the reservations to record.
 */
export function decideBatch(
  reserves: ReserveOp[],
  budgets: Budget[],
  levels: Map<string, CounterLevel>,
  now: Date,
): {
  results: ReserveResult[];
  deltas: CounterDelta[];
  created: NewReservation[];
  bounds: Map<string, Micros | null> | undefined;
} {
  const { deltas, add } = counterChanges(levels);
  const created: NewReservation[] = [];
  // The most each counter may hold after the batch with every limit on it still `ok`.
  const okCeilings = new Map<string, Micros>();
  const results = reserves.map((op): ReserveResult => {
    const { request, unitsMicros } = op;
    const { limits, charges } = limitsFor(request, op.requestLimitMicros, budgets, now);
    for (const limit of limits)
      okCeilings.set(limit.counter, Math.min(okCeilings.get(limit.counter) ?? Infinity, okCeiling(limit)));
    const decision = decideReservation(unitsMicros, limits, levels);
    if (!decision.ok)
      return { ok: false, code: 'budget_exceeded', details: exceededDetails(unitsMicros, decision.checks) };
    for (const charge of charges) add(charge, 0, unitsMicros);
    const reservation: BudgetReservation = {
      id: request.reservationId ?? newReservationId(),
      tenantId: request.tenantId,
      agentId: request.agentId,
      runId: request.runId,
      units: fromMicros(unitsMicros),
    };
    created.push({ ...reservation, unitsMicros, charges });
    return { ok: true, reservation, verdict: decision.verdict, warnings: warningsOf(decision.checks) };
  });
  const plain = results.every((result) => result.ok && result.verdict === 'ok');
  return {
    results,
    deltas: [...deltas.values()],
    created,
    bounds: plain ? boundsOf(levels, deltas, okCeilings) : undefined,
  };
}

/**
 * For an all-`ok` batch: the most each counter may hold before the batch for its answers to stand (`null`: any level).
 * Consumption only grows through the batch, so a call's level is at most the level before it plus the batch's adds.
 */
function boundsOf(
  levels: ReadonlyMap<string, CounterLevel>,
  deltas: ReadonlyMap<string, CounterDelta>,
  okCeilings: ReadonlyMap<string, Micros>,
): Map<string, Micros | null> {
  const bounds = new Map<string, Micros | null>();
  for (const id of levels.keys()) {
    const ceiling = okCeilings.get(id);
    bounds.set(
      id,
      ceiling === undefined
        ? null
        : ceiling - (deltas.get(id)?.reservedMicros ?? 0) - (deltas.get(id)?.spentMicros ?? 0),
    );
  }
  return bounds;
}

/** The most a counter may hold, this call included, for `limit`'s verdict to be `ok` (see `verdictFor`). */
function okCeiling(limit: Limit): Micros {
  return limit.warnRatio === null
    ? limit.limitMicros
    : Math.min(limit.limitMicros, Math.round(limit.warnRatio * limit.limitMicros) - 1);
}

/**
 * The limits a call is checked against and the counters it is charged to: each applicable
 * budget's current window, and the run's own running total where it is kept (so a later
 * request's `budget_units` counts what the run spent before it).
 */
export function limitsFor(
  subject: ChargeSubject,
  requestLimitMicros: Micros | undefined,
  budgets: Budget[],
  now: Date,
): { limits: Limit[]; charges: CounterRef[] } {
  const limits: Limit[] = [];
  const charges: CounterRef[] = [];
  // Broadest first, so a denial names the same budget whichever replica decided it.
  const applicable = budgets.filter((budget) => budgetApplies(budget, subject)).sort(broadestFirst);
  for (const budget of applicable) {
    const ref = { key: budget.id, periodStart: periodStart(budget.period, now) };
    charges.push(ref);
    limits.push({
      counter: counterId(ref),
      limitMicros: toMicros(budget.limit_units),
      graceMicros: toMicros(budget.grace_units),
      warnRatio: budget.warn_ratio,
      label: { source: 'budget', budgetId: budget.id, scope: budget.scope, period: budget.period },
    });
  }
  if (subject.keepsRunTotal === false && requestLimitMicros === undefined) return { limits, charges };
  const runTotal = runTotalCounter(subject);
  charges.push(runTotal);
  if (requestLimitMicros !== undefined) {
    limits.push({
      counter: counterId(runTotal),
      limitMicros: requestLimitMicros,
      graceMicros: 0,
      warnRatio: null,
      label: { source: 'request' },
    });
  }
  return { limits, charges };
}

export function windowsAt(now: Date): Windows {
  return { day: periodStart('day', now), month: periodStart('month', now), total: periodStart('total', now) };
}

const SCOPE_ORDER = ['tenant', 'agent', 'run'];
const PERIOD_ORDER = ['total', 'month', 'day'];

function broadestFirst(a: Budget, b: Budget): number {
  return (
    SCOPE_ORDER.indexOf(a.scope) - SCOPE_ORDER.indexOf(b.scope) ||
    PERIOD_ORDER.indexOf(a.period) - PERIOD_ORDER.indexOf(b.period) ||
    (a.id < b.id ? -1 : a.id > b.id ? 1 : 0)
  );
}
