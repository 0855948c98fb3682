import { sql, type Kysely, type Selectable, type Transaction } from 'kysely';
import type { AuditPartitionArchiveTable, DB } from '../db/schema.js';
import { hexOf } from './audit-listing.js';

/** A partition of `audit_events` as the catalogue describes it, with its first and last seq. */
export interface PartitionRow {
  name: string;
  /** Bounds on `occurred_at`, [range_start, range_end); null where unbounded. */
  range_start: Date | null;
  range_end: Date | null;
  is_default: boolean;
  first_seq: number | null;
  last_seq: number | null;
  /** The planner's estimate of its rows (exact counts cost a scan). */
  rows_estimate: number;
}

/** What `audit_events_add_partition` (migration 0017) answers. */
export type AddPartitionResult = 'created' | 'exists' | 'overlaps' | 'default_has_rows';

/** The attached partitions of the log, oldest first, each with its first and last seq (two index probes). */
export async function listPartitionRows(db: Kysely<DB>): Promise<PartitionRow[]> {
  const { rows } = await sql<{ name: string; bound: string; rows_estimate: number }>`
    select c.relname as name, pg_get_expr(c.relpartbound, c.oid) as bound, greatest(c.reltuples, 0)::float8 as rows_estimate
    from pg_inherits i join pg_class c on c.oid = i.inhrelid
    where i.inhparent = 'audit_events'::regclass`.execute(db);
  const partitions = await Promise.all(
    rows.map(async (row) => {
      const range = parseBound(row.bound);
      const seqs = await sql<{ first: string | null; last: string | null }>`
        select min(seq) as first, max(seq) as last from ${sql.table(row.name)}`.execute(db);
      const first = seqs.rows[0]?.first ?? null;
      const last = seqs.rows[0]?.last ?? null;
      return {
        name: row.name,
        ...range,
        first_seq: first === null ? null : Number(first),
        last_seq: last === null ? null : Number(last),
        rows_estimate: Number(row.rows_estimate),
      };
    }),
  );
  const start = (p: PartitionRow) => (p.is_default ? Infinity : (p.range_start?.getTime() ?? -Infinity));
  return partitions.sort((a, b) => start(a) - start(b));
}

/** `FOR VALUES FROM (…) TO (…)` or `DEFAULT`, as `pg_get_expr` writes a range partition's bound. */
function parseBound(bound: string): Pick<PartitionRow, 'range_start' | 'range_end' | 'is_default'> {
  if (bound === 'DEFAULT') return { range_start: null, range_end: null, is_default: true };
  const from = /FROM \('([^']*)'\)/.exec(bound)?.[1];
  const to = /TO \('([^']*)'\)/.exec(bound)?.[1];
  return {
    range_start: from === undefined ? null : new Date(from),
    range_end: to === undefined ? null : new Date(to),
    is_default: false,
  };
}

/** The stored `prev_hash` and `hash` of the row at `seq`, if it is there and linked (a leaf record has none). */
export async function findLink(
  db: Kysely<DB> | Transaction<DB>,
  seq: number,
): Promise<{ prev_hash: string; hash: string } | undefined> {
  const row = await db
    .selectFrom('audit_events')
    .select([hexOf('prev_hash').as('prev_hash'), hexOf('hash').as('hash')])
    .where('seq', '=', String(seq))
    .executeTakeFirst();
  return row?.prev_hash === null || row?.hash === null || row === undefined
    ? undefined
    : { prev_hash: row.prev_hash, hash: row.hash };
}

/** Gives the month holding `at` a partition (migration 0017's function), giving up on a lock after 5 s. */
export async function addMonthPartition(db: Kysely<DB>, at: Date): Promise<AddPartitionResult> {
  return db.transaction().execute(async (trx) => {
    await sql`select set_config('lock_timeout', '5s', true)`.execute(trx);
    const { rows } = await sql<{ result: AddPartitionResult }>`
      select audit_events_add_partition(${at.toISOString()}::timestamptz) as result`.execute(trx);
    return rows[0]!.result;
  });
}

/**
 * Detaches a partition from the log, holding the chain's head meanwhile (so no append waits on the
 * log's lock while holding the head), and gives up after `lockTimeout` rather than stall appends.
 */
export async function detachPartition(trx: Transaction<DB>, name: string, lockTimeout: string): Promise<void> {
  await sql`select set_config('lock_timeout', ${lockTimeout}, true)`.execute(trx);
  await trx.selectFrom('audit_chain_head').select('seq').where('id', '=', 1).forUpdate().execute();
  await sql`alter table audit_events detach partition ${sql.table(name)}`.execute(trx);
}

export type ArchiveRow = Selectable<AuditPartitionArchiveTable>;

export async function insertArchive(
  trx: Transaction<DB>,
  archive: {
    event_seq: number;
    partition: string;
    from_seq: number;
    to_seq: number;
    prev_hash: string | null;
    first_hash: string;
    last_hash: string;
    row_count: number;
    checkpoint_id: string;
    detached_by: string;
    detached_at: Date;
    from_leaf?: number;
    to_leaf?: number;
    last_leaf_hash?: string;
  },
): Promise<void> {
  await trx.insertInto('audit_partition_archives').values(archive).execute();
}

export async function listArchives(db: Kysely<DB>): Promise<ArchiveRow[]> {
  return db.selectFrom('audit_partition_archives').selectAll().orderBy('from_seq').execute();
}

/**
 * The last leaf any of a partition's records is, and how many of them are not leaves yet (one scan of the
 * partition: what a month of leaf records archives up to, and whether it may be sealed).
 */
export async function lastLeafOf(
  db: Kysely<DB>,
  name: string,
): Promise<{ lastLeaf: number | null; unsequenced: number }> {
  const { rows } = await sql<{ last_leaf: string | null; unsequenced: string }>`
    select max(l.leaf_index) as last_leaf, count(*) filter (where l.leaf_index is null) as unsequenced
    from ${sql.table(name)} e left join audit_leaves l on l.event_id = e.event_id`.execute(db);
  const row = rows[0];
  return {
    lastLeaf: row?.last_leaf === null || row === undefined ? null : Number(row.last_leaf),
    unsequenced: Number(row?.unsequenced ?? 0),
  };
}

/** The `audit.partition_detached` records a partition holds, with their seq: they leave with it. */
export async function detachReportsIn(
  db: Kysely<DB>,
  name: string,
): Promise<Array<{ event_seq: number; details: Record<string, unknown> }>> {
  const { rows } = await sql<{ seq: string; details: Record<string, unknown> }>`
    select seq, details from ${sql.table(name)} where event_type = 'audit.partition_detached' order by seq`.execute(db);
  return rows.map((row) => ({ event_seq: Number(row.seq), details: row.details }));
}
