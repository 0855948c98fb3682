import { sql } from 'kysely';
import type { AppendGuard, AppendRider } from '../audit/audit-repository.js';
import type { CloseOutcome, PreparedReservations, ReserveRequest } from '../budgets/budget-reservation.js';
import type { ReservationClose } from '../budgets/reservation-close-repository.js';
import {
  claimedRunStartSteps,
  claimedRunStartsOf,
  endedRunStartSteps,
  type ClaimedRunStart,
  type ClaimedRunStartAnswer,
  type EndedRunStart,
} from './run-claim-repository.js';
import { endedOf, runEndSteps, type EndedRunRow, type RunEnding } from './run-end-repository.js';

/**
 * A run's end riding on its call's last audit record: ended in the same commit, only if the
 * record is appended and the run's row is free (`runEndSteps` without waiting for locks). The composition
 * root hands it to the audit log, which knows nothing of runs.
 */
export const runEndRider: AppendRider<RunEnding> = {
  steps: (endings, when) => ({
    ctes: runEndSteps(endings, { waitForLocks: false, when }),
    changed: sql`(select coalesce(json_agg(run_ends_done), '[]') from run_ends_done)`,
  }),
  answers: (endings, rows) => endedOf(endings, rows as EndedRunRow[]),
};

/**
 * What a call's last record carries: its run's end, when it is the run's last word, and the
 * closes of its reservations (an admitted call's settlement, a refused call's releases).
 */
export interface CallEnd {
  end?: RunEnding | undefined;
  closes?: ReservationClose[] | undefined;
}

/** Whether the run ended with the record, and how each close went (undefined: not made, to be made apart). */
export interface CallEndAnswer {
  ended: boolean;
  closed: Array<CloseOutcome | undefined>;
}

/** What a call's last record carries, if anything. */
export function callEnd(end: RunEnding | undefined, closes: ReservationClose[]): CallEnd | undefined {
  return end || closes.length > 0 ? { end, closes } : undefined;
}

/**
 * A run's end and reservations' closes riding the same record, in one statement: the run first (it
 * is skipped if held), then the reservations and their counters, the lock order's way after the chain head.
 */
export function callEndRider(
  settlements: AppendRider<ReservationClose, CloseOutcome | undefined>,
): AppendRider<CallEnd, CallEndAnswer> {
  const split = (items: CallEnd[]) => ({
    endings: items.flatMap((item) => (item.end ? [item.end] : [])),
    closes: items.flatMap((item) => item.closes ?? []),
  });
  const spread = (items: CallEnd[], ended: boolean[], closed: Array<CloseOutcome | undefined>): CallEndAnswer[] => {
    let e = 0;
    let c = 0;
    return items.map((item) => ({
      ended: item.end ? ended[e++]! : false,
      closed: (item.closes ?? []).map(() => closed[c++]),
    }));
  };
  return {
    steps: (items, when) => {
      const { endings, closes } = split(items);
      const ends = endings.length > 0 ? runEndRider.steps(endings, when) : undefined;
      const settles = closes.length > 0 ? settlements.steps(closes, when) : undefined;
      return {
        ctes:
          ends && settles
            ? sql`${ends.ctes}, ${settles.ctes}`
            : ((ends ?? settles)?.ctes ?? sql`call_end_nothing as (select 1)`),
        changed: sql`json_build_array(${ends?.changed ?? sql`null`}, ${settles?.changed ?? sql`null`})`,
      };
    },
    answers: (items, changed) => {
      const { endings, closes } = split(items);
      const [ends, settles] = changed as [unknown, unknown];
      return spread(
        items,
        endings.length > 0 ? runEndRider.answers(endings, ends) : [],
        closes.length > 0 ? settlements.answers(closes, settles) : [],
      );
    },
  };
}

/** A run created with a guarded record (ended by its first call's refusal, or claimed with its intent), or a held run's call. */
export type RunStartChange = EndedRunStart | ClaimedRunStart;

