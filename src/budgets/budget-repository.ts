import { sql, type Kysely, type Selectable, type Transaction } from 'kysely';
import type { BudgetTable, DB } from '../db/schema.js';
import type { Budget, BudgetScope, BudgetUsage } from './budget.js';
import { periodEnd, periodStart, type BudgetPeriod } from './budget-period.js';
import { fromMicros, toMicros } from './budget-units.js';

/** Units as PostgreSQL numeric text, six places. */
export function unitsText(units: number): string {
  return fromMicros(toMicros(units)).toFixed(6);
}

/** A `budgets` row as the domain type: the one place rows are mapped. */
export function toBudget(row: Selectable<BudgetTable>): Budget {
  return {
    id: row.id,
    tenant_id: row.tenant_id,
    scope: row.scope as BudgetScope,
    agent_id: row.agent_id,
    run_id: row.run_id,
    period: row.period as BudgetPeriod,
    limit_units: fromMicros(toMicros(row.limit_units)),
    warn_ratio: Number(row.warn_ratio),
    grace_units: fromMicros(toMicros(row.grace_units)),
    created_at: new Date(row.created_at),
    created_by: row.created_by,
    updated_at: new Date(row.updated_at),
    updated_by: row.updated_by,
    removed_at: row.removed_at === null ? null : new Date(row.removed_at),
    removed_by: row.removed_by,
  };
}

/**
 * Inserts a budget unless a live one already holds its (tenant, scope, subject, period);
 * returns undefined then.
 */
export async function insertBudget(trx: Transaction<DB>, budget: Budget): Promise<Budget | undefined> {
  const row = await trx
    .insertInto('budgets')
    .values({
      id: budget.id,
      tenant_id: budget.tenant_id,
      scope: budget.scope,
      agent_id: budget.agent_id,
      run_id: budget.run_id,
      period: budget.period,
      limit_units: unitsText(budget.limit_units),
      warn_ratio: budget.warn_ratio,
      grace_units: unitsText(budget.grace_units),
      created_at: budget.created_at,
      created_by: budget.created_by,
      updated_at: budget.updated_at,
      updated_by: budget.updated_by,
    })
    .onConflict((oc) =>
      oc
        .expression(sql`tenant_id, scope, coalesce(agent_id, ''), coalesce(run_id, ''), period`)
        .where('removed_at', 'is', null)
        .doNothing(),
    )
    .returningAll()
    .executeTakeFirst();
  return row ? toBudget(row) : undefined;
}

/** The live budget holding a (tenant, scope, subject, period), if any. */
export async function findLiveBudget(
  db: Kysely<DB>,
  key: Pick<Budget, 'tenant_id' | 'scope' | 'agent_id' | 'run_id' | 'period'>,
): Promise<Budget | undefined> {
  const row = await db
    .selectFrom('budgets')
    .selectAll()
    .where('tenant_id', '=', key.tenant_id)
    .where('scope', '=', key.scope)
    .where(sql<string>`coalesce(agent_id, '')`, '=', key.agent_id ?? '')
    .where(sql<string>`coalesce(run_id, '')`, '=', key.run_id ?? '')
    .where('period', '=', key.period)
    .where('removed_at', 'is', null)
    .executeTakeFirst();
  return row ? toBudget(row) : undefined;
}

/** A budget by id, live or removed. Locks it when given a transaction's `forUpdate`. */
export async function findBudget(
  db: Kysely<DB>,
  id: string,
  options: { forUpdate?: boolean } = {},
): Promise<Budget | undefined> {
  let query = db.selectFrom('budgets').selectAll().where('id', '=', id);
  if (options.forUpdate) query = query.forUpdate();
  const row = await query.executeTakeFirst();
  return row ? toBudget(row) : undefined;
}

/** The limits of a budget an operator may change. */
export interface BudgetLimits {
  limit_units: number;
  warn_ratio: number;
  grace_units: number;
}

/** Sets a budget's limits; the caller holds its row lock and audits the change. */
export async function updateBudgetLimits(
  trx: Transaction<DB>,
  id: string,
  limits: BudgetLimits,
  at: Date,
  by: string,
): Promise<Budget> {
  const row = await trx
    .updateTable('budgets')
    .set({
      limit_units: unitsText(limits.limit_units),
      warn_ratio: limits.warn_ratio,
      grace_units: unitsText(limits.grace_units),
      updated_at: at,
      updated_by: by,
    })
    .where('id', '=', id)
    .returningAll()
    .executeTakeFirstOrThrow();
  return toBudget(row);
}

