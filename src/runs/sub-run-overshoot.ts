import type { AuditEventInput } from '../audit/audit-event.js';
import { readRunUsage } from '../budgets/run-allowance.js';
import { statusForCode } from '../errors/error-codes.js';
import { auditBase, stepAt, type Execution, type RunExecutorDeps } from './execution.js';
import type { RunEnder } from './run-ender.js';
import type { RunAnswer, StepResult } from './run-types.js';

/**
 * After a sub-run's call settled: if what it has used passed its handed budget, the overshoot
 * event, to be recorded with the kill it causes.
 */
export async function overshootAfter(
  deps: RunExecutorDeps,
  exec: Execution,
  step: StepResult,
): Promise<AuditEventInput | undefined> {
  const budget = exec.delegation!.budget_units;
  const used = await readRunUsage(deps.database.control, exec.run.tenant_id, exec.run.run_id);
  if (used <= budget) return undefined;
  const base = auditBase(exec, step.index, undefined);
  return overshootEvent(
    exec,
    { ...base, tool_id: step.tool_id, tool_version: step.version },
    { used_units: used, budget_units: budget, after_step: step.index },
  );
}

/** The record of a sub-run's calls passing its handed budget, to be recorded with the kill it causes. */
export function overshootEvent(
  exec: Execution,
  base: AuditEventInput,
  details: Record<string, unknown>,
): AuditEventInput {
  return {
    ...base,
    event_type: 'run.subagent_budget_exceeded',
    status: 'killed',
    reason_code: 'budget_exceeded',
    details: {
      ...base.details,
      reason: 'subagent_budget_exceeded',
      handoff_id: exec.delegation!.id,
      parent_run_id: exec.run.parent_run_id,
      handed_units: exec.delegation!.budget_units,
      ...details,
    },
  };
}

/** Kills a sub-run whose calls passed its handed budget: the rest is skipped, the overshoot recorded with the kill. */
export function killForOvershoot(
  ender: RunEnder,
  exec: Execution,
  steps: StepResult[],
  warnings: string[],
  overshoot: AuditEventInput,
): Promise<RunAnswer> {
  const { request } = exec;
  for (let rest = steps.length; rest < request.plan.length; rest += 1) steps.push(stepAt(request, rest, 'skipped'));
  return ender.end(
    exec,
    statusForCode('budget_exceeded'),
    {
      run_id: request.run_id,
      status: 'killed',
      dry_run: false,
      steps,
      warnings: [...warnings, 'subagent_budget_exceeded'],
    },
    [overshoot],
  );
}
