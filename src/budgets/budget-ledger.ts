import type { Kysely } from 'kysely';
import { Counter, type Registry } from 'prom-client';
import type { AuditEventInput } from '../audit/audit-event.js';
import { writeAuditEvents, type AppendRider } from '../audit/audit-repository.js';
import { findRecordedCosts, type RecordedCost } from '../audit/audit-listing.js';
import { Failed, GroupCommit, isConflict, retryOnConflict } from '../db/group-commit.js';
import type { DB } from '../db/schema.js';
import {
  counterId,
  findBudgetsFor,
  lockBudgetCounters,
  readBudgetCounters,
  readCounters,
} from './budget-counter-repository.js';
import {
  lockLedgerForReservations,
  ledgerWriteOutcome,
  ledgerWriteResult,
  ledgerWriteSteps,
  writeLedger,
  writeLedgerIf,
  type LedgerWriteIf,
  type LedgerWriteRow,
} from './budget-ledger-repository.js';
import { findExpiredReservations, type ExpiredReservation } from './open-reservation-repository.js';
import {
  closeAndUncharge,
  closedOf,
  closesChanged,
  closeSteps,
  firstCloses,
  type Closed,
  type ClosesRow,
  type ReservationClose,
} from './reservation-close-repository.js';
import {
  checkedMicros,
  releaseOf,
  settlementOf,
  type BudgetCheckResult,
  type BudgetReservation,
  type CloseOutcome,
  type PreparedReservations,
  type ReserveRequest,
  type ReserveResult,
} from './budget-reservation.js';
import { decideBatch, limitsFor, windowsAt, type ReserveOp } from './reservation-batch.js';
import { keptRunTotals, KnownLedger } from './known-ledger.js';
import { toMicros } from './budget-units.js';
import { decideReservation, exceededDetails, warningsOf } from './budget-verdict.js';
import type { Database } from '../db/database.js';
import { changeInLockOrder } from '../db/lock-order.js';

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

type LedgerOp = ReserveOp | { kind: 'close'; close: ReservationClose };

type LedgerOpResult = ReserveResult | CloseOutcome;

/**
 * Budget admission, exact across replicas: compare-and-set reservations and settlements in group
 * commits, no leases. Why: docs/design/budget-ledger.md.
 * A database fault throws (the pipeline answers 503 and admits nothing).
 */
export class BudgetLedger {
  private readonly batches: GroupCommit<LedgerOp, LedgerOpResult>;
  private readonly reservations: Counter<'verdict'>;
  private readonly conflicts: Counter;
  private readonly sweeper: NodeJS.Timeout | undefined;
  /** What this replica last saw of budgets and counters: guesses its writes check. */
  private readonly known = new KnownLedger();

  /** Reservations: the call's intent record, committed durably after them, makes them durable. */
  private readonly db: Kysely<DB>;
  /** Settlements and releases: nothing commits after them before the answer leaves. */
  private readonly closes: Kysely<DB>;