/** Marks a budget removed; the caller holds its row lock and audits the change. */
export async function markBudgetRemoved(trx: Transaction<DB>, id: string, at: Date, by: string): Promise<Budget> {
  const row = await trx
    .updateTable('budgets')
    .set({ removed_at: at, removed_by: by, updated_at: at, updated_by: by })
    .where('id', '=', id)
    .returningAll()
    .executeTakeFirstOrThrow();
  return toBudget(row);
}

/**
 * Starts a new budget's period from what its subject already spent in it (open reservations at what they reserved:
 * they will never settle against it), `budget_spend_archive` included for `total`: docs/operations.md#retention.
 */
export async function seedBudgetCounter(trx: Transaction<DB>, budget: Budget, now: Date): Promise<void> {
  const start = periodStart(budget.period, now);
  const subject =
    budget.scope === 'agent'
      ? sql`and agent_id = ${budget.agent_id}`
      : budget.scope === 'run'
        ? sql`and run_id = ${budget.run_id}`
        : sql``;
  const archived =
    budget.period === 'total' && budget.scope !== 'run'
      ? sql`(select coalesce(sum(spent_units), 0) from budget_spend_archive where tenant_id = ${budget.tenant_id} ${subject})`
      : sql`0`;
  await sql`
    insert into budget_counters (counter_key, period_start, spent_units, reserved_units)
    select ${budget.id}, ${start},
           coalesce(sum(case status when 'settled' then actual_units when 'reserved' then units else 0 end), 0) + ${archived},
           0
    from budget_reservations
    where tenant_id = ${budget.tenant_id} ${subject} and reserved_at >= ${start}
    on conflict (counter_key, period_start) do nothing
  `.execute(trx);
}

/** Budgets with their current period's spent and reserved units, as of `now`. */
export async function withUsage(db: Kysely<DB>, budgets: Budget[], now: Date): Promise<BudgetUsage[]> {
  const windows = budgets.map((budget) => ({ budget, start: periodStart(budget.period, now) }));
  const rows =
    windows.length === 0
      ? []
      : await db
          .selectFrom('budget_counters')
          .select(['counter_key', 'period_start', 'spent_units', 'reserved_units'])
          .where((eb) =>
            eb.or(windows.map((w) => eb.and([eb('counter_key', '=', w.budget.id), eb('period_start', '=', w.start)]))),
          )
          .execute();
  const byKey = new Map(rows.map((row) => [`${row.counter_key}@${new Date(row.period_start).toISOString()}`, row]));
  return windows.map(({ budget, start }) => {
    const row = byKey.get(`${budget.id}@${start.toISOString()}`);
    return {
      budget,
      period_start: start,
      period_end: periodEnd(budget.period, now),
      spent_units: row ? fromMicros(toMicros(row.spent_units)) : 0,
      reserved_units: row ? fromMicros(toMicros(row.reserved_units)) : 0,
    };
  });
}

/** Filters and position of one page of `GET /budgets`. */
export interface BudgetQuery {
  tenantId?: string | undefined;
  scope?: BudgetScope | undefined;
  agentId?: string | undefined;
  runId?: string | undefined;
  period?: BudgetPeriod | undefined;
  /** Continue after this (created_at, id), newest first. */
  after?: { createdAt: Date; id: string } | undefined;
  limit: number;
}

/** Live budgets, newest first, one page; `next` continues the listing when more remain. */
export async function listBudgets(
  db: Kysely<DB>,
  query: BudgetQuery,
): Promise<{ items: Budget[]; next: { createdAt: Date; id: string } | null }> {
  let q = db.selectFrom('budgets').selectAll().where('removed_at', 'is', null);
  if (query.tenantId !== undefined) q = q.where('tenant_id', '=', query.tenantId);
  if (query.scope !== undefined) q = q.where('scope', '=', query.scope);
  if (query.agentId !== undefined) q = q.where('agent_id', '=', query.agentId);
  if (query.runId !== undefined) q = q.where('run_id', '=', query.runId);
  if (query.period !== undefined) q = q.where('period', '=', query.period);
  if (query.after !== undefined) {
    const { createdAt, id } = query.after;
    q = q.where((eb) => eb(eb.refTuple('created_at', 'id'), '<', eb.tuple(createdAt, id)));
  }
  const rows = await q
    .orderBy('created_at', 'desc')
    .orderBy('id', 'desc')
    .limit(query.limit + 1)
    .execute();
  const items = rows.slice(0, query.limit).map(toBudget);
  const last = items[items.length - 1];
  return { items, next: rows.length > query.limit && last ? { createdAt: last.created_at, id: last.id } : null };
}
