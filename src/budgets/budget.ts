import type { BudgetPeriod } from './budget-period.js';

export const BUDGET_SCOPES = ['tenant', 'agent', 'run'] as const;
export type BudgetScope = (typeof BUDGET_SCOPES)[number];

/** A cost-unit limit on a tenant, one of its agents or one of its runs, over a period. */
export interface Budget {
  id: string;
  tenant_id: string;
  scope: BudgetScope;
  /** Set for `agent` scope only. */
  agent_id: string | null;
  /** Set for `run` scope only. */
  run_id: string | null;
  period: BudgetPeriod;
  limit_units: number;
  /** Admissions that bring consumption to `warnRatio × limitUnits` or more carry a warning. */
  warn_ratio: number;
  /** Consumption may pass the limit by this much (admitted with a warning) before calls stop. */
  grace_units: number;
  created_at: Date;
  created_by: string;
  updated_at: Date;
  updated_by: string;
  removed_at: Date | null;
  removed_by: string | null;
}

/** A budget with what its current period holds. */
export interface BudgetUsage {
  budget: Budget;
  period_start: Date;
  period_end: Date | null;
  spent_units: number;
  reserved_units: number;
}

/** Who a call is charged to: the subjects budgets apply to. */
export interface ChargeSubject {
  tenantId: string;
  agentId: string;
  runId: string;
  /**
   * Whether the run's own total is kept (default yes): only a run with a budget of its own, a sub-run or one kept
   * open can ever be checked against it, and a total nobody reads costs a counter row per run.
   */
  keepsRunTotal?: boolean | undefined;
}

/** Whether a live budget applies to a call by this subject. */
export function budgetApplies(budget: Budget, subject: ChargeSubject): boolean {
  if (budget.tenant_id !== subject.tenantId || budget.removed_at !== null) return false;
  switch (budget.scope) {
    case 'tenant':
      return true;
    case 'agent':
      return budget.agent_id === subject.agentId;
    case 'run':
      return budget.run_id === subject.runId;
  }
}

/** The counter key of a run's own running total (checked against the request's `budget_units`). */
export function runCounterKey(tenantId: string, runId: string): string {
  // Tenant ids never contain '/', so the key is unambiguous whatever the run id holds.
  return `run/${tenantId}/${runId}`;
}
