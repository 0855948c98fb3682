import { sql, type Kysely, type Transaction } from 'kysely';
import type { DB } from '../db/schema.js';
import type { Budget, ChargeSubject } from './budget.js';
import { toBudget } from './budget-repository.js';
import { fromMicros, toMicros, type Micros } from './budget-units.js';
import type { CounterLevel } from './budget-verdict.js';

/** One counter: a budget's (or a run's) period window. */
export interface CounterRef {
  key: string;
  periodStart: Date;
}

/** How counters are named in maps: key and window start. */
export function counterId(ref: CounterRef): string {
  return `${ref.key}@${ref.periodStart.toISOString()}`;
}

const microsText = (micros: Micros) => fromMicros(micros).toFixed(6);

/** Live budgets that may apply to any of these subjects (callers filter per subject). */
export async function findBudgetsFor(db: Kysely<DB>, subjects: ChargeSubject[]): Promise<Budget[]> {
  if (subjects.length === 0) return [];
  const tenants = [...new Set(subjects.map((s) => s.tenantId))];
  const agents = [...new Set(subjects.map((s) => s.agentId))];
  const runs = [...new Set(subjects.map((s) => s.runId))];
  const rows = await db
    .selectFrom('budgets')
    .selectAll()
    .where('removed_at', 'is', null)
    .where('tenant_id', 'in', tenants)
    .where((eb) =>
      eb.or([
        eb('scope', '=', 'tenant'),
        eb.and([eb('scope', '=', 'agent'), eb('agent_id', 'in', agents)]),
        eb.and([eb('scope', '=', 'run'), eb('run_id', 'in', runs)]),
      ]),
    )
    .execute();
  return rows.map(toBudget);
}

/**
 * Locks the given counters, creating empty ones as needed, and returns what they hold. Rows are
 * locked in (counter_key, period_start) order, the order every writer uses, so concurrent
 * transactions on any replica queue behind each other instead of deadlocking.
 */
export async function lockCounters(trx: Transaction<DB>, refs: CounterRef[]): Promise<Map<string, CounterLevel>> {
  const unique = [...new Map(refs.map((ref) => [counterId(ref), ref])).values()];
  if (unique.length === 0) return new Map();
  const result = await sql<{ counter_key: string; period_start: Date; spent_units: string; reserved_units: string }>`
    insert into budget_counters (counter_key, period_start)
    select k, p from unnest(${unique.map((r) => r.key)}::text[], ${unique.map((r) => r.periodStart)}::timestamptz[]) as t(k, p)
    order by k, p
    on conflict (counter_key, period_start) do update set counter_key = excluded.counter_key
    returning counter_key, period_start, spent_units, reserved_units
  `.execute(trx);
  return levelsOf(result.rows);
}

/** What the counters hold, without locking them (dry runs and reads). */
export async function readCounters(db: Kysely<DB>, refs: CounterRef[]): Promise<Map<string, CounterLevel>> {
  if (refs.length === 0) return new Map();
  const result = await sql<{ counter_key: string; period_start: Date; spent_units: string; reserved_units: string }>`
    select c.counter_key, c.period_start, c.spent_units, c.reserved_units
    from budget_counters c
    join unnest(${refs.map((r) => r.key)}::text[], ${refs.map((r) => r.periodStart)}::timestamptz[]) as t(k, p)
      on c.counter_key = t.k and c.period_start = t.p
  `.execute(db);
  return levelsOf(result.rows);
}

function levelsOf(rows: Array<{ counter_key: string; period_start: Date; spent_units: string; reserved_units: string }>): Map<string, CounterLevel> {
  return new Map(
    rows.map((row) => [
      counterId({ key: row.counter_key, periodStart: new Date(row.period_start) }),
      { spentMicros: toMicros(row.spent_units), reservedMicros: toMicros(row.reserved_units) },
    ]),
  );
}

export interface CounterDelta extends CounterRef {
  spentMicros: Micros;
  reservedMicros: Micros;
}

/** Adds the deltas to counters this transaction has locked. */
export async function addToCounters(trx: Transaction<DB>, deltas: CounterDelta[]): Promise<void> {
  const changed = deltas.filter((d) => d.spentMicros !== 0 || d.reservedMicros !== 0);
  if (changed.length === 0) return;
  await sql`
    update budget_counters c
    set spent_units = c.spent_units + d.spent, reserved_units = c.reserved_units + d.reserved
    from unnest(
      ${changed.map((d) => d.key)}::text[],
      ${changed.map((d) => d.periodStart)}::timestamptz[],
      ${changed.map((d) => microsText(d.spentMicros))}::numeric[],
      ${changed.map((d) => microsText(d.reservedMicros))}::numeric[]
    ) as d(k, p, spent, reserved)
    where c.counter_key = d.k and c.period_start = d.p
  `.execute(trx);
}

export interface NewReservation extends ChargeSubject {
  id: string;
  unitsMicros: Micros;
  charges: CounterRef[];
  reservedAt: Date;
  expiresAt: Date;
}

export async function insertReservations(trx: Transaction<DB>, reservations: NewReservation[]): Promise<void> {
  if (reservations.length === 0) return;
  await trx
    .insertInto('budget_reservations')
    .values(
      reservations.map((r) => ({
        id: r.id,
        tenant_id: r.tenantId,
        agent_id: r.agentId,
        run_id: r.runId,
        units: microsText(r.unitsMicros),
        actual_units: null,
        status: 'reserved',
        charges: JSON.stringify(r.charges.map((c) => ({ counter_key: c.key, period_start: c.periodStart.toISOString() }))),
        reserved_at: r.reservedAt,
        expires_at: r.expiresAt,
      })),
    )
    .execute();
}

export type ClosedStatus = 'settled' | 'released' | 'expired';

export interface ReservationClose {
  id: string;
  status: ClosedStatus;
  /** Settled only: what the call actually cost. */
  actualMicros: Micros | null;
}

export interface ClosedReservation {
  id: string;
  unitsMicros: Micros;
  charges: CounterRef[];
}

/**
 * Closes reservations that are still open and returns them; one already settled, released or
 * expired is left alone and not returned, so settling twice never counts twice.
 */
export async function closeReservations(trx: Transaction<DB>, closes: ReservationClose[], at: Date): Promise<ClosedReservation[]> {
  const unique = [...new Map(closes.map((c) => [c.id, c])).values()].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  if (unique.length === 0) return [];
  const result = await sql<{ id: string; units: string; charges: Array<{ counter_key: string; period_start: string }> }>`
    update budget_reservations r
    set status = v.status, actual_units = v.actual, closed_at = ${at}
    from unnest(
      ${unique.map((c) => c.id)}::text[],
      ${unique.map((c) => c.status)}::text[],
      ${unique.map((c) => (c.actualMicros === null ? null : microsText(c.actualMicros)))}::numeric[]
    ) as v(id, status, actual)
    where r.id = v.id and r.status = 'reserved'
    returning r.id, r.units, r.charges
  `.execute(trx);
  return result.rows.map((row) => ({
    id: row.id,
    unitsMicros: toMicros(row.units),
    charges: row.charges.map((c) => ({ key: c.counter_key, periodStart: new Date(c.period_start) })),
  }));
}

/** Open reservations whose holder should long have settled them: its process is presumed gone. */
export async function findExpiredReservations(db: Kysely<DB>, now: Date, limit: number): Promise<string[]> {
  const rows = await db
    .selectFrom('budget_reservations')
    .select('id')
    .where('status', '=', 'reserved')
    .where('expires_at', '<=', now)
    .orderBy('expires_at')
    .limit(limit)
    .execute();
  return rows.map((row) => row.id);
}
