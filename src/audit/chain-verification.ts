import type { Kysely, Transaction } from 'kysely';
import type { DB } from '../db/schema.js';
import { GENESIS_HASH } from './audit-hash.js';
import { hexOf } from './audit-listing.js';
import { detachReports } from './archived-leaves.js';
import { readChainHead, type ChainHead } from './audit-repository.js';
import { walkChain, type ArchivedRange, type WalkResult } from './chain-walk.js';

export interface ChainVerification {
  ok: boolean;
  checked: number;
  first_bad_seq: number | null;
  /** The last row of the chain, when it verified and has rows: what an operator anchors elsewhere. */
  head: ChainHead | null;
  /** Present when an anchor was given: whether the chain still holds it. */
  anchor?: AnchorCheck;
  /** Present when the walk crossed ranges detached after export: verified up to their ends, not row by row. */
  archived?: { from_seq: number; to_seq: number; partition: string }[];
}

/** The ranges of the chain operators detached after export, keyed by their first seq. */
export async function readArchivedRanges(db: Kysely<DB> | Transaction<DB>): Promise<Map<number, ArchivedRange>> {
  // A range of leaves holding none of the chain's records has no link; the chain's own, and a range of leaves
  // holding its last records, have. (Every column, filtered here: a log migrated before leaves has fewer.)
  const rows = (await db.selectFrom('audit_partition_archives').selectAll().execute()).filter(
    (row) => row.prev_hash !== null,
  );
  return new Map(
    rows.map((row) => [
      Number(row.from_seq),
      {
        partition: row.partition,
        last_hash: row.last_hash,
        prev_hash: row.prev_hash ?? '',
        from_seq: Number(row.from_seq),
        to_seq: Number(row.to_seq),
        event_seq: Number(row.event_seq),
      },
    ]),
  );
}

/**
 * Why a chain does not hold an anchor: `missing`, no row at its seq (rows were cut off);
 * `hash_mismatch`, the row there has another hash (it, or a row before it, was rewritten);
 * `chain_broken`, the row is as anchored but the chain breaks before reaching it.
 */
export type AnchorFailure = 'missing' | 'hash_mismatch' | 'chain_broken';

export interface AnchorCheck {
  seq: number;
  ok: boolean;
  reason: AnchorFailure | null;
}

/**
 * Walks the chain from one snapshot of the rows and the head, recomputing every hash; `first_bad_seq`
 * is where the log first departs from an intact chain, and `anchor` (a head kept outside the database)
 * must still be held: docs/design/audit-chain.md#the-chain-and-its-verification and #anchors.
 */
export async function verifyAuditChain(
  db: Kysely<DB>,
  pageSize = 10000,
  anchor?: ChainHead,
  /** A row already trusted (a signed checkpoint): the walk starts after it, and `checked` counts from there. */
  from?: ChainHead,
): Promise<ChainVerification> {
  // One snapshot: an append committing during the walk would otherwise pass for rows cut off.
  return db
    .transaction()
    .setIsolationLevel('repeatable read')
    .setAccessMode('read only')
    .execute(async (trx) => {
      const head = await readChainHead(trx);
      const archives = await readArchivedRanges(trx);
      const archivedEnd = from === undefined ? undefined : [...archives.values()].find((r) => r.to_seq === from.seq);
      if (from !== undefined && from.seq > 0 && archivedEnd?.last_hash !== from.hash) {
        const start = await trx
          .selectFrom('audit_events')
          .select(hexOf('hash').as('hash'))
          .where('seq', '=', from.seq)
          .executeTakeFirst();
        // The trusted row itself must still be there as trusted; which earlier row changed is a full walk's to say.
        if (start?.hash !== from.hash) return { ok: false, checked: 0, first_bad_seq: from.seq, head: null };
      }
      const walked = await walkChain(trx, head, pageSize, from ?? { seq: 0, hash: GENESIS_HASH }, { archives });
      const unreported = walked.ok ? await firstUnreportedArchive(trx, walked.archived) : undefined;
      const { archived, through, ...rest } =
        unreported === undefined
          ? walked
          : { ...walked, ok: false, first_bad_seq: unreported, through: unreported - 1 };
      const verified: ChainVerification = {
        ...rest,
        head: rest.ok && head.seq > 0 ? head : null,
        ...(archived.length > 0
          ? { archived: archived.map(({ from_seq, to_seq, partition }) => ({ from_seq, to_seq, partition })) }
          : {}),
      };
      if (anchor === undefined) return verified;
      const start = from?.seq ?? 0;
      const check = await checkAnchor(trx, anchor, through, archived);
      if (check.ok) return { ...verified, anchor: check };
      // Where the anchor proves the log differs: the first seq missing up to it, or the anchored row
      // itself (the anchor tells that some row up to it was rewritten, not which). An earlier break
      // of the chain comes first, as it does without an anchor.
      const provenBad = check.reason === 'missing' ? through + 1 : anchor.seq;
      const firstBad = rest.first_bad_seq === null ? provenBad : Math.min(rest.first_bad_seq, provenBad);
      const archivedRows = archived.reduce((n, r) => n + (r.to_seq < provenBad ? r.to_seq - r.from_seq + 1 : 0), 0);
      // A head the anchor refutes is no head to anchor next.
      return {
        ...verified,
        ok: false,
        checked: Math.max(Math.min(rest.checked, provenBad - 1 - start - archivedRows), 0),
        first_bad_seq: firstBad,
        head: null,
        anchor: check,
      };
    });
}

/**
 * Walks the chain from `from` (trusted) to `to` only, crossing archived ranges: what vouches for a seal,
 * or, with `onRows`, what an export streams. In chunks of `chunkRows`, a snapshot each: one held for a
 * month's export would keep vacuum from every table for hours.
 */
