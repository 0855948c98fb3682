import { sql, type Kysely, type RawBuilder, type Transaction } from 'kysely';
import type { DB } from '../db/schema.js';
import type { Budget, ChargeSubject } from './budget.js';
import {
  chargesJson,
  counterId,
  counterRefOf,
  levelsOf,
  liveBudgetsOf,
  microsText,
  type CounterDelta,
  type CounterRef,
  type CounterRow,
} from './budget-counter-repository.js';
import { toMicros, type Micros } from './budget-units.js';
import type { CounterLevel } from './budget-verdict.js';
import type { ChainHeld } from '../db/lock-order.js';

/** The live budgets a batch was decided with, for `writeLedgerIf` to check. */
export interface ExpectedBudgets {
  /** Who the batch charges. */
  subjects: ChargeSubject[];
  /** Exactly the live budgets that apply to any of them (`budgetApplies`), as the batch saw them. */
  budgets: Budget[];
}

/** `writeLedgerIf`'s answer. */
export interface LedgerWrite {
  /** Whether the batch was written. */
  ok: boolean;
  /**
   * Written: the levels the batch left its counters at. Not written: the levels the counters in
   * `expected` stand at, read under their locks (empty when a counter had appeared meanwhile).
   */
  levels: Map<string, CounterLevel>;
  /** Whether the live budgets were still those given (always true when none were given). */
  budgetsHeld: boolean;
}

/**
 * `writeLedger` only if all the batch was decided against still stands — the counters' levels (with `bounds`, at
 * most those), counters still missing, the same live `budgets` — all or nothing, in one statement: the compare and
 * set of docs/design/budget-ledger.md#counters-in-postgresql-decisions-in-batches.
 */
export async function writeLedgerIf(
  db: Kysely<DB>,
  expected: ReadonlyMap<string, CounterLevel>,
  deltas: CounterDelta[],
  reservations: NewReservation[],
  reservedAt: Date,
  expiresAt: Date,
  budgets?: ExpectedBudgets,
  bounds?: ReadonlyMap<string, Micros | null>,
): Promise<LedgerWrite> {
  const write: LedgerWriteIf = { expected, deltas, reservations, reservedAt, expiresAt, budgets, bounds };
  if (!ledgerWriteChanges(write)) return { ok: true, levels: new Map(expected), budgetsHeld: true };
  let row: LedgerWriteRow | undefined;
  try {
    const result = await sql<{ outcome: LedgerWriteRow }>`
      with ${ledgerWriteSteps(write)}
      select ${ledgerWriteOutcome()} as outcome
    `.execute(db);
    row = result.rows[0]?.outcome;
  } catch (error) {
    if (isCounterCreatedMeanwhile(error)) return { ok: false, levels: new Map(), budgetsHeld: false };
    throw error;
  }
  return ledgerWriteResult(write, row);
}

/** What `writeLedgerIf` writes, and what it checks first. */
export interface LedgerWriteIf {
  expected: ReadonlyMap<string, CounterLevel>;
  deltas: CounterDelta[];
  reservations: NewReservation[];
  reservedAt: Date;
  expiresAt: Date;
  budgets?: ExpectedBudgets | undefined;
  bounds?: ReadonlyMap<string, Micros | null> | undefined;
}

/** The outcome row `ledgerWriteOutcome` answers. */
export interface LedgerWriteRow {
  ok: boolean;
  budgets_held: boolean;
  current: CounterRow[] | null;
}

/** Whether the write changes anything at all. */
function ledgerWriteChanges(write: LedgerWriteIf): boolean {
  return write.reservations.length > 0 || write.deltas.some((d) => d.spentMicros !== 0 || d.reservedMicros !== 0);
}

/**
 * The CTEs of a guarded ledger write, `expected` through `ledger`, for a statement of its own or another room's
 * (`LedgerStepOptions` says how they fit in it).
 */
