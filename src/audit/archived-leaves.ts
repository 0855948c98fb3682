import type { Kysely, Transaction } from 'kysely';
import type { DB } from '../db/schema.js';

/** What an `audit.partition_detached` record of a range of leaves says (its `details`, in part). */
export interface LeafDetachReport {
  partition: string;
  from_leaf: number;
  to_leaf: number;
  last_leaf_hash: string;
}

/** A range of leaves detached after export, as `audit_partition_archives` records it. */
export interface ArchivedLeaves {
  partition: string;
  from_leaf: number;
  to_leaf: number;
  last_leaf_hash: string;
  event_seq: number;
}

/** The ranges of leaves operators detached after export. */
export async function readArchivedLeaves(db: Kysely<DB> | Transaction<DB>): Promise<ArchivedLeaves[]> {
  const rows = await db
    .selectFrom('audit_partition_archives')
    .select(['partition', 'from_leaf', 'to_leaf', 'last_leaf_hash', 'event_seq'])
    .where('from_leaf', 'is not', null)
    .orderBy('from_leaf')
    .execute();
  return rows.map((row) => ({
    partition: row.partition,
    from_leaf: Number(row.from_leaf),
    to_leaf: Number(row.to_leaf),
    last_leaf_hash: row.last_leaf_hash!,
    event_seq: Number(row.event_seq),
  }));
}

/**
 * Every detachment the log reports, by the seq of its `audit.partition_detached` record: the record itself
 * where it is still in the log, else the copy a later report carries (`archived_records`), made when the
 * month holding it was detached in turn.
 */
export async function detachReports(db: Kysely<DB> | Transaction<DB>): Promise<Map<number, Record<string, unknown>>> {
  const rows = await db
    .selectFrom('audit_events')
    .select(['seq', 'details'])
    .where('event_type', '=', 'audit.partition_detached')
    .execute();
  const reports = new Map<number, Record<string, unknown>>();
  for (const row of rows) reports.set(Number(row.seq), row.details as Record<string, unknown>);
  for (const row of rows) {
    const carried = (row.details as { archived_records?: Array<{ event_seq: number }> }).archived_records ?? [];
    for (const report of carried) if (!reports.has(report.event_seq)) reports.set(report.event_seq, report);
  }
  return reports;
}

/**
 * The first leaf of an archived range the log does not report with the same bounds and last leaf: such a
 * range is records removed, not archived.
 */
export async function firstUnreportedLeaves(
  db: Kysely<DB> | Transaction<DB>,
  archives: ArchivedLeaves[],
): Promise<number | undefined> {
  if (archives.length === 0) return undefined;
  const reports = await detachReports(db);
  const bad = archives.filter((archive) => {
    const report = reports.get(archive.event_seq) as Partial<LeafDetachReport> | undefined;
    return (
      report === undefined ||
      report.partition !== archive.partition ||
      report.from_leaf !== archive.from_leaf ||
      report.to_leaf !== archive.to_leaf ||
      report.last_leaf_hash !== archive.last_leaf_hash
    );
  });
  return bad.length === 0 ? undefined : Math.min(...bad.map((a) => a.from_leaf));
}
