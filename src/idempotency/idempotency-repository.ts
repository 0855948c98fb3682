import type { Kysely, Selectable } from 'kysely';
import type { DB, IdempotencyKeyTable } from '../db/schema.js';

/** Whose key it is: a key names one request of one caller, never another caller's. */
export interface KeyOwner {
  tenantId: string;
  actor: string;
  /** An operator's role, or `agent`: the same `sub` in another role is another caller. */
  role: string;
}

export type StoredKey = Selectable<IdempotencyKeyTable>;

/** Claims `key` for a request with this fingerprint; false when the key is already there. */
export async function claimKey(
  db: Kysely<DB>,
  owner: KeyOwner,
  key: string,
  fingerprint: string,
  at: Date,
): Promise<boolean> {
  const row = await db
    .insertInto('idempotency_keys')
    .values({ tenant_id: owner.tenantId, actor: owner.actor, role: owner.role, key, fingerprint, created_at: at })
    .onConflict((oc) => oc.doNothing())
    .returning('key')
    .executeTakeFirst();
  return row !== undefined;
}

export async function findKey(db: Kysely<DB>, owner: KeyOwner, key: string): Promise<StoredKey | undefined> {
  return db
    .selectFrom('idempotency_keys')
    .selectAll()
    .where('tenant_id', '=', owner.tenantId)
    .where('actor', '=', owner.actor)
    .where('role', '=', owner.role)
    .where('key', '=', key)
    .executeTakeFirst();
}

/**
 * Takes over a claim whose request never finished (its replica died mid-request): only if it is
 * still the claim made at `claimedAt`, so that two retries cannot both take it.
 */
export async function takeOverKey(
  db: Kysely<DB>,
  owner: KeyOwner,
  key: string,
  claimedAt: Date,
  at: Date,
): Promise<boolean> {
  const row = await db
    .updateTable('idempotency_keys')
    .set({ created_at: at })
    .where('tenant_id', '=', owner.tenantId)
    .where('actor', '=', owner.actor)
    .where('role', '=', owner.role)
    .where('key', '=', key)
    .where('status_code', 'is', null)
    .where('created_at', '=', claimedAt)
    .returning('key')
    .executeTakeFirst();
  return row !== undefined;
}

/** Keeps the answer of the request that claimed the key. */
export async function completeKey(
  db: Kysely<DB>,
  owner: KeyOwner,
  key: string,
  answer: { statusCode: number; body: string },
  at: Date,
): Promise<void> {
  await db
    .updateTable('idempotency_keys')
    .set({ status_code: answer.statusCode, response: answer.body, completed_at: at })
    .where('tenant_id', '=', owner.tenantId)
    .where('actor', '=', owner.actor)
    .where('role', '=', owner.role)
    .where('key', '=', key)
    .where('status_code', 'is', null)
    .execute();
}

/** Gives a claim up (its request was refused or failed): a retry runs the request again. */
export async function releaseKey(db: Kysely<DB>, owner: KeyOwner, key: string): Promise<void> {
  await db
    .deleteFrom('idempotency_keys')
    .where('tenant_id', '=', owner.tenantId)
    .where('actor', '=', owner.actor)
    .where('role', '=', owner.role)
    .where('key', '=', key)
    .where('status_code', 'is', null)
    .execute();
}

/** Deletes the keys claimed before `before`; answers how many. */
export async function deleteKeysBefore(db: Kysely<DB>, before: Date): Promise<number> {
  const result = await db.deleteFrom('idempotency_keys').where('created_at', '<', before).executeTakeFirst();
  return Number(result.numDeletedRows);
}
