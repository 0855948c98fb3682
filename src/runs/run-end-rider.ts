import { sql, type Kysely, type Transaction } from 'kysely';
import {
  appendIfHeadCarrying,
  writeAuditEventsCarrying,
  type AppendRider,
  type ChainHead,
  type TimedAuditEvent,
} from '../audit/audit-repository.js';
import type { AuditRecord } from '../audit/audit-event.js';
import type { DB } from '../db/schema.js';
import { endedOf, endRunsSkippingLocked, runEndSteps, type EndedRunRow, type RunEnding } from './run-repository.js';

/**
 * A run's end riding on its call's last audit record: ended in the same commit, only if the
 * record is appended and the run's row is free (see `endRunsSkippingLocked`). The composition
 * root hands it to the audit log, which knows nothing of runs.
 */
export const runEndRider: AppendRider<RunEnding> = {
  steps: (endings, when) => runEndSteps(endings, { waitForLocks: false, when }),
  changed: sql`(select coalesce(json_agg(run_ends_done), '[]') from run_ends_done)`,
  applied: (endings, rows) => endedOf(endings, rows as EndedRunRow[]),
  applyHoldingChain: endRunsSkippingLocked,
};

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
    ? { ok: true, records: appended.records, last: appended.last, runsEnded: appended.applied }
    : appended;
}

/** `writeAuditEventsCarrying` with run ends, under the chain's lock the caller's transaction takes. */
export async function writeAuditEventsEndingRuns(
  trx: Transaction<DB>,
  events: RunEndingEvent[],
): Promise<{ records: AuditRecord[]; runsEnded: boolean[] }> {
  const appended = await writeAuditEventsCarrying(trx, riding(events), runEndRider);
  return { records: appended.records, runsEnded: appended.applied };
}