export async function walkRange(
  db: Kysely<DB>,
  from: ChainHead,
  to: ChainHead,
  onRows?: (lines: string[]) => Promise<void>,
  pageSize = 10000,
  chunkRows = 1_000_000,
): Promise<WalkResult> {
  let start = from;
  let checked = 0;
  const archived: ArchivedRange[] = [];
  const ranges = [...(await readArchivedRanges(db)).values()];
  const inArchived = (seq: number) => ranges.some((range) => range.from_seq <= seq && seq <= range.to_seq);
  for (;;) {
    // A chunk ends at a record of the live chain; where there is none (an archived range), the rest goes in one.
    const stored =
      start.seq + chunkRows < to.seq && !inArchived(start.seq + chunkRows)
        ? await db
            .selectFrom('audit_events')
            .select(hexOf('hash').as('hash'))
            .where('seq', '=', String(start.seq + chunkRows))
            .executeTakeFirst()
        : undefined;
    const end: ChainHead =
      stored?.hash === undefined || stored.hash === null ? to : { seq: start.seq + chunkRows, hash: stored.hash };
    const walked = await db
      .transaction()
      .setIsolationLevel('repeatable read')
      .setAccessMode('read only')
      .execute(async (trx) => {
        const archives = await readArchivedRanges(trx);
        return walkChain(trx, end, pageSize, start, { archives, bounded: true, ...(onRows ? { onRows } : {}) });
      });
    checked += walked.checked;
    archived.push(...walked.archived);
    if (!walked.ok || end.seq === to.seq) return { ...walked, checked, archived };
    start = end;
  }
}

/**
 * The first archived range crossed that the chain does not report (its `audit.partition_detached`
 * record, or the copy a later range's record carries): such a range is rows removed.
 */
async function firstUnreportedArchive(trx: Transaction<DB>, crossed: ArchivedRange[]): Promise<number | undefined> {
  if (crossed.length === 0) return undefined;
  const rows = await trx
    .selectFrom('audit_events')
    .select(['seq', 'details'])
    .where('event_type', '=', 'audit.partition_detached')
    .where(
      'seq',
      'in',
      crossed.map((range) => range.event_seq),
    )
    .execute();
  const stored = new Map(rows.map((row) => [Number(row.seq), row.details as unknown as DetachReport]));
  // A container's record comes after the one it holds (required, so that this ends).
  const reportOf = (range: ArchivedRange): DetachReport | undefined => {
    const own = stored.get(range.event_seq);
    if (own !== undefined) return own;
    const container = crossed.find(
      (c) => c.from_seq <= range.event_seq && range.event_seq <= c.to_seq && c.event_seq > range.event_seq,
    );
    if (container === undefined) return undefined;
    return reportOf(container)?.archived_records?.find((r) => r.event_seq === range.event_seq);
  };
  const carried = await detachReports(trx);
  const bad = crossed.filter((range) => {
    // A report that left with a month of leaves is carried by that month's report.
    const report = reportOf(range) ?? (carried.get(range.event_seq) as DetachReport | undefined);
    return (
      report === undefined ||
      report.partition !== range.partition ||
      report.from_seq !== range.from_seq ||
      report.to_seq !== range.to_seq ||
      report.prev_hash !== range.prev_hash ||
      report.last_hash !== range.last_hash
    );
  });
  return bad.length === 0 ? undefined : Math.min(...bad.map((range) => range.from_seq));
}

/** What an `audit.partition_detached` record says (its `details`). */
export interface DetachReport {
  partition: string;
  from_seq: number;
  to_seq: number;
  prev_hash: string;
  last_hash: string;
  /** The reports of earlier detachments whose records this range holds, each with its seq. */
  archived_records?: (Omit<DetachReport, 'archived_records'> & { event_seq: number })[];
}

/** The `audit.partition_detached` records among the rows from `fromSeq` to `toSeq`, with their seq. */
export async function detachReportsBetween(
  db: Kysely<DB>,
  fromSeq: number,
  toSeq: number,
): Promise<(Omit<DetachReport, 'archived_records'> & { event_seq: number })[]> {
  const rows = await db
    .selectFrom('audit_events')
    .select(['seq', 'details'])
    .where('event_type', '=', 'audit.partition_detached')
    .where('seq', '>=', String(fromSeq))
    .where('seq', '<=', String(toSeq))
    .orderBy('seq')
    .execute();
  return rows.map((row) => {
    const { partition, from_seq, to_seq, prev_hash, last_hash } = row.details as unknown as DetachReport;
    return { event_seq: Number(row.seq), partition, from_seq, to_seq, prev_hash, last_hash };
  });
}

/**
 * Whether the chain holds `anchor`: its row is there with its hash, at or below `through`, the
 * last seq the walk verified (a verified row's stored hash is the one recomputed).
 */
async function checkAnchor(
  trx: Transaction<DB>,
  anchor: ChainHead,
  through: number,
  archived: ArchivedRange[],
): Promise<AnchorCheck> {
  // An archived range's last link is known without its row.
  const stored =
    archived.find((range) => range.to_seq === anchor.seq)?.last_hash ??
    (
      await trx
        .selectFrom('audit_events')
        .select(hexOf('hash').as('hash'))
        .where('seq', '=', anchor.seq)
        .executeTakeFirst()
    )?.hash;
  const reason: AnchorFailure | null =
    stored === undefined
      ? 'missing'
      : stored !== anchor.hash
        ? 'hash_mismatch'
        : anchor.seq > through
          ? 'chain_broken'
          : null;
  return { seq: anchor.seq, ok: reason === null, reason };
}
