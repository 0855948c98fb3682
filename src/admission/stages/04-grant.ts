import { narrowestModifiers } from '../../grants/authority-envelope.js';
import type { GrantQuery, GrantResolution } from '../ports.js';
import { toolOf, type AgentPrincipal, type Stage, type StepRequest } from '../step.js';

const MESSAGES = {
  grant_missing: 'no grant gives this agent this tool here',
  grant_expired: 'every grant for this tool has expired',
  grant_revoked: 'every grant for this tool was revoked',
};

/** What the grant stage resolves for a step of `run` calling `toolId` (and what may be read ahead for it). */
export function grantQueryOf(principal: AgentPrincipal, run: StepRequest['run'], toolId: string): GrantQuery {
  return {
    tenantId: principal.tenantId,
    agentId: principal.id,
    toolId,
    context: {
      tenant_id: principal.tenantId,
      run_id: run.run_id,
      pipeline_instance_id: run.pipeline_instance_id,
      session_id: run.session_id,
      user_id: run.user_id,
    },
  };
}

/**
 * 4. A live grant for (tenant, agent, tool) in the run's context; the run is recorded as relying on it, so pulling the
 * grant stops it. From the replica's copy when it can: docs/design/replica-snapshots.md#grants.
 */
export const grantStage: Stage = {
  name: 'grant',
  async check({ principal, run, dryRun, prefetchedGrants, reliedOn, presumedMissing }, state, { grants, grantUses }) {
    if (presumedMissing && !dryRun) return { ok: false, code: 'grant_missing', message: MESSAGES.grant_missing };
    const query = grantQueryOf(principal, run, toolOf(state).id);
    const fresh = () => (grants.resolveFresh ? grants.resolveFresh(query) : grants.resolve(query));
    let resolved: GrantResolution =
      reliedOn && !dryRun
        ? { ok: true, ...reliedOn }
        : dryRun
          ? await fresh()
          : await grants.resolve(query, prefetchedGrants);
    if (!resolved.ok) return { ok: false, code: resolved.code, message: MESSAGES[resolved.code] };
    // Decided before the run's claim, whose statement recorded the use under the same guard.
    if (!dryRun && !reliedOn) {
      const use = { tenantId: principal.tenantId, runId: run.run_id };
      if (!(await grantUses.record({ ...use, grantId: resolved.grant.id, assumed: resolved.assumed }))) {
        // Exact: a revocation that landed after the grant resolved; the run must not rely on it.
        if (!resolved.assumed) return { ok: false, code: 'grant_revoked', message: MESSAGES.grant_revoked };
        // The grants changed since the copy this was decided from: decide again from the database.
        resolved = await fresh();
        if (!resolved.ok) return { ok: false, code: resolved.code, message: MESSAGES[resolved.code] };
        if (!(await grantUses.record({ ...use, grantId: resolved.grant.id }))) {
          return { ok: false, code: 'grant_revoked', message: MESSAGES.grant_revoked };
        }
      }
    }
    state.grant = run.delegation
      ? {
          ...resolved.grant,
          capability_modifiers: narrowestModifiers(
            resolved.grant.capability_modifiers,
            run.delegation.capability_modifiers,
          ),
        }
      : resolved.grant;
    return { ok: true };
  },
};
