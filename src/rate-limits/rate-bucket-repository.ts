import { sql, type Kysely, type RawBuilder, type Transaction } from 'kysely';
import type { DB } from '../db/schema.js';
import type { BucketState } from './token-bucket.js';

/** Whose bucket: one per (tenant, agent, tool). */
export interface BucketKey {
  tenantId: string;
  agentId: string;
  toolId: string;
}

/** A bucket's key as one string, for maps. */
export function bucketId(key: BucketKey): string {
  return JSON.stringify([key.tenantId, key.agentId, key.toolId]);
}

/** A bucket at the level a decision was made from. */
export interface BucketAt extends BucketKey, BucketState {}

/**
 * Whether a bucket still holds exactly the level a refusal was decided from (no take, give-back or reset since: the
 * refill is a function of that level and the time), as SQL another statement joins.
 */
export function bucketStillAt(
  tenantId: RawBuilder<unknown>,
  agentId: RawBuilder<unknown>,
  toolId: RawBuilder<unknown>,
  tokens: RawBuilder<unknown>,
  updatedAt: RawBuilder<unknown>,
): RawBuilder<boolean> {
  return sql<boolean>`exists (
    select 1 from rate_buckets b
    where b.tenant_id = ${tenantId} and b.agent_id = ${agentId} and b.tool_id = ${toolId}
      and b.tokens = ${tokens} and b.updated_at = ${updatedAt})`;
}

interface BucketRow {
  tenant_id: string;
  agent_id: string;
  tool_id: string;
  tokens: number;
  updated_at: Date;
}

function toState(row: Pick<BucketRow, 'tokens' | 'updated_at'>): BucketState {
  return { tokens: Number(row.tokens), updatedAtMs: new Date(row.updated_at).getTime() };
}

type Db = Kysely<DB> | Transaction<DB>;

/**
 * Locks the buckets, creating missing ones in the state given, and returns their levels. Rows
 * are locked in key order, the order every replica uses, so batches queue instead of deadlocking.
 * Outside a transaction it only reads the levels (creating missing buckets).
 */
export async function lockBuckets(
  trx: Db,
  buckets: Array<{ key: BucketKey; initial: BucketState }>,
): Promise<Map<string, BucketState>> {
  const unique = [...new Map(buckets.map((b) => [bucketId(b.key), b])).values()];
  if (unique.length === 0) return new Map();
  const result = await sql<BucketRow>`
    insert into rate_buckets (tenant_id, agent_id, tool_id, tokens, updated_at)
    select t, a, k, n, u
    from unnest(
      ${unique.map((b) => b.key.tenantId)}::text[],
      ${unique.map((b) => b.key.agentId)}::text[],
      ${unique.map((b) => b.key.toolId)}::text[],
      ${unique.map((b) => b.initial.tokens)}::float8[],
      ${unique.map((b) => new Date(b.initial.updatedAtMs))}::timestamptz[]
    ) as v(t, a, k, n, u)
    order by t, a, k
    on conflict (tenant_id, agent_id, tool_id) do update set tokens = rate_buckets.tokens
    returning tenant_id, agent_id, tool_id, tokens, updated_at
  `.execute(trx);
  return new Map(
    result.rows.map((row) => [
      bucketId({ tenantId: row.tenant_id, agentId: row.agent_id, toolId: row.tool_id }),
      toState(row),
    ]),
  );
}

/** A bucket's stored level without locking it; undefined if it was never used. */
export async function readBucket(db: Kysely<DB>, key: BucketKey): Promise<BucketState | undefined> {
  const row = await db
    .selectFrom('rate_buckets')
    .selectAll()
    .where('tenant_id', '=', key.tenantId)
    .where('agent_id', '=', key.agentId)
    .where('tool_id', '=', key.toolId)
    .executeTakeFirst();
  return row ? toState(row) : undefined;
}

/**
 * Stores a bucket's new level only if it still holds `expected`, in one statement; otherwise answers the level it holds
 * now, read under its lock, to decide again from (`current` is missing only for a bucket that does not exist).
 */
export async function storeBucketIf(
  db: Kysely<DB>,
  key: BucketKey,
  expected: BucketState,
  next: BucketState,
): Promise<{ ok: true } | { ok: false; current?: BucketState }> {
  // `current` locks the row and reads it as it stands (a plain read would see it as it stood
  // when the statement began); the update compares the row's own columns, on its newest version.
  const result = await sql<{ stored: number; tokens: number; updated_at: Date }>`
    with current as materialized (
      select tokens, updated_at from rate_buckets
      where tenant_id = ${key.tenantId} and agent_id = ${key.agentId} and tool_id = ${key.toolId}
      for no key update
    ), stored as (
      update rate_buckets b set tokens = ${next.tokens}, updated_at = ${new Date(next.updatedAtMs)}
      from current c
      where b.tenant_id = ${key.tenantId} and b.agent_id = ${key.agentId} and b.tool_id = ${key.toolId}
        and b.tokens = ${expected.tokens} and b.updated_at = ${new Date(expected.updatedAtMs)}
      returning 1
    )
    select (select count(*)::int from stored) as stored, c.tokens, c.updated_at from current c`.execute(db);
  const row = result.rows[0];
  if (!row) return { ok: false };
  if (Number(row.stored) === 1) return { ok: true };
  return { ok: false, current: toState(row) };
}

/** Stores new levels of buckets this transaction has locked. */
export async function storeBuckets(
  trx: Transaction<DB>,
  buckets: Array<{ key: BucketKey; state: BucketState }>,
): Promise<void> {
  if (buckets.length === 0) return;
  await sql`
    update rate_buckets b set tokens = v.n, updated_at = v.u
    from unnest(
      ${buckets.map((b) => b.key.tenantId)}::text[],
      ${buckets.map((b) => b.key.agentId)}::text[],
      ${buckets.map((b) => b.key.toolId)}::text[],
      ${buckets.map((b) => b.state.tokens)}::float8[],
      ${buckets.map((b) => new Date(b.state.updatedAtMs))}::timestamptz[]
    ) as v(t, a, k, n, u)
    where b.tenant_id = v.t and b.agent_id = v.a and b.tool_id = v.k
  `.execute(trx);
}

/**
 * Gives leased tokens back, never past `capacity`, in one statement locking rows in one order (replicas closing
 * together queue). The server cancels it after `timeoutMs`, so it cannot hold a closing replica's pool.
 */
export async function returnTokens(
  db: Kysely<DB>,
  returns: Array<{ key: BucketKey; tokens: number; capacity: number }>,
  timeoutMs: number,
): Promise<void> {
  if (returns.length === 0) return;
  const ordered = [...returns].sort((x, y) => (bucketId(x.key) < bucketId(y.key) ? -1 : 1));
  await db.transaction().execute(async (trx) => {
    await sql`select set_config('statement_timeout', ${String(Math.ceil(timeoutMs))}, true)`.execute(trx);
    await sql`
      update rate_buckets b set tokens = least(v.c, b.tokens + v.n)
      from unnest(
        ${ordered.map((r) => r.key.tenantId)}::text[],
        ${ordered.map((r) => r.key.agentId)}::text[],
        ${ordered.map((r) => r.key.toolId)}::text[],
        ${ordered.map((r) => r.tokens)}::float8[],
        ${ordered.map((r) => r.capacity)}::float8[]
      ) as v(t, a, k, n, c)
      where b.tenant_id = v.t and b.agent_id = v.a and b.tool_id = v.k and b.tokens < v.c
    `.execute(trx);
  });
}
