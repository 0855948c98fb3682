import { GRANT_SCOPE_CONTEXT_KEY, GRANT_SCOPE_PRIORITY, grantStatus, type Grant, type GrantStatus } from './grant.js';

/** The run a call belongs to, as far as grants care. Absent keys match nothing. */
export interface RunContext {
  tenant_id: string;
  run_id?: string | undefined;
  pipeline_instance_id?: string | undefined;
  session_id?: string | undefined;
  user_id?: string | undefined;
}

/** What the resolver reads of a grant; `Grant` has it all. */
export type ResolvableGrant = Pick<
  Grant,
  'id' | 'tenant_id' | 'scope' | 'scope_ref' | 'granted_at' | 'expires_at' | 'revoked_at'
>;

/** A grant whose `scope_ref` matched the context, with its standing and priority. */
export interface GrantCandidate<G extends ResolvableGrant = Grant> {
  grant: G;
  status: GrantStatus;
  priority: number;
}

export type GrantDenialCode = 'grant_missing' | 'grant_expired' | 'grant_revoked';

/**
 * The resolver's verdict. `candidates` are the grants whose scope matched the context, best
 * first (priority, then most recent): what an explain call shows an operator.
 */
export type GrantDecision<G extends ResolvableGrant = Grant> =
  | { ok: true; grant: G; candidates: GrantCandidate<G>[] }
  | { ok: false; code: GrantDenialCode; candidates: GrantCandidate<G>[] };

/**
 * The live grant matching the run context, most specific then most recent, among one (tenant, agent, tool)'s grants;
 * else `grant_missing` when none matched, or the standing (`grant_revoked`, `grant_expired`) of the best match.
 */
export function resolveGrant<G extends ResolvableGrant>(
  grants: readonly G[],
  context: RunContext,
  now: Date,
): GrantDecision<G> {
  const candidates = grants
    .filter((grant) => grant.tenant_id === context.tenant_id && scopeMatches(grant, context))
    .map((grant) => ({ grant, status: grantStatus(grant, now), priority: GRANT_SCOPE_PRIORITY[grant.scope] }))
    .sort(bestFirst);
  const live = candidates.find((candidate) => candidate.status === 'live');
  if (live) return { ok: true, grant: live.grant, candidates };
  const best = candidates[0];
  if (!best) return { ok: false, code: 'grant_missing', candidates };
  return { ok: false, code: best.status === 'revoked' ? 'grant_revoked' : 'grant_expired', candidates };
}

function scopeMatches(grant: ResolvableGrant, context: RunContext): boolean {
  const value = context[GRANT_SCOPE_CONTEXT_KEY[grant.scope]];
  return value !== undefined && value === grant.scope_ref;
}

function bestFirst<G extends ResolvableGrant>(a: GrantCandidate<G>, b: GrantCandidate<G>): number {
  if (a.priority !== b.priority) return b.priority - a.priority;
  const recency = b.grant.granted_at.getTime() - a.grant.granted_at.getTime();
  if (recency !== 0) return recency;
  // Same scope, same instant: any fixed order will do, as long as every replica picks the same.
  return a.grant.id < b.grant.id ? 1 : a.grant.id > b.grant.id ? -1 : 0;
}
