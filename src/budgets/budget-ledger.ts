import { randomBytes } from 'node:crypto';
import type { Kysely } from 'kysely';
import { Counter, type Registry } from 'prom-client';
import { GroupCommit, retryOnConflict } from '../db/group-commit.js';
import type { DB } from '../db/schema.js';
import { budgetApplies, runCounterKey, type Budget, type ChargeSubject } from './budget.js';
import {
  closeReservations,
  counterChanges,
  counterId,
  findBudgetsFor,
  findExpiredReservations,
  lockBudgetCounters,
  readCounters,
  writeLedger,
  type ClosedStatus,
  type CounterRef,
  type NewReservation,
  type ReservationClose,
  type Windows,
} from './budget-ledger-repository.js';
import { periodStart } from './budget-period.js';
import { fromMicros, toMicros, type Micros } from './budget-units.js';
import {
  decideReservation,
  exceededDetails,
  warningsOf,
  type BudgetExceededDetails,
  type BudgetVerdict,
  type CounterLevel,
  type Limit,
} from './budget-verdict.js';

/** A reservation the pipeline asks for before dispatching a call. */
export interface ReserveRequest {
  tenantId: string;
  agentId: string;
  runId: string;
  /** The call's cost units (the tool's `cost_units`). */
  units: number;
  /** The request's own `budget_units` for this run: an extra limit on the run's total, never a loosening. */
  requestLimitUnits?: number | undefined;
}

/** Units held against every budget that applies to a call, until it is settled or released. */
export interface BudgetReservation {
  readonly id: string;
  readonly tenantId: string;
  readonly agentId: string;
  readonly runId: string;
  readonly units: number;
}

/** `reserve`'s answer: admitted with a verdict and warnings, or refused (SPEC §5). */
export type ReserveResult =
  | { ok: true; reservation: BudgetReservation; verdict: Exclude<BudgetVerdict, 'exceeded'>; warnings: string[] }
  | { ok: false; code: 'budget_exceeded'; details: BudgetExceededDetails };

/** A dry run's answer: what `reserve` would decide now, with nothing held. */
export type BudgetCheckResult =
  | { ok: true; verdict: Exclude<BudgetVerdict, 'exceeded'>; warnings: string[] }
  | { ok: false; code: 'budget_exceeded'; details: BudgetExceededDetails };

/** `already_closed`: the reservation was settled, released or expired before; nothing changed. */
export type CloseOutcome = ClosedStatus | 'already_closed';

/** What the composition root gives the ledger. */
export interface BudgetLedgerOptions {
  now: () => Date;
  registry: Registry;
  /** An open reservation older than this is presumed abandoned (its process died) and released. */
  reservationTtlMs: number;
  /** How often this instance looks for abandoned reservations; 0 never (tests call `releaseExpired`). */
  sweepIntervalMs: number;
  /** Told when a background sweep fails (the next one tries again). */
  onSweepError?: (error: unknown) => void;
}

type LedgerOp =
  | { kind: 'reserve'; request: ReserveRequest; unitsMicros: Micros; requestLimitMicros: Micros | undefined }
  | { kind: 'close'; close: ReservationClose };

type LedgerOpResult = ReserveResult | CloseOutcome;

/**
 * Budget admission, shared by every replica and exact under concurrency. Each decision is made
 * against the counters as they stand under a row lock, so N replicas together never admit past
 * a budget's limit + grace, and never refuse while room remains. Reservations and settlements
 * arriving together are committed together (group commit): one transaction per batch, not per
 * call. Chunks of budget are deliberately not leased to replicas: units parked in one replica's
 * lease would make another refuse calls the budget still allows and skew warn/grace verdicts.
 * A database fault throws (the pipeline answers 503 and admits nothing).
 */
export class BudgetLedger {
  private readonly batches: GroupCommit<LedgerOp, LedgerOpResult>;
  private readonly reservations: Counter<'verdict'>;
  private readonly sweeper: NodeJS.Timeout | undefined;