export function ledgerWriteSteps(write: LedgerWriteIf, options: LedgerStepOptions = {}): RawBuilder<unknown> {
  const { expected, deltas, reservations, reservedAt, expiresAt, budgets, bounds } = write;
  const n = ledgerNames(options.prefix);
  const changed = new Map(
    deltas.filter((d) => d.spentMicros !== 0 || d.reservedMicros !== 0).map((d) => [counterId(d), d]),
  );
  // Every counter decided against is compared; those it changes are changed by their delta.
  const known = [...expected].map(([id, level]) => ({
    ref: counterRefOf(id),
    level,
    delta: changed.get(id),
    bound: bounds?.get(id) ?? null,
  }));
  const created = [...changed].filter(([id]) => !expected.has(id)).map(([, d]) => d);
  const keys = known.map((c) => c.ref.key);
  return sql`${n.expected} as (
        select * from unnest(
          ${keys}::text[],
          ${known.map((c) => c.ref.periodStart)}::timestamptz[],
          ${known.map((c) => microsText(c.level.spentMicros))}::numeric[],
          ${known.map((c) => microsText(c.level.reservedMicros))}::numeric[],
          ${known.map((c) => microsText(c.delta?.spentMicros ?? 0))}::numeric[],
          ${known.map((c) => microsText(c.delta?.reservedMicros ?? 0))}::numeric[],
          ${known.map((c) => (c.bound === null ? null : microsText(c.bound)))}::numeric[]
        ) as e(k, p, spent, reserved, add_spent, add_reserved, bound)
      ),
      ${n.current} as materialized (
        select c.counter_key, c.period_start, c.spent_units, c.reserved_units
        from budget_counters c join ${n.expected} e on c.counter_key = e.k and c.period_start = e.p
        where c.counter_key = any(${keys}::text[])${options.lockedFirst ? sql` and (select count(*) from ${options.lockedFirst}) >= 0` : sql``}
        order by c.counter_key, c.period_start
        for no key update of c
      ),${budgets ? applicableBudgets(budgets, n.applicable) : sql``}
      ${n.unchanged} as materialized (
        select levels_held and budgets_held and ${options.when ?? sql`true`} as ok, budgets_held
        from (
          select count(*) = ${known.length} as levels_held, ${budgets ? sameBudgets(budgets, n.applicable) : sql`true`} as budgets_held
          from ${n.current} c join ${n.expected} e on c.counter_key = e.k and c.period_start = e.p
          where ${bounds ? sql`case when e.bound is null then true else c.spent_units + c.reserved_units <= e.bound end` : sql`c.spent_units = e.spent and c.reserved_units = e.reserved`}
        ) held
      ),
      ${n.counters} as (
        update budget_counters c
        set spent_units = c.spent_units + e.add_spent, reserved_units = c.reserved_units + e.add_reserved
        from ${n.expected} e, ${n.unchanged} u
        where u.ok and (e.add_spent <> 0 or e.add_reserved <> 0)
          and c.counter_key = e.k and c.period_start = e.p and c.counter_key = any(${keys}::text[])
        returning 1
      ),
      ${n.created} as (
        -- A plain insert: a counter another writer created meanwhile fails the whole statement.
        insert into budget_counters (counter_key, period_start, spent_units, reserved_units)
        select n.k, n.p, n.spent, n.reserved
        from unnest(
          ${created.map((d) => d.key)}::text[],
          ${created.map((d) => d.periodStart)}::timestamptz[],
          ${created.map((d) => microsText(d.spentMicros))}::numeric[],
          ${created.map((d) => microsText(d.reservedMicros))}::numeric[]
        ) as n(k, p, spent, reserved), ${n.unchanged} u
        where u.ok
        returning 1
      ),
      ${n.ledger} as (
        insert into budget_reservations (id, tenant_id, agent_id, run_id, units, status, charges, reserved_at, expires_at)
        select id, tenant_id, agent_id, run_id, units, 'reserved', charges, ${reservedAt}, ${expiresAt}
        from ${reservationRows(reservations)}, ${n.unchanged} u
        where u.ok
        returning id
      )`;
}

/** A scalar of the statement `ledgerWriteSteps` joins: the write's outcome (a `LedgerWriteRow`), for `ledgerWriteResult`. */
export function ledgerWriteOutcome(prefix?: string): RawBuilder<unknown> {
  const n = ledgerNames(prefix);
  return sql`(
      select json_build_object('ok', u.ok, 'budgets_held', u.budgets_held,
        'current', (select json_agg(json_build_object('counter_key', c.counter_key, 'period_start', c.period_start,
                     'spent_units', c.spent_units::text, 'reserved_units', c.reserved_units::text)) from ${n.current} c))
      from ${n.unchanged} u)`;
}

/** How a statement joining `ledgerWriteSteps` places them. */
export interface LedgerStepOptions {
  /** A condition of that statement's, added to the guard. */
  when?: RawBuilder<unknown> | undefined;
  /** Rows it locks before the counters (in the global lock order). */
  lockedFirst?: RawBuilder<unknown> | undefined;
  /** Before every CTE's name, when that statement has names of its own like them (an audit append's `current`). */
  prefix?: string | undefined;
}

const LEDGER_CTES = ['expected', 'current', 'applicable', 'unchanged', 'counters', 'created', 'ledger'] as const;

/** The names of the ledger write's CTEs under `prefix`; `ledger` lists the ids of the reservations written. */
export function ledgerNames(prefix = ''): Record<(typeof LEDGER_CTES)[number], RawBuilder<unknown>> {
  if (!/^[a-z_]*$/.test(prefix)) throw new Error(`not a CTE prefix: ${prefix}`);
  return Object.fromEntries(LEDGER_CTES.map((name) => [name, sql.raw(prefix + name)])) as Record<
    (typeof LEDGER_CTES)[number],
    RawBuilder<unknown>
  >;
}

/** What a write's outcome row says: written, with the levels it left; or not, with the levels it found. */
export function ledgerWriteResult(write: LedgerWriteIf, row: LedgerWriteRow | undefined | null): LedgerWrite {
  const levels = levelsOf(row?.current ?? []);
  if (row?.ok !== true) return { ok: false, levels, budgetsHeld: row?.budgets_held === true };
  for (const delta of write.deltas) {
    if (delta.spentMicros === 0 && delta.reservedMicros === 0) continue;
    const id = counterId(delta);
    const level = levels.get(id);
    levels.set(id, {
      spentMicros: (level?.spentMicros ?? 0) + delta.spentMicros,
      reservedMicros: (level?.reservedMicros ?? 0) + delta.reservedMicros,
    });
  }
  return { ok: true, levels, budgetsHeld: true };
}

