import { sql } from 'kysely';
import type { AppendGuard, AppendRider } from '../audit/audit-repository.js';
import type { CloseOutcome } from '../budgets/budget-ledger.js';
import type { ReservationClose } from '../budgets/budget-ledger-repository.js';
import {
  endedOf,
  endedRunStartSteps,
  runEndSteps,
  type EndedRunStart,
  type EndedRunRow,
  type RunEnding,
} from './run-repository.js';

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

/**
 * A root run created already ended, with its first call's refusal as the guard of that refusal's
 * record: both or neither (a run id already taken, or a grant there after all, leave both out).
 */
export const runStartGuard: AppendGuard<EndedRunStart> = {
  steps: (starts, when) => ({ ctes: endedRunStartSteps(starts, when), made: 'run_starts_made' }),
};
