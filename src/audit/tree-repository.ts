import { sql, type Kysely, type Transaction } from 'kysely';
import type { DB } from '../db/schema.js';
import { tileKey, type Tile } from './merkle-tiles.js';

/** The tree as the sequencer last left it. */
export interface TreeState {
  treeSize: number;
  lastSeq: number;
  rootHash: Buffer;
  sequencer: string | null;
  /** Whether another replica's lease still holds. */
  leasedElsewhere: boolean;
}

/**
 * Locks the tree's state for a sequencing round, unless another round holds it (then undefined): one
 * round at a time across replicas, whoever holds the lease.
 */
export async function lockTreeState(trx: Transaction<DB>, me: string): Promise<TreeState | undefined> {
  const { rows } = await sql<{
    tree_size: string;
    last_seq: string;
    root_hash: Buffer;
    sequencer: string | null;
    leased_elsewhere: boolean;
  }>`
    select tree_size, last_seq, root_hash, sequencer,
      (sequencer is distinct from ${me} and lease_until > now()) as leased_elsewhere
    from audit_tree_state where id = 1 for update skip locked`.execute(trx);
  const row = rows[0];
  if (row === undefined) return undefined;
  return {
    treeSize: Number(row.tree_size),
    lastSeq: Number(row.last_seq),
    rootHash: row.root_hash,
    sequencer: row.sequencer,
    leasedElsewhere: row.leased_elsewhere,
  };
}

export async function renewSequencerLease(trx: Transaction<DB>, me: string, leaseMs: number): Promise<void> {
  await sql`update audit_tree_state set sequencer = ${me},
    lease_until = now() + make_interval(secs => ${leaseMs / 1000}) where id = 1`.execute(trx);
}

/** Gives the lease up, so that another replica takes over at once rather than when it lapses. */
export async function releaseSequencerLease(db: Kysely<DB>, me: string): Promise<void> {
  await sql`update audit_tree_state set lease_until = null where id = 1 and sequencer = ${me}`.execute(db);
}

/** What one round appended: leaves, the tiles they changed, the new state and its signed checkpoint. */
export interface Sequenced {
  firstIndex: number;
  leaves: Array<{ seq: number; eventId: string }>;
  tiles: Tile[];
  treeSize: number;
  lastSeq: number;
  rootHash: Buffer;
  note: string;
}

export async function writeSequenced(trx: Transaction<DB>, done: Sequenced): Promise<void> {
  if (done.leaves.length > 0) {
    await sql`
      insert into audit_leaves (leaf_index, seq, event_id)
      select ${done.firstIndex}::bigint + n - 1, s, e
      from unnest(${done.leaves.map((l) => String(l.seq))}::bigint[], ${done.leaves.map((l) => l.eventId)}::uuid[])
        with ordinality as t(s, e, n)`.execute(trx);
  }
  if (done.tiles.length > 0) {
    await sql`
      insert into audit_tree_tiles (level, idx, hashes)
      select l, i, h from unnest(${done.tiles.map((t) => t.level)}::smallint[],
        ${done.tiles.map((t) => String(t.index))}::bigint[], ${done.tiles.map((t) => t.hashes)}::bytea[]) as t(l, i, h)
      on conflict (level, idx) do update set hashes = excluded.hashes`.execute(trx);
  }
  await sql`update audit_tree_state set tree_size = ${done.treeSize}, last_seq = ${done.lastSeq},
    root_hash = ${done.rootHash} where id = 1`.execute(trx);
  await insertTreeCheckpoint(trx, done.treeSize, done.rootHash, done.note);
}

export async function insertTreeCheckpoint(
  db: Kysely<DB> | Transaction<DB>,
  treeSize: number,
  rootHash: Buffer,
  note: string,
): Promise<void> {
  await sql`insert into audit_tree_checkpoints (tree_size, root_hash, note) values (${treeSize}, ${rootHash}, ${note})
    on conflict (tree_size) do nothing`.execute(db);
}

/** Tiles by (level, index), keyed by `tileKey`. */
export async function readTiles(
  db: Kysely<DB> | Transaction<DB>,
  which: Array<{ level: number; index: number }>,
): Promise<Map<string, Buffer>> {
  if (which.length === 0) return new Map();
  const { rows } = await sql<{ level: number; idx: string; hashes: Buffer }>`
    select t.level, t.idx, t.hashes from audit_tree_tiles t
    join unnest(${which.map((w) => w.level)}::smallint[], ${which.map((w) => String(w.index))}::bigint[]) as w(l, i)
      on t.level = w.l and t.idx = w.i`.execute(db);
  return new Map(rows.map((row) => [tileKey(row.level, Number(row.idx)), row.hashes]));
}

export interface StoredCheckpoint {
  treeSize: number;
  rootHash: Buffer;
  note: string;
  publishedAt: Date;
}

