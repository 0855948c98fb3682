import type { BudgetPeriod } from './budget-period.js';

export const BUDGET_SCOPES = ['tenant', 'agent', 'run'] as const;
export type BudgetScope = (typeof BUDGET_SCOPES)[number];

/** A cost-unit limit on a tenant, one of its agents or one of its runs, over a period. */
export interface Budget {
  id: string;
  tenantId: string;
  scope: BudgetScope;
  /** Set for `agent` scope only. */
  agentId: string | null;
  /** Set for `run` scope only. */
  runId: string | null;
  period: BudgetPeriod;
  limitUnits: number;
  /** Admissions that bring consumption to `warnRatio × limitUnits` or more carry a warning. */
  warnRatio: number;
  /** Consumption may pass the limit by this much (admitted with a warning) before calls stop. */
  graceUnits: number;
  createdAt: Date;
  createdBy: string;
  updatedAt: Date;
  updatedBy: string;
  removedAt: Date | null;
  removedBy: string | null;
}

/** A budget with what its current period holds. */
export interface BudgetUsage {
  budget: Budget;
  periodStart: Date;
  periodEnd: Date | null;
  spentUnits: number;
  reservedUnits: number;
}

/** Who a call is charged to: the subjects budgets apply to. */
export interface ChargeSubject {
  tenantId: string;
  agentId: string;
  runId: string;
}

/** Whether a live budget applies to a call by this subject. */
export function budgetApplies(budget: Budget, subject: ChargeSubject): boolean {
  if (budget.tenantId !== subject.tenantId || budget.removedAt !== null) return false;
  switch (budget.scope) {
    case 'tenant':
      return true;
    case 'agent':
      return budget.agentId === subject.agentId;
    case 'run':
      return budget.runId === subject.runId;
  }
}

/** The counter key of a run's own running total (checked against the request's `budget_units`). */
export function runCounterKey(tenantId: string, runId: string): string {
  // Tenant ids never contain '/', so the key is unambiguous whatever the run id holds.
  return `run/${tenantId}/${runId}`;
}
