import type { OperatorRole } from '../auth/principal.js';

/** The five grant scopes, most specific first (docs/api.md#grants-and-kill-switches). */
export const GRANT_SCOPES = ['per-run', 'per-pipeline-instance', 'per-session', 'per-user', 'per-tenant'] as const;
export type GrantScope = (typeof GRANT_SCOPES)[number];

/** How specific each scope is: the resolver prefers the highest. */
export const GRANT_SCOPE_PRIORITY: Readonly<Record<GrantScope, number>> = {
  'per-run': 100,
  'per-pipeline-instance': 80,
  'per-session': 60,
  'per-user': 40,
  'per-tenant': 20,
};

/** The run-context key a scope's `scope_ref` is compared with. */
export const GRANT_SCOPE_CONTEXT_KEY = {
  'per-run': 'run_id',
  'per-pipeline-instance': 'pipeline_instance_id',
  'per-session': 'session_id',
  'per-user': 'user_id',
  'per-tenant': 'tenant_id',
} as const satisfies Record<GrantScope, string>;

/** The operator who granted, revoked or renewed. */
export interface OperatorActor {
  actor_id: string;
  actor_role: OperatorRole;
}

/**
 * Per-grant narrowing of a tool. A closed set: a modifier the gateway does not know
 * could not be enforced, so it is refused rather than stored.
 */
export type CapabilityModifiers = {
  /** Hosts (exact or `*.example.com`) the egress executor may reach; within the tool's `allowed_hosts`. */
  egress_domains?: string[];
  /** The most cost units one call may be charged under this grant. */
  max_cost_units?: number;
};

/** A grant: one agent, one tool, one scope, for a time, for a reason. */
export interface Grant {
  id: string;
  tenant_id: string;
  agent_id: string;
  tool_id: string;
  scope: GrantScope;
  scope_ref: string;
  capability_modifiers: CapabilityModifiers;
  expires_at: Date;
  granted_by: OperatorActor;
  rationale: string;
  granted_at: Date;
  revoked_at: Date | null;
  revoked_by: OperatorActor | null;
  revocation_reason: string | null;
  /** The grant this one renewed, if any. */
  renewed_from: string | null;
  /** The grant that renewed (and so ended) this one, if any. */
  superseded_by: string | null;
}

/** A grant's standing: in force, lapsed, or pulled (revoked or renewed). */
export const GRANT_STATUSES = ['live', 'expired', 'revoked'] as const;
export type GrantStatus = (typeof GRANT_STATUSES)[number];

/**
 * A grant's standing at `now`. Revocation wins over expiry (a renewed grant stays revoked past its old expiry) and
 * ignores `now`, so a replica whose clock lags the one that revoked still treats the grant as pulled.
 */
export function grantStatus(grant: Pick<Grant, 'revoked_at' | 'expires_at'>, now: Date): GrantStatus {
  if (grant.revoked_at !== null) return 'revoked';
  if (grant.expires_at.getTime() <= now.getTime()) return 'expired';
  return 'live';
}
