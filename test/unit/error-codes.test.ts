import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { ERROR_CODES, statusForCode } from '../../src/errors/error-codes.js';
import { openapi } from '../helpers/contract.js';

// SPEC §7, plus `forbidden` (an operator lacking the role a route needs), `internal` and
// `budget_conflict` (a second budget for the same tenant, scope, subject and period).
const SPEC_STATUS: Record<string, number> = {
  invalid_request: 400,
  missing_required_context: 400,
  unauthenticated: 401,
  budget_exceeded: 402,
  agent_forbidden: 403,
  forbidden: 403,
  tool_category_blocked: 403,
  unauthorized_tool_access: 403,
  grant_missing: 403,
  grant_expired: 403,
  grant_revoked: 403,
  tool_scope_missing: 403,
  kill_switch_active: 403,
  egress_denied: 403,
  handoff_rejected: 403,
  not_found: 404,
  tool_not_registered: 404,
  tool_version_not_found: 404,
  run_id_conflict: 409,
  tool_version_conflict: 409,
  tool_name_conflict: 409,
  run_not_resumable: 409,
  budget_conflict: 409,
  grant_conflict: 409,
  audit_chain_broken: 409,
  payload_too_large: 413,
  tool_input_schema_invalid: 422,
  idempotency_key_reused: 422,
  checkpoint_untrusted: 422,
  partition_not_sealed: 409,
  rate_limited: 429,
  internal: 500,
  tool_backend_failed: 502,
  tool_output_schema_invalid: 502,
  tool_backend_not_configured: 503,
  gateway_unavailable: 503,
  tool_backend_timeout: 504,
};

describe('the closed set of error codes', () => {
  it('maps every code to the status SPEC §7 gives it', () => {
    expect([...ERROR_CODES].sort()).toEqual(Object.keys(SPEC_STATUS).sort());
    for (const code of ERROR_CODES) expect([code, statusForCode(code)]).toEqual([code, SPEC_STATUS[code]]);
  });

  it('is exactly the ErrorCode enum of openapi.yaml', () => {
    const schemas = (openapi.components as { schemas: Record<string, { enum: string[] }> }).schemas;
    expect([...schemas.ErrorCode!.enum].sort()).toEqual([...ERROR_CODES].sort());
  });

  it('is listed, code by code, in the README', () => {
    const readme = readFileSync(new URL('../../README.md', import.meta.url), 'utf8');
    for (const code of ERROR_CODES) expect(readme, code).toContain(`\`${code}\``);
  });
});
