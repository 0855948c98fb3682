import type { Kysely, Selectable, Transaction } from 'kysely';
import type { AuditCheckpointTable, DB } from '../db/schema.js';
import type { Checkpoint } from './checkpoint-signer.js';

function toCheckpoint(row: Selectable<AuditCheckpointTable>): Checkpoint {
  return {
    id: row.id,
    seq: Number(row.seq),
    hash: row.hash,
    at: new Date(row.at).toISOString(),
    key_id: row.key_id,
    signature: row.signature,
    created_by: row.created_by,
    ...(row.leaf_index === null ? {} : { leaf_index: Number(row.leaf_index) }),
  };
}

export async function insertCheckpoint(trx: Transaction<DB>, checkpoint: Checkpoint): Promise<void> {
  await trx
    .insertInto('audit_checkpoints')
    .values({ ...checkpoint, at: new Date(checkpoint.at) })
    .execute();
}

export async function findCheckpoint(db: Kysely<DB>, id: string): Promise<Checkpoint | undefined> {
  const row = await db.selectFrom('audit_checkpoints').selectAll().where('id', '=', id).executeTakeFirst();
  return row === undefined ? undefined : toCheckpoint(row);
}

/**
 * Checkpoints newest first (by seq, then id), `limit` a page, after the cursor's `(seq, id)`; with
 * `chainOnly`, those of the chain, without the seals of leaves.
 */
export async function listCheckpoints(
  db: Kysely<DB>,
  query: { limit: number; before?: { seq: number; id: string } | undefined; chainOnly?: boolean },
): Promise<{ items: Checkpoint[]; next: { seq: number; id: string } | null }> {
  let q = db.selectFrom('audit_checkpoints').selectAll();
  if (query.chainOnly === true) q = q.where('leaf_index', 'is', null);
  const before = query.before;
  if (before !== undefined) {
    q = q.where((eb) =>
      eb.or([
        eb('seq', '<', String(before.seq)),
        eb.and([eb('seq', '=', String(before.seq)), eb('id', '<', before.id)]),
      ]),
    );
  }
  const rows = await q
    .orderBy('seq', 'desc')
    .orderBy('id', 'desc')
    .limit(query.limit + 1)
    .execute();
  const items = rows.slice(0, query.limit).map(toCheckpoint);
  const last = items[items.length - 1];
  return { items, next: rows.length > query.limit && last ? { seq: last.seq, id: last.id } : null };
}

/** The chain's newest checkpoints first (at or below `atMost`), a page at a time: where an incremental verification may start. */
export async function* checkpointsNewestFirst(db: Kysely<DB>, atMost?: number): AsyncGenerator<Checkpoint> {
  // No id sorts below '': the first page is every checkpoint at or below `atMost`.
  let before: { seq: number; id: string } | undefined = atMost === undefined ? undefined : { seq: atMost + 1, id: '' };
  for (;;) {
    const page = await listCheckpoints(db, { limit: 100, before, chainOnly: true });
    yield* page.items;
    if (page.next === null) return;
    before = page.next;
  }
}

/** The chain's checkpoints recorded at exactly `seq`. */
export async function checkpointsAt(db: Kysely<DB>, seq: number): Promise<Checkpoint[]> {
  const rows = await db
    .selectFrom('audit_checkpoints')
    .selectAll()
    .where('seq', '=', String(seq))
    .where('leaf_index', 'is', null)
    .orderBy('id')
    .execute();
  return rows.map(toCheckpoint);
}

/** The seals recorded at exactly the leaf `leafIndex`. */
export async function sealsAtLeaf(db: Kysely<DB>, leafIndex: number): Promise<Checkpoint[]> {
  const rows = await db
    .selectFrom('audit_checkpoints')
    .selectAll()
    .where('leaf_index', '=', String(leafIndex))
    .orderBy('id')
    .execute();
  return rows.map(toCheckpoint);
}
