import { sql, type Kysely, type RawBuilder, type Selectable, type Transaction } from 'kysely';
import type { BudgetTable, DB } from '../db/schema.js';
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

/** The counter a `counterId` names (the key may hold '@'; the window start never does). */
export function counterRefOf(id: string): CounterRef {
  const at = id.lastIndexOf('@');
  return { key: id.slice(0, at), periodStart: new Date(id.slice(at + 1)) };
}

export const microsText = (micros: Micros) => fromMicros(micros).toFixed(6);

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

/** The windows a batch decided at one instant charges: today, this month, and all time. */
export interface Windows {
  day: Date;
  month: Date;
  total: Date;
}

/**
 * The live budgets that may apply to these subjects (callers filter), with their current windows' counters plus `extra`
 * locked in key order, as every writer locks them (docs/design/lock-order.md); missing counters are created empty.
 */
export function lockBudgetCounters(
  trx: Transaction<DB>,
  subjects: ChargeSubject[],
  windows: Windows,
  extra: CounterRef[],
): Promise<{ budgets: Budget[]; levels: Map<string, CounterLevel> }> {
  return budgetsAndCounters(
    trx,
    subjects,
    windows,
    extra,
    sql`
    levels as (
      insert into budget_counters (counter_key, period_start)
      select k, p from wanted order by k, p
      on conflict (counter_key, period_start) do update set counter_key = excluded.counter_key
      returning counter_key, period_start, spent_units, reserved_units
    )`,
  );
}

/**
 * `lockBudgetCounters` without the locks. A counter another writer creates meanwhile may be missing from the answer;
 * `writeLedgerIf` then finds it changed.
 */
export function readBudgetCounters(
  db: Kysely<DB>,
  subjects: ChargeSubject[],
  windows: Windows,
  extra: CounterRef[],
): Promise<{ budgets: Budget[]; levels: Map<string, CounterLevel> }> {
  return budgetsAndCounters(
    db,
    subjects,
    windows,
    extra,
    sql`
    created as (
      insert into budget_counters (counter_key, period_start)
      select k, p from wanted order by k, p
      on conflict (counter_key, period_start) do nothing
      returning counter_key, period_start, spent_units, reserved_units
    ),
    levels as (
      select counter_key, period_start, spent_units, reserved_units from created
      union all
      select c.counter_key, c.period_start, c.spent_units, c.reserved_units
      from budget_counters c join wanted w on c.counter_key = w.k and c.period_start = w.p
      -- Keeps the probe on the primary key, however many rows the planner guesses "wanted" has.
      where c.counter_key = any(array(select k from wanted))
    )`,
  );
}

/**
 * The applicable budgets (`applicable`) and the counters wanted (`wanted`: their current windows
 * and `extra`), then `levels` as the caller defines it from those, joined back to the budgets.
 */
async function budgetsAndCounters(
  db: Kysely<DB> | Transaction<DB>,
  subjects: ChargeSubject[],
  windows: Windows,
  extra: CounterRef[],
  levels: RawBuilder<unknown>,
): Promise<{ budgets: Budget[]; levels: Map<string, CounterLevel> }> {
  const unique = [...new Map(extra.map((ref) => [counterId(ref), ref])).values()];
  const result = await sql<CounterRow & Partial<Selectable<BudgetTable>>>`
    with applicable as (
      select distinct on (b.id) b.* from ${liveBudgetsOf(subjects)}
    ),
    wanted as (
      select id as k,
             case period when 'day' then ${windows.day}::timestamptz when 'month' then ${windows.month}::timestamptz
                         else ${windows.total}::timestamptz end as p
      from applicable
      union
      select k, p from unnest(${unique.map((r) => r.key)}::text[], ${unique.map((r) => r.periodStart)}::timestamptz[]) as t(k, p)
    ),
    ${levels}
    select l.*, a.* from levels l left join applicable a on a.id = l.counter_key
  `.execute(db);
  const budgets = new Map<string, Budget>();
  for (const row of result.rows) {
    if (row.id !== null && row.id !== undefined) budgets.set(row.id, toBudget(row as Selectable<BudgetTable>));
  }
  return { budgets: [...budgets.values()], levels: levelsOf(result.rows) };
}

