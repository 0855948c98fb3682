import { sql, type Kysely, type Transaction } from 'kysely';
import type { DB } from '../db/schema.js';
import { chargesJson, chargesOf, type CounterRef } from './budget-counter-repository.js';
import { fromMicros, toMicros, type Micros } from './budget-units.js';

/** An open reservation, or an expired one (its call may yet settle late), and the counters it is charged to. */
export interface OpenReservation {
  id: string;
  unitsMicros: Micros;
  /** Its units were given back at its TTL: only what its call may yet cost is still to come. */
  expired: boolean;
  charges: CounterRef[];
}

/**
 * Locks, in id order, these tenants' open and expired (a late settlement may come) reservations charged to `refs`. A
 * settlement locks a reservation before its counters, so a transaction changing those counters calls this first.
 */
export async function lockOpenReservationsCharging(
  trx: Transaction<DB>,
  tenantIds: string[],
  refs: CounterRef[],
): Promise<OpenReservation[]> {
  if (refs.length === 0) return [];
  const rows = await openReservationsCharging(trx, tenantIds, refs)
    .select(['units', 'status', 'charges'])
    .orderBy('id')
    .forUpdate()
    .execute();
  return rows.map((row) => ({
    id: row.id,
    unitsMicros: toMicros(row.units),
    expired: row.status === 'expired',
    charges: chargesOf(row.charges),
  }));
}

/** The ids of the reservations `lockOpenReservationsCharging` would lock, read without locking them. */
export async function findOpenReservationsCharging(
  trx: Transaction<DB>,
  tenantIds: string[],
  refs: CounterRef[],
): Promise<string[]> {
  if (refs.length === 0) return [];
  return (await openReservationsCharging(trx, tenantIds, refs).execute()).map((row) => row.id);
}

function openReservationsCharging(trx: Transaction<DB>, tenantIds: string[], refs: CounterRef[]) {
  const tenants = [...new Set(tenantIds)];
  const charging = sql<boolean>`charges @> any(${refs.map((ref) => chargesJson([ref]))}::jsonb[])`;
  // Each by its index (the open ones, the expired ones of these tenants).
  return trx
    .selectFrom('budget_reservations')
    .select('id')
    .where('id', 'in', (eb) =>
      eb
        .selectFrom('budget_reservations')
        .select('id')
        .where('status', '=', sql.lit('reserved'))
        .where('tenant_id', 'in', tenants)
        .where(charging)
        .unionAll(
          eb
            .selectFrom('budget_reservations')
            .select('id')
            .where('status', '=', sql.lit('expired'))
            .where('tenant_id', 'in', tenants)
            .where(charging),
        ),
    )
    .where('status', 'in', ['reserved', 'expired']);
}

/** Changes the counters reservations (locked by `lockOpenReservationsCharging`) are charged to. */
export async function rechargeReservations(trx: Transaction<DB>, reservations: OpenReservation[]): Promise<void> {
  if (reservations.length === 0) return;
  await sql`
    update budget_reservations r set charges = v.charges
    from unnest(${reservations.map((r) => r.id)}::text[], ${reservations.map((r) => chargesJson(r.charges))}::jsonb[]) as v(id, charges)
    where r.id = v.id and r.status in ('reserved', 'expired')
  `.execute(trx);
}

/** An open reservation past its time to live. */
export interface ExpiredReservation {
  id: string;
  tenantId: string;
  agentId: string;
  runId: string;
  units: number;
  reservedAt: Date;
  expiresAt: Date;
}

/** Open reservations whose holder should long have settled them: its process is presumed gone. */
export async function findExpiredReservations(db: Kysely<DB>, now: Date, limit: number): Promise<ExpiredReservation[]> {
  const rows = await db
    .selectFrom('budget_reservations')
    .select(['id', 'tenant_id', 'agent_id', 'run_id', 'units', 'reserved_at', 'expires_at'])
    // A literal, not a parameter: the partial index of open reservations is used by the generic
    // plan the hot pools keep (with a parameter, it walked every reservation ever made).
    .where('status', '=', sql.lit('reserved'))
    .where('expires_at', '<=', now)
    .orderBy('expires_at')
    .limit(limit)
    .execute();
  return rows.map((row) => ({
    id: row.id,
    tenantId: row.tenant_id,
    agentId: row.agent_id,
    runId: row.run_id,
    units: fromMicros(toMicros(row.units)),
    reservedAt: new Date(row.reserved_at),
    expiresAt: new Date(row.expires_at),
  }));
}
