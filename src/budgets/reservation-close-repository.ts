import { sql, type Kysely, type RawBuilder, type Transaction } from 'kysely';
import { findRecordedCosts } from '../audit/audit-listing.js';
import type { DB } from '../db/schema.js';
import { levelsOf, microsText, type CounterRow } from './budget-counter-repository.js';
import { toMicros, type Micros } from './budget-units.js';
import type { CounterLevel } from './budget-verdict.js';

/** How a reservation ends: settled after a call, released unused, or expired (its holder died). */
export type ClosedStatus = 'settled' | 'released' | 'expired';

/** A request to close one reservation. */
export interface ReservationClose {
  id: string;
  status: ClosedStatus;
  /** Settled only: what the call actually cost. */
  actualMicros: Micros | null;
}

/**
 * Closes open reservations, giving back what they held and charging what settled calls cost; a closed one is left alone
 * (never counted twice), an expired one is still charged, once. One changed meanwhile (a hand-off recharged it) is
 * closed by one more statement: docs/design/budget-ledger.md#counters-in-postgresql-decisions-in-batches.
 */
export async function closeAndUncharge(
  db: Kysely<DB>,
  closes: ReservationClose[],
  at: Date,
): Promise<{ closed: Set<string>; late: Set<string>; levels: Map<string, CounterLevel> }> {
  const closed = new Set<string>();
  const late = new Set<string>();
  const levels = new Map<string, CounterLevel>();
  let pending = firstCloses(closes);
  // Each pass that misses one follows a change committed meanwhile: a few hand-offs ending at most.
  for (let pass = 0; pass < CLOSE_PASSES && pending.length > 0; pass += 1) {
    const result = await closeOnce(db, pending, at);
    for (const id of result.closed) closed.add(id);
    for (const id of result.late) late.add(id);
    for (const [id, level] of result.levels) levels.set(id, level);
    pending = pending.filter((close) => result.changed.has(close.id));
  }
  return { closed, late, levels };
}

/** How many statements `closeAndUncharge` sends at most for reservations changed under it. */
const CLOSE_PASSES = 8;

/** One statement of `closeAndUncharge`; `changed`: the ids it missed because they had changed since its snapshot. */
async function closeOnce(db: Kysely<DB>, unique: ReservationClose[], at: Date): Promise<Closed> {
  const result = await sql<{ closes: ClosesRow }>`
    with ${closeSteps(unique, at)}
    select ${closesChanged} as closes`.execute(db);
  return closedOf(result.rows[0]?.closes);
}

/** What one statement closing reservations did: see `closeOnce`. */
export interface Closed {
  closed: Set<string>;
  late: Set<string>;
  changed: Set<string>;
  levels: Map<string, CounterLevel>;
}

/**
 * The CTEs that close `unique` (one close per id, in id order), for a statement of their own or another room's (a
 * call's outcome record, which the settlement rides): they lock each reservation, then its counters in key order.
 * `when` is a condition of that statement's; unless it holds, nothing is closed.
 */
export function closeSteps(unique: ReservationClose[], at: Date, when?: RawBuilder<unknown>): RawBuilder<unknown> {
  return sql`settle_seen as materialized (
      select v.id, v.status, v.actual, open.row_version, open.was
      from unnest(
        ${unique.map((c) => c.id)}::text[],
        ${unique.map((c) => c.status)}::text[],
        ${unique.map((c) => (c.actualMicros === null ? null : microsText(c.actualMicros)))}::numeric[]
      ) as v(id, status, actual)
      cross join lateral (select b.ctid as row_version, b.status as was from budget_reservations b where b.id = v.id limit 1) open
      where ${when ?? sql`true`}
    ),
    settle_closed as (
      update budget_reservations r
      set status = s.status, actual_units = s.actual, closed_at = ${at}
      from settle_seen s
      where r.ctid = s.row_version and (r.status = 'reserved' or (r.status = 'expired' and s.status = 'settled'))
      returning r.id, r.units, r.charges, s.actual, s.was
    ),
    settle_given_back as (
      select c ->> 'counter_key' as k, (c ->> 'period_start')::timestamptz as p,
             sum(coalesce(closed.actual, 0)) as add_spent,
             -sum(case closed.was when 'reserved' then closed.units else 0 end) as add_reserved
      from settle_closed closed cross join lateral jsonb_array_elements(closed.charges) as c
      group by 1, 2
    ),
    settle_locked as materialized (
      select c.counter_key, c.period_start
      from budget_counters c join settle_given_back g on c.counter_key = g.k and c.period_start = g.p
      where c.counter_key = any(array(select k from settle_given_back))
      order by c.counter_key, c.period_start
      for no key update of c
    ),
    settle_counters as (
      update budget_counters c
      set spent_units = c.spent_units + g.add_spent, reserved_units = c.reserved_units + g.add_reserved
      from settle_given_back g join settle_locked l on l.counter_key = g.k and l.period_start = g.p
      where c.counter_key = g.k and c.period_start = g.p and c.counter_key = any(array(select k from settle_given_back))
      returning c.counter_key, c.period_start, c.spent_units, c.reserved_units
    )`;
}

