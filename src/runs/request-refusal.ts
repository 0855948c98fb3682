import type { AgentPrincipal } from '../admission/step.js';
import { actorOf } from '../auth/principal.js';
import { CodedError } from '../errors/coded-error.js';
import type { RunExecutorDeps } from './execution.js';
import type { RunRequest, Via } from './run-types.js';

/**
 * Refuses a whole request, on record as every denial is: under the run id asked for
 * and the agent that asked, saying no more than the answer does. The parent_run_id the request
 * named is `parent_run_id`, or `requested_parent_run_id` when the answer names the run's own.
 */
export async function refuseRequest(
  deps: RunExecutorDeps,
  principal: AgentPrincipal,
  request: RunRequest,
  traceId: string,
  via: Via | undefined,
  eventType: string,
  error: CodedError,
): Promise<never> {
  const named =
    request.parent_run_id === undefined
      ? {}
      : 'parent_run_id' in error.details
        ? { requested_parent_run_id: request.parent_run_id }
        : { parent_run_id: request.parent_run_id };
  await deps.audit.append({
    event_type: eventType,
    actor: actorOf(principal),
    tenant_id: principal.tenantId,
    agent_id: principal.id,
    run_id: request.run_id,
    trace_id: traceId,
    status: 'denied',
    reason_code: error.code,
    details: { ...error.details, message: error.message, ...named, ...(via ? { via } : {}) },
  });
  throw error;
}

/** Another principal's run id: a conflict, whatever the run is. */
export function notOwned(request: RunRequest): CodedError {
  return new CodedError('run_id_conflict', `run_id ${request.run_id} belongs to another principal`);
}
