import { randomBytes } from 'node:crypto';
import type { Kysely } from 'kysely';
import type { AuditEventInput } from '../audit/audit-event.js';
import { writeAuditEvents } from '../audit/audit-repository.js';
import type { DB } from '../db/schema.js';
import type { Budget, BudgetUsage } from './budget.js';
import { lockLedgerForBudgetChange } from './budget-ledger-repository.js';
import {
  findBudget,
  findLiveBudget,
  insertBudget,
  markBudgetRemoved,
  seedBudgetCounter,
  updateBudgetLimits,
  withUsage,
  type BudgetLimits,
} from './budget-repository.js';
import { toMicros } from './budget-units.js';
import { changeInLockOrder } from '../db/lock-order.js';

/** What an operator asks for. */
export type BudgetDraft = Pick<
  Budget,
  'tenant_id' | 'scope' | 'agent_id' | 'run_id' | 'period' | 'limit_units' | 'warn_ratio' | 'grace_units'
>;

/** Who changes budgets, for the audit record. */
export interface ChangeContext {
  actor: string;
  traceId: string | null;
  now: Date;
}

/** Created (or found identical), or a `budget_conflict` with the budget already in place. */
export type CreateBudgetResult =
  { ok: true; created: boolean; usage: BudgetUsage } | { ok: false; code: 'budget_conflict'; existing: BudgetUsage };

/**
 * Creates a budget, one live per (tenant, scope, subject, period): an identical one answers the existing budget
 * (`created: false`) so scripts may re-run; different limits are a `budget_conflict` naming it.
 */
export async function createBudget(
  db: Kysely<DB>,
  draft: BudgetDraft,
  context: ChangeContext,
): Promise<CreateBudgetResult> {
  // A conflicting budget removed between our insert and our read of it: try again.
  for (let attempt = 0; attempt < 3; attempt += 1) {
    const inserted = await changeInLockOrder(db, async (trx) => {
      // Reservations in flight commit first, so the seed below counts them.
      await lockLedgerForBudgetChange(trx);
      const budget = await insertBudget(trx, {
        ...draft,
        id: `bud_${randomBytes(12).toString('base64url')}`,
        created_at: context.now,
        created_by: context.actor,
        updated_at: context.now,
        updated_by: context.actor,
        removed_at: null,
        removed_by: null,
      });
      if (!budget) return undefined;
      await seedBudgetCounter(trx, budget, context.now);
      await writeAuditEvents(trx, [
        { event: auditEvent('budget.created', budget, context, { budget: snapshot(budget) }), occurredAt: context.now },
      ]);
      return budget;
    });
    if (inserted) return { ok: true, created: true, usage: await usageOf(db, inserted, context.now) };
    const existing = await findLiveBudget(db, draft);
    if (!existing) continue;
    const usage = await usageOf(db, existing, context.now);
    return sameLimits(existing, draft)
      ? { ok: true, created: false, usage }
      : { ok: false, code: 'budget_conflict', existing: usage };
  }
  throw new Error('could not create the budget: its place kept changing');
}

/** A budget by id with its current usage; removed budgets are not found. */
export async function getBudget(db: Kysely<DB>, id: string, now: Date): Promise<BudgetUsage | undefined> {
  const budget = await findBudget(db, id);
  if (!budget || budget.removed_at !== null) return undefined;
  return usageOf(db, budget, now);
}

/** Changes a live budget's limits; undefined when it does not exist (or was removed). */
export async function changeBudgetLimits(
  db: Kysely<DB>,
  id: string,
  changes: Partial<BudgetLimits>,
  context: ChangeContext,
): Promise<BudgetUsage | undefined> {
  const updated = await changeInLockOrder(db, async (trx) => {
    // Reservations decided against the old limits commit first; later ones see the new limits.
    await lockLedgerForBudgetChange(trx);
    const before = await findBudget(trx, id, { forUpdate: true });
    if (!before || before.removed_at !== null) return undefined;
    // Limits as they already are change nothing, and record nothing.
    if (
      sameLimits(before, {
        limit_units: changes.limit_units ?? before.limit_units,
        warn_ratio: changes.warn_ratio ?? before.warn_ratio,
        grace_units: changes.grace_units ?? before.grace_units,
      })
    ) {
      return before;
    }
    const after = await updateBudgetLimits(
      trx,
      id,
      {
        limit_units: changes.limit_units ?? before.limit_units,
        warn_ratio: changes.warn_ratio ?? before.warn_ratio,
        grace_units: changes.grace_units ?? before.grace_units,
      },
      context.now,
      context.actor,
    );
    await writeAuditEvents(trx, [
      {
        event: auditEvent('budget.updated', after, context, { before: snapshot(before), after: snapshot(after) }),
        occurredAt: context.now,
      },
    ]);
    return after;
  });
  return updated ? usageOf(db, updated, context.now) : undefined;
}

/**
 * Removes a live budget: it stops applying at once. Its counters and audit trail stay; a new
 * budget may then take its (tenant, scope, subject, period).
 */
export async function removeBudget(
  db: Kysely<DB>,
  id: string,
  context: ChangeContext,
): Promise<BudgetUsage | undefined> {
  const removed = await db.transaction().execute(async (trx) => {
    const before = await findBudget(trx, id, { forUpdate: true });
    if (!before || before.removed_at !== null) return undefined;
    const after = await markBudgetRemoved(trx, id, context.now, context.actor);
    await writeAuditEvents(trx, [
      { event: auditEvent('budget.removed', after, context, { budget: snapshot(before) }), occurredAt: context.now },
    ]);
    return after;
  });
  return removed ? usageOf(db, removed, context.now) : undefined;
}

async function usageOf(db: Kysely<DB>, budget: Budget, now: Date): Promise<BudgetUsage> {
  const [usage] = await withUsage(db, [budget], now);
  return usage!;
}

function sameLimits(budget: Budget, draft: Pick<BudgetDraft, 'limit_units' | 'grace_units' | 'warn_ratio'>): boolean {
  return (
    toMicros(budget.limit_units) === toMicros(draft.limit_units) &&
    toMicros(budget.grace_units) === toMicros(draft.grace_units) &&
    budget.warn_ratio === draft.warn_ratio
  );
}

function snapshot(budget: Budget): Record<string, unknown> {
  return {
    budget_id: budget.id,
    scope: budget.scope,
    agent_id: budget.agent_id,
    run_id: budget.run_id,
    period: budget.period,
    limit_units: budget.limit_units,
    warn_ratio: budget.warn_ratio,
    grace_units: budget.grace_units,
  };
}

function auditEvent(
  eventType: string,
  budget: Budget,
  context: ChangeContext,
  details: Record<string, unknown>,
): AuditEventInput {
  return {
    event_type: eventType,
    actor: context.actor,
    tenant_id: budget.tenant_id,
    agent_id: budget.agent_id,
    run_id: budget.run_id,
    trace_id: context.traceId,
    status: 'ok',
    details: { budget_id: budget.id, ...details },
  };
}