  constructor(
    database: Database,
    private readonly options: BudgetLedgerOptions,
  ) {
    this.db = database.hotDeferred;
    this.closes = database.hot;
    this.batches = new GroupCommit((ops) => this.commit(ops));
    this.reservations = new Counter({
      name: 'toolgate_budget_reservations_total',
      help: 'Budget reservations by verdict (exceeded: refused)',
      labelNames: ['verdict'],
      registers: [options.registry],
    });
    this.conflicts = new Counter({
      name: 'toolgate_budget_write_conflicts_total',
      help: 'Reservation writes (compare and set) that found a counter or budget moved by another writer, and were decided again',
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
    const requestLimitMicros =
      request.requestLimitUnits === undefined
        ? undefined
        : checkedMicros(request.requestLimitUnits, 'requestLimitUnits');
    const result = (await this.batches.submit({
      kind: 'reserve',
      request,
      unitsMicros,
      requestLimitMicros,
    })) as ReserveResult;
    this.reservations.inc({ verdict: result.ok ? result.verdict : 'exceeded' });
    return result;
  }

  /**
   * Reservations decided from what this replica last saw, for another room's statement to write with its own rows (a
   * run's claim): only a batch of plain admissions on counters that exist, else undefined (each is then reserved as
   * `reserve` reserves). The statement's guard is the one `reserve` writes with.
   */
  prepare(requests: ReserveRequest[]): PreparedReservations | undefined {
    if (requests.length === 0) return undefined;
    const now = this.options.now();
    const seen = this.known.guess(requests, now);
    if (!seen) return undefined;
    const expected = new Map(seen.levels);
    const ops: ReserveOp[] = requests.map((request) => ({
      kind: 'reserve',
      request,
      unitsMicros: checkedMicros(request.units, 'units'),
      requestLimitMicros:
        request.requestLimitUnits === undefined
          ? undefined
          : checkedMicros(request.requestLimitUnits, 'requestLimitUnits'),
    }));
    const plan = decideBatch(ops, seen.budgets, seen.levels, now);
    // Plain admissions and refusals only. With a refusal there are no bounds: the statement compares
    // every level exactly, so a refusal it confirms is as exact as one decided from a read.
    if (
      !plan.results.every((result) => !result.ok || result.verdict === 'ok') ||
      plan.deltas.some((delta) => !expected.has(counterId(delta)))
    )
      return undefined;
    const write: LedgerWriteIf = {
      expected,
      deltas: plan.deltas,
      reservations: plan.created,
      reservedAt: now,
      expiresAt: new Date(now.getTime() + this.options.reservationTtlMs),
      budgets: { subjects: requests, budgets: seen.budgets },
      bounds: plan.bounds,
    };
    return {
      steps: (options) => ledgerWriteSteps(write, options),
      outcome: ledgerWriteOutcome,
      decided: plan.results,
      written: (row) => {
        const result = ledgerWriteResult(write, row as LedgerWriteRow | null);
        if (!result.ok) {
          if (result.budgetsHeld) this.known.rememberLevels(result.levels);
          else this.known.forget(requests, expected.keys());
          return undefined;
        }
        this.known.rememberLevels(result.levels);
        for (const answer of plan.results) this.reservations.inc({ verdict: answer.ok ? 'ok' : 'exceeded' });
        return plan.results;
      },
    };
  }

  /** What `reserve` would decide now, holding nothing (for dry runs). */
  async check(request: ReserveRequest): Promise<BudgetCheckResult> {
    const unitsMicros = checkedMicros(request.units, 'units');
    const requestLimitMicros =
      request.requestLimitUnits === undefined
        ? undefined
        : checkedMicros(request.requestLimitUnits, 'requestLimitUnits');
    const now = this.options.now();
    const budgets = await findBudgetsFor(this.db, [request]);
    const { limits, charges } = limitsFor(request, requestLimitMicros, budgets, now);
    const levels = await readCounters(this.db, charges);
    const decision = decideReservation(unitsMicros, limits, levels);
    if (!decision.ok)
      return { ok: false, code: 'budget_exceeded', details: exceededDetails(unitsMicros, decision.checks) };
    return { ok: true, verdict: decision.verdict, warnings: warningsOf(decision.checks) };
  }

  /** Records what the call actually cost and turns its reserved units into spent ones. */
  async settle(reservation: BudgetReservation, actualUnits: number): Promise<CloseOutcome> {
    // (A sweep expiring the reservation at the same moment is met by `closeAndUncharge`: it looks
    // again, finds it expired, and settles it late.)
    return (await this.batches.submit({
      kind: 'close',
      close: settlementOf(reservation, actualUnits),
    })) as CloseOutcome;
  }

  /**
   * Settlements riding a call's outcome record (see `AppendRider`), closed in its statement after the chain head, as the
   * lock order has it. Each answers as `settle` would; undefined for one changed meanwhile, which `settle` then closes.
   */
  readonly settlements: AppendRider<ReservationClose, CloseOutcome | undefined> = {
    steps: (closes, when) => ({
      ctes: closeSteps(firstCloses(closes), this.options.now(), when),
      changed: closesChanged,
    }),
    answers: (closes, changed) => this.answered(closes, closedOf(changed as ClosesRow | null)),
  };

  private answered(closes: ReservationClose[], result: Closed): Array<CloseOutcome | undefined> {
    this.known.rememberLevels(result.levels);
    return closes.map((close) => {
      if (result.changed.delete(close.id)) return undefined;
      // The first close of an id is the one that happened; later ones were too late.
      if (!result.closed.delete(close.id)) return 'already_closed';
      return result.late.has(close.id) ? 'settled_after_expiry' : close.status;
    });
  }

  /** Returns a reservation's units untouched: nothing was dispatched. */
  async release(reservation: BudgetReservation): Promise<CloseOutcome> {
    return (await this.batches.submit({ kind: 'close', close: releaseOf(reservation) })) as CloseOutcome;
  }

  /**
   * Releases reservations left open past their TTL by a replica that died, each with a
   * `budget.reservation_expired` event in the same transaction; returns how many.
   */
  async releaseExpired(limit = 500): Promise<number> {
    const now = this.options.now();
    const due = await findExpiredReservations(this.db, now, limit);
    let closed = 0;
    // A transaction per chunk: each holds the audit chain's lock, and every replica's appends
    // wait for it meanwhile.
    for (let start = 0; start < due.length; start += SWEEP_CHUNK)
      closed += await this.expire(due.slice(start, start + SWEEP_CHUNK), now);
    return closed;
  }

  /** Closes reservations past their TTL in one transaction, each on record; returns how many. */
  private async expire(due: ExpiredReservation[], now: Date): Promise<number> {
    const { closed, levels } = await retryOnConflict(() =>
      changeInLockOrder(this.db, async (trx) => {
        // A call whose outcome was recorded reached its backend: its settlement was lost (its
        // replica died between the two commits), and it is charged what the record says, not
        // given back.
        const recorded = await findRecordedCosts(trx, due);
        const closes = due.map((r): ReservationClose => {
          const cost = recorded.get(r.id);
          return cost
            ? { id: r.id, status: 'settled', actualMicros: toMicros(cost.costUnits) }
            : { id: r.id, status: 'expired', actualMicros: null };
        });
        const result = await closeAndUncharge(trx, closes, now);
        const events = due
          .filter((r) => result.closed.has(r.id))
          .map((r) => {
            const cost = recorded.get(r.id);
            return { occurredAt: now, event: cost ? settledFromRecordEvent(r, cost) : expiredEvent(r, now) };
          });
        await writeAuditEvents(trx, events);
        return result;
      }),
    );
    this.known.rememberLevels(levels);
    return closed.size;
  }

  /** Stops the sweeper and waits for batches in flight. */
  async close(): Promise<void> {
    if (this.sweeper) clearInterval(this.sweeper);
    await this.batches.drain();
  }

  /**
   * One batch: closes first (they free units), in one statement; then reservations in arrival
   * order, each decided against the counters as the earlier ones left them.
   */
  private async commit(ops: LedgerOp[]): Promise<Array<LedgerOpResult | Failed>> {
    const now = this.options.now();
    const closes = ops.flatMap((op) => (op.kind === 'close' ? [op.close] : []));
    let closed = new Set<string>();
    let late = new Set<string>();
    if (closes.length > 0) {
      const result = await retryOnConflict(() => closeAndUncharge(this.closes, closes, now));
      closed = result.closed;
      late = result.late;
      this.known.rememberLevels(result.levels);
    }
    const reserves = ops.flatMap((op) => (op.kind === 'reserve' ? [op] : []));
    let reserved: Array<ReserveResult | Failed>;
    try {
      reserved = reserves.length > 0 ? await this.reserveAll(reserves, now) : [];
    } catch (error) {
      // The closes are committed whatever happens to the reservations: answer them, fail these.
      if (closes.length === 0) throw error;
      reserved = reserves.map(() => new Failed(error));
    }
    let next = 0;
    return ops.map((op) => {
      if (op.kind === 'reserve') return reserved[next++]!;
      // The first close of an id in the batch is the one that happened; later ones were too late.
      if (!closed.delete(op.close.id)) return 'already_closed';
      return late.has(op.close.id) ? 'settled_after_expiry' : op.close.status;
    });
  }

  /**
   * Decides reservations from what this replica knows and writes them only if that still stands, in one statement; a
   * lost check decides again, under row locks once it keeps losing: docs/design/budget-ledger.md.
   */
  private async reserveAll(reserves: ReserveOp[], now: Date): Promise<ReserveResult[]> {
    const subjects = reserves.map((op) => op.request);
    const expiresAt = new Date(now.getTime() + this.options.reservationTtlMs);
    try {
      let seen = this.known.guess(subjects, now);
      let guessed = seen !== undefined;
      for (let attempt = 0; attempt < RESERVE_ATTEMPTS; attempt += 1) {
        if (!seen) {
          seen = await readBudgetCounters(this.db, subjects, windowsAt(now), keptRunTotals(subjects));
          guessed = false;
        }
        const expected = new Map(seen.levels);
        const plan = decideBatch(reserves, seen.budgets, seen.levels, now);
        // A refusal decided from a guess is not trusted: it is decided again from a fresh read.
        if (guessed && !plan.results.every((result) => result.ok)) {
          this.known.forget(subjects, expected.keys());
          seen = undefined;
          continue;
        }
        // The budgets too must still be those it decided with: a limit may have changed since.
        const budgets = { subjects, budgets: seen.budgets };
        const written = await writeLedgerIf(
          this.db,
          expected,
          plan.deltas,
          plan.created,
          now,
          expiresAt,
          budgets,
          plan.bounds,
        );
        if (written.ok) {
          // Budgets taken from what this replica remembered need not be remembered again.
          if (guessed) this.known.rememberLevels(written.levels);
          else this.known.remember(subjects, seen.budgets, written.levels);
          return plan.results;
        }
        this.conflicts.inc();
        this.known.forget(subjects, expected.keys());
        seen =
          written.budgetsHeld && written.levels.size > 0
            ? { budgets: seen.budgets, levels: written.levels }
            : undefined;
        guessed = false;
      }
    } catch (error) {
      // A deadlock with another replica's batch wrote nothing: a lost race like any other.
      if (!isConflict(error)) throw error;
      this.conflicts.inc();
    }
    const locked = await retryOnConflict(() =>
      this.db.transaction().execute(async (trx) => {
        // Before the budgets are read: a budget change in progress commits first, and is seen.
        await lockLedgerForReservations(trx);
        const { budgets, levels } = await lockBudgetCounters(trx, subjects, windowsAt(now), keptRunTotals(subjects));
        const plan = decideBatch(reserves, budgets, levels, now);
        await writeLedger(trx, plan.deltas, plan.created, now, expiresAt);
        // Freeze the answers only once every write of the batch has succeeded.
        return { plan, budgets, levels };
      }),
    );
    this.known.remember(subjects, locked.budgets, locked.levels);
    return locked.plan.results;
  }
}

/** Who and what a record of the TTL sweep about a reservation names. */
function sweptRecord(
  reservation: ExpiredReservation,
): Pick<AuditEventInput, 'actor' | 'tenant_id' | 'agent_id' | 'run_id'> {
  return {
    actor: 'system.expiry',
    tenant_id: reservation.tenantId,
    agent_id: reservation.agentId,
    run_id: reservation.runId,
  };
}

/** The record of a reservation past its TTL whose call's outcome was recorded: charged what it cost. */
function settledFromRecordEvent(reservation: ExpiredReservation, cost: RecordedCost): AuditEventInput {
  return {
    event_type: 'budget.reservation_settled_late',
    ...sweptRecord(reservation),
    status: 'settled',
    cost_units: cost.costUnits,
    details: {
      reservation_id: reservation.id,
      reserved_units: reservation.units,
      charged_units: cost.costUnits,
      reason: 'settlement_lost',
      outcome_event_id: cost.eventId,
    },
  };
}

/** The record of a reservation given back at its TTL: no call settled it in time. */
function expiredEvent(reservation: ExpiredReservation, now: Date): AuditEventInput {
  return {
    event_type: 'budget.reservation_expired',
    ...sweptRecord(reservation),
    status: 'expired',
    details: {
      reservation_id: reservation.id,
      released_units: reservation.units,
      reserved_at: reservation.reservedAt.toISOString(),
      expires_at: reservation.expiresAt.toISOString(),
      released_late_ms: now.getTime() - reservation.expiresAt.getTime(),
    },
  };
}

/** How many reservations past their TTL the sweep closes per transaction. */
const SWEEP_CHUNK = 50;

/** How many compare-and-set writes a reservation batch tries before it decides under row locks. */
const RESERVE_ATTEMPTS = 4;
