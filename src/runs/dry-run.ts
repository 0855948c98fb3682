import { admitStep } from '../admission/admission-pipeline.js';
import type { AgentPrincipal } from '../admission/step.js';
import { CodedError } from '../errors/coded-error.js';
import { errorOf, elapsed, stepHead, stepRequest, type Execution, type RunExecutorDeps } from './execution.js';
import { findHandoffOfSubRun } from './handoff-repository.js';
import { notOwned } from './request-refusal.js';
import { findRun } from './run-repository.js';
import { statusAfter, type RunAnswer, type RunEnvelope, type RunRequest, type StepResult } from './run-types.js';

/** Steps 1–11 for every step, reserving and dispatching nothing. */
export async function dryRun(
  deps: RunExecutorDeps,
  principal: AgentPrincipal,
  request: RunRequest,
): Promise<RunAnswer> {
  const within = request.parent_run_id === undefined ? undefined : await subRunBounds(deps, principal, request);
  const steps: StepResult[] = [];
  const warnings: string[] = [];
  for (let index = 0; index < request.plan.length; index += 1) {
    const started = performance.now();
    const admission = await admitStep(stepRequest(principal, request, index, true, within), deps.ports);
    // An outage is no verdict on a step: a stage that cannot judge (a registry copy or kill-switch
    // snapshot unconfirmed) fails the dry run closed, as a stage meeting the database's outage does.
    if (admission.denial?.code === 'gateway_unavailable')
      throw new CodedError('gateway_unavailable', admission.denial.message, admission.denial.details);
    warnings.push(...admission.state.warnings);
    const head = stepHead(request, index, admission.state.tool);
    const common = { duration_ms: elapsed(started), audit_id: null, verdicts: admission.verdicts };
    steps.push(
      admission.ok
        ? { ...head, ...common, status: 'admissible', cost_units: admission.state.tool?.cost_units ?? 0 }
        : admission.held
          ? { ...head, ...common, status: 'awaiting_approval', cost_units: 0 }
          : { ...head, ...common, status: 'denied', error: errorOf(admission.denial!), cost_units: 0 },
    );
  }
  const firstStop = steps.find((s) => s.status === 'denied' || s.status === 'awaiting_approval');
  const envelope: RunEnvelope = {
    run_id: request.run_id,
    status: firstStop?.error ? statusAfter(firstStop.error.code) : firstStop ? 'awaiting_approval' : 'completed',
    dry_run: true,
    steps,
    warnings,
  };
  return { httpStatus: 200, envelope, replayed: false };
}

/**
 * What bounds a dry run of a sub-run, as they would bound it executed: the run its hand-off
 * made (refused as execution refuses a run no hand-off gave, or another agent's), the
 * hand-off's envelope, and its budget, which the request's `budget_units` only lowers.
 */
async function subRunBounds(
  deps: RunExecutorDeps,
  principal: AgentPrincipal,
  request: RunRequest,
): Promise<Pick<Execution, 'run' | 'delegation'>> {
  const run = await findRun(deps.database.control, principal.tenantId, request.run_id);
  if (run && run.agent_id !== principal.id) throw notOwned(request);
  if (!run || run.parent_run_id === null || run.parent_run_id !== request.parent_run_id) {
    throw new CodedError(
      'handoff_rejected',
      `no hand-off from ${request.parent_run_id} created run ${request.run_id}`,
      { reason: 'handoff_missing' },
    );
  }
  const delegation = await findHandoffOfSubRun(deps.database.control, run.tenant_id, run.run_id);
  const budgets = [run.budget_units, request.budget_units].filter(
    (units): units is number => typeof units === 'number',
  );
  return { run: { ...run, budget_units: budgets.length > 0 ? Math.min(...budgets) : null }, delegation };
}
