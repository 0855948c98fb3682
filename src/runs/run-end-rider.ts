import { sql, type Kysely, type Transaction } from 'kysely';
import {
  appendIfHeadCarrying,
  writeAuditEventsCarrying,
  type AppendRider,
  type ChainHead,
  type TimedAuditEvent,
} from '../audit/audit-repository.js';
import type { AuditRecord } from '../audit/audit-event.js';
import type { CloseOutcome } from '../budgets/budget-ledger.js';
import type { ReservationClose } from '../budgets/budget-ledger-repository.js';
import type { DB } from '../db/schema.js';
import { endedOf, endRunsSkippingLocked, runEndSteps, type EndedRunRow, type RunEnding } from './run-repository.js';

/**
 * A run's end riding on its call's last audit record: ended in the same commit, only if the
 * record is appended and the run's row is free (see `endRunsSkippingLocked`). The composition
 * root hands it to the audit log, which knows nothing of runs.
 */
export const runEndRider: AppendRider<RunEnding> = {
  steps: (endings, when) => ({
    ctes: runEndSteps(endings, { waitForLocks: false, when }),
    changed: sql`(select coalesce(json_agg(run_ends_done), '[]') from run_ends_done)`,
  }),
  answers: (endings, rows) => endedOf(endings, rows as EndedRunRow[]),
  applyHoldingChain: endRunsSkippingLocked,
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
    applyHoldingChain: async (trx, items) => {
      const { endings, closes } = split(items);
      const ended = endings.length > 0 ? await runEndRider.applyHoldingChain(trx, endings) : [];
      const closed = closes.length > 0 ? await settlements.applyHoldingChain(trx, closes) : [];
      return spread(items, ended, closed);
    },
  };
}

/** An audit event, and the run it ends if it is that run's last word. */
export type RunEndingEvent = Omit<TimedAuditEvent, 'rides'> & { endRun?: RunEnding };

function riding(events: RunEndingEvent[]): TimedAuditEvent<RunEnding>[] {
  return events.map(({ endRun, ...event }) => (endRun ? { ...event, rides: endRun } : event));
}

/** `appendIfHeadCarrying` with run ends: for each event, whether its run ended with it. */
export async function appendIfHead(
  db: Kysely<DB>,
  expected: ChainHead,
  events: RunEndingEvent[],
): Promise<
  { ok: true; records: AuditRecord[]; last: ChainHead; runsEnded: boolean[] } | { ok: false; head: ChainHead }
> {
  const appended = await appendIfHeadCarrying(db, expected, riding(events), runEndRider);
  return appended.ok
    ? { ok: true, records: appended.records, last: appended.last, runsEnded: appended.answers.map((a) => a === true) }
    : appended;
}

/** `writeAuditEventsCarrying` with run ends, under the chain's lock the caller's transaction takes. */
export async function writeAuditEventsEndingRuns(
  trx: Transaction<DB>,
  events: RunEndingEvent[],
): Promise<{ records: AuditRecord[]; runsEnded: boolean[] }> {
  const appended = await writeAuditEventsCarrying(trx, riding(events), runEndRider);
  return { records: appended.records, runsEnded: appended.answers.map((a) => a === true) };
}
