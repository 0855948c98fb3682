/**
 * The closed set of error codes (README.md#errors). Codes are stable API: add, never rename.
 * README.md and openapi.yaml list every one (a test pins all three together).
 */
export const ERROR_CODES = [
  'invalid_request',
  'missing_required_context',
  'unauthenticated',
  'budget_exceeded',
  'agent_forbidden',
  'forbidden',
  'tool_category_blocked',
  'unauthorized_tool_access',
  'grant_missing',
  'grant_expired',
  'grant_revoked',
  'tool_scope_missing',
  'kill_switch_active',
  'egress_denied',
  'handoff_rejected',
  'not_found',
  'tool_not_registered',
  'tool_version_not_found',
  'run_id_conflict',
  'tool_version_conflict',
  'run_not_resumable',
  'budget_conflict',
  'grant_conflict',
  'audit_chain_broken',
  'payload_too_large',
  'tool_input_schema_invalid',
  'idempotency_key_reused',
  'checkpoint_untrusted',
  'partition_not_sealed',
  'rate_limited',
  'internal',
  'tool_backend_failed',
  'tool_output_schema_invalid',
  'tool_backend_not_configured',
  'gateway_unavailable',
  'tool_backend_timeout',
  'tool_name_conflict',
] as const;

export type ErrorCode = (typeof ERROR_CODES)[number];

/**
 * The HTTP status of each code; exhaustive, so a new code cannot ship without one. It sits with
 * the codes because a run stores the status of the answer it would replay.
 */
export function statusForCode(code: ErrorCode): number {
  switch (code) {
    case 'invalid_request':
    case 'missing_required_context':
      return 400;
    case 'unauthenticated':
      return 401;
    case 'budget_exceeded':
      return 402;
    case 'agent_forbidden':
    case 'forbidden':
    case 'tool_category_blocked':
    case 'unauthorized_tool_access':
    case 'grant_missing':
    case 'grant_expired':
    case 'grant_revoked':
    case 'tool_scope_missing':
    case 'kill_switch_active':
    case 'egress_denied':
    case 'handoff_rejected':
      return 403;
    case 'not_found':
    case 'tool_not_registered':
    case 'tool_version_not_found':
      return 404;
    case 'run_id_conflict':
    case 'tool_version_conflict':
    case 'tool_name_conflict':
    case 'run_not_resumable':
    case 'budget_conflict':
    case 'grant_conflict':
    case 'audit_chain_broken':
    case 'partition_not_sealed':
      return 409;
    case 'payload_too_large':
      return 413;
    case 'tool_input_schema_invalid':
    case 'idempotency_key_reused':
    case 'checkpoint_untrusted':
      return 422;
    case 'rate_limited':
      return 429;
    case 'internal':
      return 500;
    case 'tool_backend_failed':
    case 'tool_output_schema_invalid':
      return 502;
    case 'tool_backend_not_configured':
    case 'gateway_unavailable':
      return 503;
    case 'tool_backend_timeout':
      return 504;
    default: {
      const unreachable: never = code;
      throw new Error(`unmapped error code ${String(unreachable)}`);
    }
  }
}
