import { narrowestModifiers } from '../../grants/authority-envelope.js';
import type { GrantQuery } from '../ports.js';
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
 * 4. A live grant resolves for (tenant, agent, tool) in the run's context. The run is recorded
 * as relying on it, so that revoking or expiring it stops the run (cascade). In a sub-run the
 * grant's modifiers are narrowed by the envelope's.
 */
export const grantStage: Stage = {
  name: 'grant',
  async check({ principal, run, dryRun, prefetchedGrants }, state, { grants, grantUses }) {
    const resolved = await grants.resolve(grantQueryOf(principal, run, toolOf(state).id), prefetchedGrants);
    if (!resolved.ok) return { ok: false, code: resolved.code, message: MESSAGES[resolved.code] };
    // A revocation that landed after the grant resolved: the run must not rely on it.
    if (
      !dryRun &&
      !(await grantUses.record({ tenantId: principal.tenantId, runId: run.run_id, grantId: resolved.grant.id }))
    ) {
      return { ok: false, code: 'grant_revoked', message: MESSAGES.grant_revoked };
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
