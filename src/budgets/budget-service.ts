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
  'tenantId' | 'scope' | 'agentId' | 'runId' | 'period' | 'limitUnits' | 'warnRatio' | 'graceUnits'
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
 * Creates a budget. One live budget holds each (tenant, scope, subject, period): asking again for
 * an identical one answers the existing budget (`created: false`), so scripts may re-run;
 * asking for different limits is a `budget_conflict` naming the existing budget (change it with
 * PUT instead). A new budget's current period starts from what its subject already spent in it.
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
        createdAt: context.now,
        createdBy: context.actor,
        updatedAt: context.now,
        updatedBy: context.actor,
        removedAt: null,
        removedBy: null,
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
  if (!budget || budget.removedAt !== null) return undefined;
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
    if (!before || before.removedAt !== null) return undefined;
    // Limits as they already are change nothing, and record nothing.
    if (
      sameLimits(before, {
        limitUnits: changes.limitUnits ?? before.limitUnits,
        warnRatio: changes.warnRatio ?? before.warnRatio,
        graceUnits: changes.graceUnits ?? before.graceUnits,
      })
    ) {
      return before;
    }
    const after = await updateBudgetLimits(
      trx,
      id,
      {
        limitUnits: changes.limitUnits ?? before.limitUnits,
        warnRatio: changes.warnRatio ?? before.warnRatio,
        graceUnits: changes.graceUnits ?? before.graceUnits,
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
    if (!before || before.removedAt !== null) return undefined;
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

function sameLimits(budget: Budget, draft: Pick<BudgetDraft, 'limitUnits' | 'graceUnits' | 'warnRatio'>): boolean {
  return (
    toMicros(budget.limitUnits) === toMicros(draft.limitUnits) &&
    toMicros(budget.graceUnits) === toMicros(draft.graceUnits) &&
    budget.warnRatio === draft.warnRatio
  );
}

function snapshot(budget: Budget): Record<string, unknown> {
  return {
    budget_id: budget.id,
    scope: budget.scope,
    agent_id: budget.agentId,
    run_id: budget.runId,
    period: budget.period,
    limit_units: budget.limitUnits,
    warn_ratio: budget.warnRatio,
    grace_units: budget.graceUnits,
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
    tenant_id: budget.tenantId,
    agent_id: budget.agentId,
    run_id: budget.runId,
    trace_id: context.traceId,
    status: 'ok',
    details: { budget_id: budget.id, ...details },
  };
}