  constructor(
    private readonly db: Kysely<DB>,
    private readonly options: BudgetLedgerOptions,
  ) {
    this.batches = new GroupCommit((ops) => retryOnConflict(() => this.commit(ops)));
    this.reservations = new Counter({
      name: 'toolgate_budget_reservations_total',
      help: 'Budget reservations by verdict (exceeded: refused)',
      labelNames: ['verdict'],
      registers: [options.registry],
    });
    if (options.sweepIntervalMs > 0) {
      this.sweeper = setInterval(() => {
        this.releaseExpired().catch((error: unknown) => options.onSweepError?.(error));
      }, options.sweepIntervalMs);
      this.sweeper.unref();
    }
  }

  /**
   * Reserves `units` against every budget that applies to the call (its tenant's, its agent's,
   * its run's, each period) and the request's own limit, all or nothing.
   */
  async reserve(request: ReserveRequest): Promise<ReserveResult> {
    const unitsMicros = checkedMicros(request.units, 'units');
    const requestLimitMicros = request.requestLimitUnits === undefined ? undefined : checkedMicros(request.requestLimitUnits, 'requestLimitUnits');
    const result = (await this.batches.submit({ kind: 'reserve', request, unitsMicros, requestLimitMicros })) as ReserveResult;
    this.reservations.inc({ verdict: result.ok ? result.verdict : 'exceeded' });
    return result;
  }

  /** What `reserve` would decide now, holding nothing (for dry runs). */
  async check(request: ReserveRequest): Promise<BudgetCheckResult> {
    const unitsMicros = checkedMicros(request.units, 'units');
    const requestLimitMicros = request.requestLimitUnits === undefined ? undefined : checkedMicros(request.requestLimitUnits, 'requestLimitUnits');
    const now = this.options.now();
    const budgets = await findBudgetsFor(this.db, [request]);
    const { limits, charges } = limitsFor(request, requestLimitMicros, budgets, now);
    const levels = await readCounters(this.db, charges);
    const decision = decideReservation(unitsMicros, limits, levels);
    if (!decision.ok) return { ok: false, code: 'budget_exceeded', details: exceededDetails(unitsMicros, decision.checks) };
    return { ok: true, verdict: decision.verdict, warnings: warningsOf(decision.checks) };
  }

  /** Records what the call actually cost and turns its reserved units into spent ones. */
  async settle(reservation: BudgetReservation, actualUnits: number): Promise<CloseOutcome> {
    const actualMicros = checkedMicros(actualUnits, 'actualUnits');
    return (await this.batches.submit({ kind: 'close', close: { id: reservation.id, status: 'settled', actualMicros } })) as CloseOutcome;
  }

  /** Returns a reservation's units untouched: nothing was dispatched. */
  async release(reservation: BudgetReservation): Promise<CloseOutcome> {
    return (await this.batches.submit({ kind: 'close', close: { id: reservation.id, status: 'released', actualMicros: null } })) as CloseOutcome;
  }

  /** Releases reservations left open past their TTL by a replica that died; returns how many. */
  async releaseExpired(limit = 500): Promise<number> {
    const ids = await findExpiredReservations(this.db, this.options.now(), limit);
    const outcomes = await Promise.all(
      ids.map((id) => this.batches.submit({ kind: 'close', close: { id, status: 'expired', actualMicros: null } })),
    );
    return outcomes.filter((outcome) => outcome === 'expired').length;
  }

  /** Stops the sweeper and waits for batches in flight. */
  async close(): Promise<void> {
    if (this.sweeper) clearInterval(this.sweeper);
    await this.batches.drain();
  }