/**
 * `b`: each subject's live budgets (tenant, agent, run), probed by key in `budgets_one_live_per_subject` through a
 * lateral subquery, so a plan kept from an empty table cannot scan them all.
 * See docs/design/database-pools.md#why-two-kinds-of-planning.
 */
export function liveBudgetsOf(subjects: ChargeSubject[]): RawBuilder<unknown> {
  return sql`unnest(${subjects.map((s) => s.tenantId)}::text[], ${subjects.map((s) => s.agentId)}::text[], ${subjects.map((s) => s.runId)}::text[]) as s(t, a, r)
        cross join lateral (
          select * from budgets
          where removed_at is null and tenant_id = s.t and scope = 'tenant' and coalesce(agent_id, '') = '' and coalesce(run_id, '') = ''
          union all
          select * from budgets
          where removed_at is null and tenant_id = s.t and scope = 'agent' and coalesce(agent_id, '') = s.a and coalesce(run_id, '') = ''
          union all
          select * from budgets
          where removed_at is null and tenant_id = s.t and scope = 'run' and coalesce(agent_id, '') = '' and coalesce(run_id, '') = s.r
        ) b`;
}

/** Counters as `budget_reservations.charges` keeps them. */
export function chargesJson(charges: CounterRef[]): string {
  return JSON.stringify(charges.map((c) => ({ counter_key: c.key, period_start: c.periodStart.toISOString() })));
}

export function chargesOf(value: unknown): CounterRef[] {
  const charges = (typeof value === 'string' ? JSON.parse(value) : value) as Array<{
    counter_key: string;
    period_start: string;
  }>;
  return charges.map((c) => ({ key: c.counter_key, periodStart: new Date(c.period_start) }));
}

/** What the counters hold, without locking them (dry runs and reads). */
export async function readCounters(db: Kysely<DB>, refs: CounterRef[]): Promise<Map<string, CounterLevel>> {
  if (refs.length === 0) return new Map();
  const result = await sql<CounterRow>`
    select c.counter_key, c.period_start, c.spent_units, c.reserved_units
    from budget_counters c
    join unnest(${refs.map((r) => r.key)}::text[], ${refs.map((r) => r.periodStart)}::timestamptz[]) as t(k, p)
      on c.counter_key = t.k and c.period_start = t.p
    where c.counter_key = any(${refs.map((r) => r.key)}::text[])
  `.execute(db);
  return levelsOf(result.rows);
}

export interface CounterRow {
  counter_key: string;
  period_start: Date;
  spent_units: string;
  reserved_units: string;
}

export function levelsOf(rows: CounterRow[]): Map<string, CounterLevel> {
  return new Map(
    rows.map((row) => [
      counterId({ key: row.counter_key, periodStart: new Date(row.period_start) }),
      { spentMicros: toMicros(row.spent_units), reservedMicros: toMicros(row.reserved_units) },
    ]),
  );
}

/** What a batch adds to one counter (negative to give units back). */
export interface CounterDelta extends CounterRef {
  spentMicros: Micros;
  reservedMicros: Micros;
}

/**
 * Accumulates a batch's changes per counter, keeping `levels` (the locked counters' values) up
 * to date, so that later decisions in the same batch see the earlier ones.
 */
export function counterChanges(levels: Map<string, CounterLevel>): {
  deltas: Map<string, CounterDelta>;
  add: (ref: CounterRef, spentMicros: Micros, reservedMicros: Micros) => void;
} {
  const deltas = new Map<string, CounterDelta>();
  const add = (ref: CounterRef, spentMicros: Micros, reservedMicros: Micros) => {
    const id = counterId(ref);
    const delta = deltas.get(id) ?? { ...ref, spentMicros: 0, reservedMicros: 0 };
    delta.spentMicros += spentMicros;
    delta.reservedMicros += reservedMicros;
    deltas.set(id, delta);
    const level = levels.get(id) ?? { spentMicros: 0, reservedMicros: 0 };
    levels.set(id, {
      spentMicros: level.spentMicros + spentMicros,
      reservedMicros: level.reservedMicros + reservedMicros,
    });
  };
  return { deltas, add };
}
