import { sql, type Kysely, type RawBuilder, type Selectable, type Transaction } from 'kysely';
import { findRecordedCosts } from '../audit/audit-listing.js';
import type { BudgetTable, DB } from '../db/schema.js';
import type { Budget, ChargeSubject } from './budget.js';
import { toBudget } from './budget-repository.js';
import { fromMicros, toMicros, type Micros } from './budget-units.js';
import type { CounterLevel } from './budget-verdict.js';
import type { ChainHeld } from '../db/lock-order.js';

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

/**
 * `b`: each subject's live budgets (tenant, agent, run), probed by key in `budgets_one_live_per_subject` through a
 * lateral subquery, so a plan kept from an empty table cannot scan them all.
 * See docs/design/database-pools.md#why-two-kinds-of-planning.
 */
function liveBudgetsOf(subjects: ChargeSubject[]): RawBuilder<unknown> {
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

/** Counters as `budget_reservations.charges` keeps them. */
function chargesJson(charges: CounterRef[]): string {
  return JSON.stringify(charges.map((c) => ({ counter_key: c.key, period_start: c.periodStart.toISOString() })));
}

function chargesOf(value: unknown): CounterRef[] {
  const charges = (typeof value === 'string' ? JSON.parse(value) : value) as Array<{
    counter_key: string;
    period_start: string;
  }>;
  return charges.map((c) => ({ key: c.counter_key, periodStart: new Date(c.period_start) }));
}

/** The first close of each id, in id order (the order rows are locked in). */
export function firstCloses(closes: ReservationClose[]): ReservationClose[] {
  const first = new Map<string, ReservationClose>();
  for (const close of closes) if (!first.has(close.id)) first.set(close.id, close);
  return [...first.values()].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
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

interface CounterRow {
  counter_key: string;
  period_start: Date;
  spent_units: string;
  reserved_units: string;
}

function levelsOf(rows: CounterRow[]): Map<string, CounterLevel> {
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
