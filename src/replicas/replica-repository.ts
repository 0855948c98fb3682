import { sql, type Kysely } from 'kysely';
import type { DB } from '../db/schema.js';

/** A gateway process as it registers itself. */
export interface ReplicaIdentity {
  id: string;
  hostname: string;
  pid: number;
}

/**
 * Registers the replica or renews its lease: it holds until `leaseMs` from now, database time
 * (so replicas' clocks never disagree about it).
 */
export async function renewReplica(db: Kysely<DB>, replica: ReplicaIdentity, leaseMs: number): Promise<void> {
  await sql`
    insert into replicas (id, hostname, pid, expires_at)
    values (${replica.id}, ${replica.hostname}, ${replica.pid}, now() + make_interval(secs => ${leaseMs / 1000}))
    on conflict (id) do update set renewed_at = now(), expires_at = excluded.expires_at`.execute(db);
}

/**
 * A replica stopping cleanly gives its lease up: nothing it held is busy any more. The server
 * cancels it after `timeoutMs` (its row held by another transaction, a slow server), so that it
 * does not go on holding a connection the closing replica's pool waits for.
 */
export async function removeReplica(db: Kysely<DB>, id: string, timeoutMs: number): Promise<void> {
  await db.transaction().execute(async (trx) => {
    await sql`select set_config('statement_timeout', ${String(Math.ceil(timeoutMs))}, true)`.execute(trx);
    await trx.deleteFrom('replicas').where('id', '=', id).execute();
  });
}
