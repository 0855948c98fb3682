import type { Kysely, Transaction } from 'kysely';
import type { DB } from '../db/schema.js';

/** What an `audit.partition_detached` record of a range of leaves says (its `details`). */
export interface LeafDetachReport {
  partition: string;
  from_leaf: number;
  to_leaf: number;
  last_hash: string;
  /** The reports of earlier detachments the partition held, each with its seq: they left with it. */
  archived_records?: Array<Omit<LeafDetachReport, 'archived_records'> & { event_seq: number }>;
}

/** A range of leaves detached after export, as `audit.partition_detached` reports it. */
export interface ArchivedLeaves {
  partition: string;
  from_leaf: number;
  to_leaf: number;
  last_hash: string;
  event_seq: number;
}

/** The ranges of leaves operators detached after export. */
export async function readArchivedLeaves(db: Kysely<DB> | Transaction<DB>): Promise<ArchivedLeaves[]> {
  const rows = await db
    .selectFrom('audit_partition_archives')
    .select(['partition', 'from_leaf', 'to_leaf', 'last_hash', 'event_seq'])
    .where('from_leaf', 'is not', null)
    .orderBy('from_leaf')
    .execute();
  return rows.map((row) => ({
    partition: row.partition,
    from_leaf: Number(row.from_leaf),
    to_leaf: Number(row.to_leaf),
    last_hash: row.last_hash,
    event_seq: Number(row.event_seq),
  }));
}

/**
 * The first leaf of an archived range the log does not report (by its own `audit.partition_detached`
 * record, or the copy a later range's record carries): such a range is records removed.
 */
export async function firstUnreportedLeaves(
  db: Kysely<DB> | Transaction<DB>,
  archives: ArchivedLeaves[],
): Promise<number | undefined> {
  if (archives.length === 0) return undefined;
  const rows = await db
    .selectFrom('audit_events')
    .select(['seq', 'details'])
    .where('event_type', '=', 'audit.partition_detached')
    .where(
      'seq',
      'in',
      archives.map((a) => String(a.event_seq)),
    )
    .execute();
  const stored = new Map(rows.map((row) => [Number(row.seq), row.details as unknown as LeafDetachReport]));
  // A report that left with a later month is in that month's report; it came after the one it holds.
  const find = (archive: ArchivedLeaves): Omit<LeafDetachReport, 'archived_records'> | undefined => {
    const own = stored.get(archive.event_seq);
    if (own !== undefined) return own;
    for (const later of archives) {
      if (later.event_seq <= archive.event_seq) continue;
      const carried = stored.get(later.event_seq)?.archived_records?.find((r) => r.event_seq === archive.event_seq);
      if (carried !== undefined) return carried;
    }
    return undefined;
  };
  const bad = archives.filter((archive) => {
    const report = find(archive);
    return (
      report === undefined ||
      report.partition !== archive.partition ||
      report.from_leaf !== archive.from_leaf ||
      report.to_leaf !== archive.to_leaf ||
      report.last_hash !== archive.last_hash
    );
  });
  return bad.length === 0 ? undefined : Math.min(...bad.map((a) => a.from_leaf));
}
