import type { BudgetPeriod } from './budget-period.js';
import type { BudgetScope } from './budget.js';
import { fromMicros, type Micros } from './budget-units.js';

/** Budget verdicts, from least to most severe (docs/api.md#budgets-and-rate-limits). */
export const BUDGET_VERDICTS = ['ok', 'warn', 'grace', 'exceeded'] as const;
export type BudgetVerdict = (typeof BUDGET_VERDICTS)[number];

/** What a limit is: a budget an operator set, or the request's own `budget_units` for its run. */
export type LimitSource =
  { source: 'budget'; budgetId: string; scope: BudgetScope; period: BudgetPeriod } | { source: 'request' };

/** One limit a reservation is checked against, and the counter it is counted on. */
export interface Limit {
  /** The counter (`counter_key` and period window) this limit counts on. */
  counter: string;
  limitMicros: Micros;
  graceMicros: Micros;
  /** null: this limit never warns (the request's own limit). */
  warnRatio: number | null;
  label: LimitSource;
}

/** What a counter holds. */
export interface CounterLevel {
  spentMicros: Micros;
  reservedMicros: Micros;
}

/** One limit's verdict for a reservation, with the figures it was decided on. */
export interface LimitCheck {
  limit: Limit;
  verdict: BudgetVerdict;
  /** Spent plus reserved before this reservation. */
  consumedMicros: Micros;
  /** Spent plus reserved if this reservation is admitted. */
  afterMicros: Micros;
}

/** The worst verdict of every limit, and each limit's own: refused if any is `exceeded`. */
export type ReservationDecision =
  | { ok: true; verdict: Exclude<BudgetVerdict, 'exceeded'>; checks: LimitCheck[] }
  | { ok: false; verdict: 'exceeded'; checks: LimitCheck[] };

/**
 * The verdict of one limit when consumption would reach `afterMicros`:
 * `exceeded` past limit + grace (a hard stop), `grace` past the limit, `warn` at or past
 * `warnRatio × limit`, else `ok`.
 */
export function verdictFor(
  limit: Pick<Limit, 'limitMicros' | 'graceMicros' | 'warnRatio'>,
  afterMicros: Micros,
): BudgetVerdict {
  if (afterMicros > limit.limitMicros + limit.graceMicros) return 'exceeded';
  if (afterMicros > limit.limitMicros) return 'grace';
  if (limit.warnRatio !== null && afterMicros >= Math.round(limit.warnRatio * limit.limitMicros)) return 'warn';
  return 'ok';
}

/** The most severe of some verdicts (`ok` when there are none). */
export function worstVerdict(verdicts: Iterable<BudgetVerdict>): BudgetVerdict {
  let worst = 0;
  for (const verdict of verdicts) worst = Math.max(worst, BUDGET_VERDICTS.indexOf(verdict));
  return BUDGET_VERDICTS[worst]!;
}

/**
 * Checks a reservation of `unitsMicros` against every limit that applies, all or nothing: one
 * exceeded limit refuses the whole reservation. Counters missing from `levels` are empty.
 */
export function decideReservation(
  unitsMicros: Micros,
  limits: readonly Limit[],
  levels: ReadonlyMap<string, CounterLevel>,
): ReservationDecision {
  const checks = limits.map((limit): LimitCheck => {
    const level = levels.get(limit.counter);
    const consumedMicros = (level?.spentMicros ?? 0) + (level?.reservedMicros ?? 0);
    const afterMicros = consumedMicros + unitsMicros;
    return { limit, verdict: verdictFor(limit, afterMicros), consumedMicros, afterMicros };
  });
  const verdict = worstVerdict(checks.map((check) => check.verdict));
  return verdict === 'exceeded' ? { ok: false, verdict, checks } : { ok: true, verdict, checks };
}

function describe(label: LimitSource): string {
  return label.source === 'budget'
    ? `budget ${label.budgetId} (${label.scope}/${label.period})`
    : "the request's budget_units";
}

/** One line per limit past its warn ratio or in its grace, for the run envelope's `warnings`. */
export function warningsOf(checks: readonly LimitCheck[]): string[] {
  return checks.flatMap((check) => {
    const used = `${fromMicros(check.afterMicros)} of ${fromMicros(check.limit.limitMicros)} units`;
    if (check.verdict === 'warn')
      return [`budget_warn: ${describe(check.limit.label)} at ${used}, past warn ratio ${check.limit.warnRatio}`];
    if (check.verdict === 'grace') {
      return [
        `budget_grace: ${describe(check.limit.label)} at ${used}, within ${fromMicros(check.limit.graceMicros)} grace units`,
      ];
    }
    return [];
  });
}

/** The `details` of a `budget_exceeded` denial: the first limit that refused, and all that did. A
 * type alias, not an interface, so it is a `Record<string, unknown>` for the run envelope. */
export type BudgetExceededDetails = {
  source: 'budget' | 'request';
  budget_id: string | null;
  scope: BudgetScope | null;
  period: BudgetPeriod | null;
  limit_units: number;
  grace_units: number;
  consumed_units: number;
  requested_units: number;
  exceeded_budget_ids: string[];
};

/** Builds the `details` of a refusal from a decision's checks. */
export function exceededDetails(unitsMicros: Micros, checks: readonly LimitCheck[]): BudgetExceededDetails {
  const exceeded = checks.filter((check) => check.verdict === 'exceeded');
  const first = exceeded[0];
  if (!first) throw new Error('exceededDetails called without an exceeded limit');
  const label = first.limit.label;
  return {
    source: label.source,
    budget_id: label.source === 'budget' ? label.budgetId : null,
    scope: label.source === 'budget' ? label.scope : null,
    period: label.source === 'budget' ? label.period : null,
    limit_units: fromMicros(first.limit.limitMicros),
    grace_units: fromMicros(first.limit.graceMicros),
    consumed_units: fromMicros(first.consumedMicros),
    requested_units: fromMicros(unitsMicros),
    exceeded_budget_ids: exceeded.flatMap((check) =>
      check.limit.label.source === 'budget' ? [check.limit.label.budgetId] : [],
    ),
  };
}