/** `applicable`: the live budgets that apply to any of the subjects, subject by subject. */
function applicableBudgets({ subjects }: ExpectedBudgets, applicable: RawBuilder<unknown>): RawBuilder<unknown> {
  return sql`
      ${applicable} as (
        select distinct b.id, b.period, b.limit_units, b.grace_units, b.warn_ratio from ${liveBudgetsOf(subjects)}
      ),`;
}

/** True when `applicable` holds exactly the expected budgets, each with its expected limits. */
function sameBudgets({ budgets }: ExpectedBudgets, applicable: RawBuilder<unknown>): RawBuilder<unknown> {
  return sql`
          (select count(*) from ${applicable}) = ${budgets.length}
          and (select count(*) from ${applicable} a
               join unnest(
                 ${budgets.map((b) => b.id)}::text[],
                 ${budgets.map((b) => b.period)}::text[],
                 ${budgets.map((b) => microsText(toMicros(b.limit_units)))}::numeric[],
                 ${budgets.map((b) => microsText(toMicros(b.grace_units)))}::numeric[],
                 ${budgets.map((b) => b.warn_ratio)}::float8[]
               ) as x(id, period, limit_units, grace_units, warn_ratio)
                 on a.id = x.id and a.period = x.period and a.limit_units = x.limit_units
                and a.grace_units = x.grace_units and a.warn_ratio = x.warn_ratio) = ${budgets.length}`;
}

/** A unique violation on a counter's key: another writer created the counter first. */
function isCounterCreatedMeanwhile(error: unknown): boolean {
  const e = error as { code?: unknown; constraint?: unknown };
  return e.code === '23505' && e.constraint === 'budget_counters_pkey';
}

/** A reservation to record, with the counters it was charged to. */
export interface NewReservation extends ChargeSubject {
  id: string;
  unitsMicros: Micros;
  charges: CounterRef[];
}

/**
 * In one statement: adds the deltas to counters this transaction has locked, and records the
 * new reservations, all reserved at `reservedAt` and presumed abandoned after `expiresAt`.
 */
export async function writeLedger(
  trx: Transaction<DB>,
  deltas: CounterDelta[],
  reservations: NewReservation[],
  reservedAt: Date,
  expiresAt: Date,
): Promise<void> {
  const changed = deltas.filter((d) => d.spentMicros !== 0 || d.reservedMicros !== 0);
  if (changed.length === 0 && reservations.length === 0) return;
  await sql`
    with counters as (
      update budget_counters c
      set spent_units = c.spent_units + d.spent, reserved_units = c.reserved_units + d.reserved
      from unnest(
        ${changed.map((d) => d.key)}::text[],
        ${changed.map((d) => d.periodStart)}::timestamptz[],
        ${changed.map((d) => microsText(d.spentMicros))}::numeric[],
        ${changed.map((d) => microsText(d.reservedMicros))}::numeric[]
      ) as d(k, p, spent, reserved)
      where c.counter_key = d.k and c.period_start = d.p
      returning 1
    ),
    ledger as (
      insert into budget_reservations (id, tenant_id, agent_id, run_id, units, status, charges, reserved_at, expires_at)
      select id, tenant_id, agent_id, run_id, units, 'reserved', charges, ${reservedAt}, ${expiresAt}
      from ${reservationRows(reservations)}
      returning 1
    )
    select (select count(*) from counters) as counters, (select count(*) from ledger) as reservations
  `.execute(trx);
}

/** New reservations as rows `r(id, tenant_id, agent_id, run_id, units, charges)`. */
function reservationRows(reservations: NewReservation[]): RawBuilder<unknown> {
  return sql`unnest(
        ${reservations.map((r) => r.id)}::text[],
        ${reservations.map((r) => r.tenantId)}::text[],
        ${reservations.map((r) => r.agentId)}::text[],
        ${reservations.map((r) => r.runId)}::text[],
        ${reservations.map((r) => microsText(r.unitsMicros))}::numeric[],
        ${reservations.map((r) => chargesJson(r.charges))}::jsonb[]
      ) as r(id, tenant_id, agent_id, run_id, units, charges)`;
}

/**
 * A budget change waits for the reservations in flight (ROW EXCLUSIVE, taken before their snapshot) and holds new ones
 * back until it commits, so none is decided against limits it changed: docs/design/budget-ledger.md.
 */
export async function lockLedgerForBudgetChange(trx: ChainHeld): Promise<void> {
  await sql`lock table budget_reservations in share row exclusive mode`.execute(trx);
}

/** What a transaction recording reservations takes first (see `lockLedgerForBudgetChange`). */
export async function lockLedgerForReservations(trx: Transaction<DB>): Promise<void> {
  await sql`lock table budget_reservations in row exclusive mode`.execute(trx);
}