/** The checkpoint of that size, or the latest. */
export async function findTreeCheckpoint(
  db: Kysely<DB> | Transaction<DB>,
  treeSize?: number,
): Promise<StoredCheckpoint | undefined> {
  let query = db.selectFrom('audit_tree_checkpoints').select(['tree_size', 'root_hash', 'note', 'published_at']);
  query =
    treeSize === undefined
      ? query.orderBy('tree_size', 'desc').limit(1)
      : query.where('tree_size', '=', String(treeSize) as never);
  const row = await query.executeTakeFirst();
  return row === undefined
    ? undefined
    : { treeSize: Number(row.tree_size), rootHash: row.root_hash, note: row.note, publishedAt: row.published_at };
}

/** Where records sit in the tree, by event id (absent: not sequenced yet). */
export async function findLeaves(
  db: Kysely<DB> | Transaction<DB>,
  eventIds: string[],
): Promise<Map<string, { leafIndex: number; seq: number }>> {
  if (eventIds.length === 0) return new Map();
  const rows = await db
    .selectFrom('audit_leaves')
    .select(['leaf_index', 'seq', 'event_id'])
    .where('event_id', 'in', eventIds)
    .execute();
  return new Map(rows.map((row) => [row.event_id, { leafIndex: Number(row.leaf_index), seq: Number(row.seq) }]));
}

/** The seqs of leaves `from` … `to − 1`, in leaf order. */
export async function leafSeqs(db: Kysely<DB> | Transaction<DB>, from: number, to: number): Promise<number[]> {
  const rows = await db
    .selectFrom('audit_leaves')
    .select(['leaf_index', 'seq'])
    .where('leaf_index', '>=', String(from) as never)
    .where('leaf_index', '<', String(to) as never)
    .orderBy('leaf_index')
    .execute();
  return rows.map((row) => Number(row.seq));
}

/** The seqs of the records at these leaves, in the order asked (undefined where there is no such leaf). */
export async function leafSeqsAt(
  db: Kysely<DB> | Transaction<DB>,
  ...indexes: number[]
): Promise<Array<number | undefined>> {
  const rows = await db
    .selectFrom('audit_leaves')
    .select(['leaf_index', 'seq'])
    .where(
      'leaf_index',
      'in',
      indexes.map((index) => String(index) as never),
    )
    .execute();
  const seqs = new Map(rows.map((row) => [Number(row.leaf_index), Number(row.seq)]));
  return indexes.map((index) => seqs.get(index));
}

/** The seq of a record not sequenced yet (no leaf is it), by its id. */
export async function unsequencedSeqOf(db: Kysely<DB>, eventId: string): Promise<number | undefined> {
  const row = await db
    .selectFrom('audit_events')
    .select('seq')
    .where('event_id', '=', eventId)
    .where(({ not, exists, selectFrom }) =>
      not(exists(selectFrom('audit_leaves').select('leaf_index').where('audit_leaves.event_id', '=', eventId))),
    )
    .executeTakeFirst();
  return row === undefined ? undefined : Number(row.seq);
}

/** Where the linear chain stands: its last seq, and whether it is closed (records are leaves only since). */
export async function readChainEnd(trx: Kysely<DB> | Transaction<DB>): Promise<{ seq: number; closed: boolean }> {
  const row = await trx
    .selectFrom('audit_chain_head')
    .select(['seq', 'closed'])
    .where('id', '=', 1)
    .executeTakeFirstOrThrow();
  return { seq: Number(row.seq), closed: row.closed };
}

/**
 * Takes the lowest seqs of leaf records waiting to be sequenced, in this transaction: they are gone from the queue
 * exactly when the leaves made of them commit.
 */
export async function takeUnsequenced(trx: Transaction<DB>, limit: number): Promise<number[]> {
  const { rows } = await sql<{ seq: string }>`
    delete from audit_unsequenced where seq in (select seq from audit_unsequenced order by seq limit ${limit})
    returning seq`.execute(trx);
  return rows.map((row) => Number(row.seq)).sort((a, b) => a - b);
}

/** The seqs of a run's records, in order; with `agentId`, only if they are that agent's. */
export async function runRecordSeqs(
  db: Kysely<DB>,
  tenantId: string,
  runId: string,
  agentId?: string,
): Promise<number[]> {
  let query = db.selectFrom('audit_events').select('seq').where('run_id', '=', runId).where('tenant_id', '=', tenantId);
  if (agentId !== undefined) query = query.where('agent_id', '=', agentId);
  const rows = await query.orderBy('seq').execute();
  return rows.map((row) => Number(row.seq));
}

/** The ids of the records at these seqs. */
export async function eventIdsAt(db: Kysely<DB>, seqs: number[]): Promise<Map<number, string>> {
  if (seqs.length === 0) return new Map();
  const rows = await db
    .selectFrom('audit_events')
    .select(['seq', 'event_id'])
    .where(
      'seq',
      'in',
      seqs.map((seq) => String(seq)),
    )
    .execute();
  return new Map(rows.map((row) => [Number(row.seq), row.event_id]));
}