/** A scalar of the statement `closeSteps` joins: what it closed (a `ClosesRow`), for `closedOf`. */
export const closesChanged = sql`json_build_object(
      'closed', (select coalesce(json_agg(json_build_array(id, was)), '[]') from settle_closed),
      -- Open (or, to settle, expired) in this statement's snapshot, yet not closed: changed since.
      'changed', (select coalesce(json_agg(s.id), '[]') from settle_seen s
                  where (s.was = 'reserved' or (s.was = 'expired' and s.status = 'settled'))
                    and s.id not in (select id from settle_closed)),
      'levels', (select coalesce(json_agg(json_build_object('counter_key', c.counter_key, 'period_start', c.period_start,
                   'spent_units', c.spent_units::text, 'reserved_units', c.reserved_units::text)), '[]')
                 from settle_counters c))`;

/** The JSON `closesChanged` answers. */
export interface ClosesRow {
  closed: Array<[string, string]>;
  changed: string[];
  levels: CounterRow[];
}

/** What a statement joining `closeSteps` closed, from its `closesChanged`. */
export function closedOf(row: ClosesRow | null | undefined): Closed {
  const closed = new Set<string>();
  const late = new Set<string>();
  for (const [id, was] of row?.closed ?? []) {
    closed.add(id);
    if (was === 'expired') late.add(id);
  }
  return { closed, late, changed: new Set(row?.changed ?? []), levels: levelsOf(row?.levels ?? []) };
}

/**
 * Closes a lost run's open reservations, in the caller's transaction: charged what a recorded outcome says, else at
 * what they reserved (`charge`) or released (`release`): docs/design/run-recovery.md. Answers how many it closed.
 */
export async function closeLostRunReservations(
  trx: Transaction<DB>,
  tenantId: string,
  runId: string,
  mode: 'charge' | 'release',
  at: Date,
): Promise<number> {
  const open = await trx
    .selectFrom('budget_reservations')
    .select(['id', 'units'])
    .where('tenant_id', '=', tenantId)
    .where('run_id', '=', runId)
    .where('status', '=', 'reserved')
    .execute();
  if (open.length === 0) return 0;
  const recorded = await findRecordedCosts(
    trx,
    open.map((r) => ({ id: r.id, tenantId, runId })),
  );
  const closes: ReservationClose[] = open.map((r) => {
    const cost = recorded.get(r.id);
    if (cost) return { id: r.id, status: 'settled', actualMicros: toMicros(cost.costUnits) };
    return mode === 'charge'
      ? { id: r.id, status: 'settled', actualMicros: toMicros(r.units) }
      : { id: r.id, status: 'released', actualMicros: null };
  });
  return (await closeAndUncharge(trx, closes, at)).closed.size;
}

/** The first close of each id, in id order (the order rows are locked in). */
export function firstCloses(closes: ReservationClose[]): ReservationClose[] {
  const first = new Map<string, ReservationClose>();
  for (const close of closes) if (!first.has(close.id)) first.set(close.id, close);
  return [...first.values()].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
}