  /**
   * One batch, one transaction: closes first (they free units), then reservations in arrival
   * order, each decided against the counters as the earlier ones left them.
   */
  private async commit(ops: LedgerOp[]): Promise<LedgerOpResult[]> {
    const now = this.options.now();
    return this.db.transaction().execute(async (trx) => {
      const closes = ops.flatMap((op) => (op.kind === 'close' ? [op.close] : []));
      const closed = await closeReservations(trx, closes, now);
      const reserves = ops.flatMap((op) => (op.kind === 'reserve' ? [op] : []));
      const subjects = reserves.map((op) => op.request);
      const { budgets, levels } = await lockBudgetCounters(trx, subjects, windowsAt(now), [
        ...closed.flatMap((c) => c.charges),
        ...subjects.map(runTotalCounter),
      ]);
      const plans = reserves.map((op) => ({ op, ...limitsFor(op.request, op.requestLimitMicros, budgets, now) }));

      const { deltas, add } = counterChanges(levels);

      // The first close of an id in the batch is the one that happened; later ones were too late.
      const closedNow = new Map(closed.map((reservation) => [reservation.id, reservation]));
      const closeOutcomes = new Map<LedgerOp, ClosedStatus>();
      for (const op of ops) {
        if (op.kind !== 'close') continue;
        const reservation = closedNow.get(op.close.id);
        if (!reservation) continue;
        closedNow.delete(op.close.id);
        for (const charge of reservation.charges) add(charge, op.close.actualMicros ?? 0, -reservation.unitsMicros);
        closeOutcomes.set(op, op.close.status);
      }

      const created: NewReservation[] = [];
      const reserveResults = new Map<LedgerOp, ReserveResult>();
      for (const plan of plans) {
        const { request, unitsMicros } = plan.op;
        const decision = decideReservation(unitsMicros, plan.limits, levels as ReadonlyMap<string, CounterLevel>);
        if (!decision.ok) {
          reserveResults.set(plan.op, { ok: false, code: 'budget_exceeded', details: exceededDetails(unitsMicros, decision.checks) });
          continue;
        }
        for (const charge of plan.charges) add(charge, 0, unitsMicros);
        const reservation: BudgetReservation = {
          id: `bres_${randomBytes(12).toString('base64url')}`,
          tenantId: request.tenantId,
          agentId: request.agentId,
          runId: request.runId,
          units: fromMicros(unitsMicros),
        };
        created.push({ ...reservation, unitsMicros, charges: plan.charges });
        reserveResults.set(plan.op, { ok: true, reservation, verdict: decision.verdict, warnings: warningsOf(decision.checks) });
      }

      await writeLedger(trx, [...deltas.values()], created, now, new Date(now.getTime() + this.options.reservationTtlMs));
      // Freeze the answers only once every write of the batch has succeeded.
      return ops.map((op) =>
        op.kind === 'reserve' ? reserveResults.get(op)! : (closeOutcomes.get(op) ?? 'already_closed'),
      );
    });
  }
}

/**
 * The limits a call is checked against and the counters it is charged to: each applicable
 * budget's current window, and the run's own running total (always charged, so a later
 * request's `budget_units` counts what the run spent before it).
 */
function limitsFor(
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
      limitMicros: toMicros(budget.limitUnits),
      graceMicros: toMicros(budget.graceUnits),
      warnRatio: budget.warnRatio,
      label: { source: 'budget', budgetId: budget.id, scope: budget.scope, period: budget.period },
    });
  }
  const runTotal = runTotalCounter(subject);
  charges.push(runTotal);
  if (requestLimitMicros !== undefined) {
    limits.push({ counter: counterId(runTotal), limitMicros: requestLimitMicros, graceMicros: 0, warnRatio: null, label: { source: 'request' } });
  }
  return { limits, charges };
}

function runTotalCounter(subject: ChargeSubject): CounterRef {
  return { key: runCounterKey(subject.tenantId, subject.runId), periodStart: periodStart('total', new Date(0)) };
}

function windowsAt(now: Date): Windows {
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

function checkedMicros(units: number, name: string): Micros {
  if (!Number.isFinite(units) || units < 0) throw new RangeError(`${name} must be a finite number ≥ 0, got ${units}`);
  return toMicros(units);
}