/**
 * Runs created with their first records, as the guard of those records: a root run created already ended with its
 * first call's refusal (both or neither: a run id already taken, or a grant there after all, leave both out); a root
 * run claimed with its first call's intent, the grant use and the reservation it was decided with (the intent only
 * with all three; each claim answered as `claimRuns` answers it). `charges` prepares the reservations of a batch.
 */
export function runStartGuard(charges?: {
  prepare(requests: ReserveRequest[]): PreparedReservations | undefined;
}): AppendGuard<RunStartChange, ClaimedRunStartAnswer | undefined> {
  // What a batch's steps prepared, for its answers: the guard's items are the same array in both.
  const preparedFor = new WeakMap<RunStartChange[], PreparedReservations | undefined>();
  const split = (items: RunStartChange[]) => {
    const ended: EndedRunStart[] = [];
    const endedOrds: number[] = [];
    const claims: ClaimedRunStart[] = [];
    const claimOrds: number[] = [];
    items.forEach((item, i) => {
      if (!('end' in item)) {
        claims.push(item);
        claimOrds.push(i + 1);
      } else {
        ended.push(item);
        endedOrds.push(i + 1);
      }
    });
    return { ended, endedOrds, claims, claimOrds };
  };
  // The refusals' levels a batch's steps prepared to confirm, for its answers (the known levels learn what it found).
  const refusedFor = new WeakMap<RunStartChange[], PreparedReservations>();
  return {
    steps: (items, when) => {
      const { ended, endedOrds, claims, claimOrds } = split(items);
      const charged = claims.flatMap((start) => {
        const { charge } = start.claim ?? start.held;
        return charge ? [charge] : [];
      });
      const prepared = charged.length > 0 ? charges?.prepare(charged) : undefined;
      preparedFor.set(items, prepared);
      const refusals = refusalsConfirmed(ended, charges);
      if (refusals) refusedFor.set(items, refusals);
      const claiming = claims.length > 0 ? claimedRunStartSteps(claims, claimOrds, prepared, when) : undefined;
      const parts = [
        // A batch's budget refusals rest on the levels they were decided on, compared all at once (none is written).
        ...(refusals ? [refusals.steps({ when, prefix: 'refused_' })] : []),
        ...(ended.length > 0
          ? [
              endedRunStartSteps(
                ended,
                when,
                endedOrds,
                refusals ? sql<boolean>`(select ok from refused_unchanged)` : undefined,
              ),
            ]
          : []),
        ...(claiming ? [claiming.ctes] : []),
      ];
      const made =
        ended.length > 0 && claiming
          ? sql`run_starts_all_made as (select ord from run_starts_made union all select ord from claim_starts_made)`
          : undefined;
      return {
        ctes: sql.join(made ? [...parts, made] : parts, sql`, `),
        made: made ? 'run_starts_all_made' : claiming ? 'claim_starts_made' : 'run_starts_made',
        changed: sql`json_build_array(${claiming?.changed ?? sql`null`}, ${refusals ? refusals.outcome('refused_') : sql`null`})`,
      };
    },
    answers: (items, changed) => {
      const { claims, claimOrds } = split(items);
      const [claimed, refused] = (changed ?? [null, null]) as [unknown, unknown];
      refusedFor.get(items)?.written(refused);
      const answered = claimedRunStartsOf(claims, claimOrds, preparedFor.get(items), claimed);
      let next = 0;
      return items.map((item) => ('end' in item ? undefined : answered[next++]));
    },
  };
}

/**
 * The budget refusals of ended run starts, decided again together from the levels this replica knows: what their
 * records confirm, if every one of them is still refused there. Undefined otherwise (their records then stand not).
 */
function refusalsConfirmed(
  ended: EndedRunStart[],
  charges: { prepare(requests: ReserveRequest[]): PreparedReservations | undefined } | undefined,
): PreparedReservations | undefined {
  const refused = ended.flatMap((start) => (start.budgetRefused ? [start.budgetRefused] : []));
  if (refused.length === 0) return undefined;
  const prepared = charges?.prepare(refused);
  return prepared?.decided.every((result) => !result.ok) ? prepared : undefined;
}
