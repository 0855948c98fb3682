import { nanoid } from 'nanoid';
import type { RawBuilder } from 'kysely';
import type { LedgerStepOptions } from './budget-ledger-repository.js';
import type { ClosedStatus, ReservationClose } from './reservation-close-repository.js';
import { toMicros, type Micros } from './budget-units.js';
import type { BudgetExceededDetails, BudgetVerdict } from './budget-verdict.js';

/** A reservation the pipeline asks for before dispatching a call. */
export interface ReserveRequest {
  tenantId: string;
  agentId: string;
  runId: string;
  /** The call's cost units (the tool's `cost_units`). */
  units: number;
  /** The request's own `budget_units` for this run: an extra limit on the run's total, never a loosening. */
  requestLimitUnits?: number | undefined;
  /** The id its reservation is to have, when the caller named it before (a record that cites it was made first). */
  reservationId?: string | undefined;
}

/** Reservations `prepare` decided, for a statement of another room to write. */
export interface PreparedReservations {
  /** The CTEs that write them (`LedgerStepOptions` says how they fit in the statement). */
  steps(options: LedgerStepOptions): RawBuilder<unknown>;
  /** The scalar that statement answers the outcome with (under the same `prefix` as the steps). */
  outcome(prefix?: string): RawBuilder<unknown>;
  /** Each request's answer if the steps write: what `written` will answer then. */
  decided: ReserveResult[];
  /**
   * After it ran, given that scalar: each request's answer, in order — its reservation, written, or its
   * refusal, which the statement found the very levels and budgets of — or undefined when nothing stood.
   */
  written(outcome: unknown): ReserveResult[] | undefined;
}

/** Units held against every budget that applies to a call, until it is settled or released. */
export interface BudgetReservation {
  readonly id: string;
  readonly tenantId: string;
  readonly agentId: string;
  readonly runId: string;
  readonly units: number;
}

/** `reserve`'s answer: admitted with a verdict and warnings, or refused. */
export type ReserveResult =
  | { ok: true; reservation: BudgetReservation; verdict: Exclude<BudgetVerdict, 'exceeded'>; warnings: string[] }
  | { ok: false; code: 'budget_exceeded'; details: BudgetExceededDetails };

/** A dry run's answer: what `reserve` would decide now, with nothing held. */
export type BudgetCheckResult =
  | { ok: true; verdict: Exclude<BudgetVerdict, 'exceeded'>; warnings: string[] }
  | { ok: false; code: 'budget_exceeded'; details: BudgetExceededDetails };

/**
 * `already_closed`: the reservation was settled or released before (or, for a release, expired);
 * nothing changed. `settled_after_expiry`: it had expired, its units given back, before the call
 * it held for settled; what the call cost is charged now.
 */
export type CloseOutcome = ClosedStatus | 'settled_after_expiry' | 'already_closed';

/** A new reservation's id. */
export function newReservationId(): string {
  // nanoid draws from a pool of random bytes: randomBytes costs microseconds per call.
  return `bres_${nanoid(16)}`;
}

/** What `release` writes: for a refused call's record to carry (`settlements`). */
export function releaseOf(reservation: { id: string }): ReservationClose {
  return { id: reservation.id, status: 'released', actualMicros: null };
}

/** What `settle` writes for a call that cost `actualUnits`: for a record to carry (`settlements`). */
export function settlementOf(reservation: { id: string }, actualUnits: number): ReservationClose {
  return { id: reservation.id, status: 'settled', actualMicros: checkedMicros(actualUnits, 'actualUnits') };
}

export function checkedMicros(units: number, name: string): Micros {
  if (!Number.isFinite(units) || units < 0) throw new RangeError(`${name} must be a finite number ≥ 0, got ${units}`);
  return toMicros(units);
}
