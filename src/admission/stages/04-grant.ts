import { toolOf, type Stage } from '../step.js';

/** 4. A live grant resolves for (tenant, agent, tool) in the run's context. */
export const grantStage: Stage = {
  name: 'grant',
  async check({ principal, run }, state, { grants }) {
    const resolved = await grants.resolve({
      tenantId: principal.tenantId,
      agentId: principal.id,
      toolId: toolOf(state).id,
      context: {
        tenant_id: principal.tenantId,
        run_id: run.run_id,
        pipeline_instance_id: run.pipeline_instance_id,
        session_id: run.session_id,
        user_id: run.user_id,
      },
    });
    if (!resolved.ok) {
      const messages = {
        grant_missing: 'no grant gives this agent this tool here',
        grant_expired: 'every grant for this tool has expired',
        grant_revoked: 'every grant for this tool was revoked',
      };
      return { ok: false, code: resolved.code, message: messages[resolved.code] };
    }
    state.grant = resolved.grant;
    return { ok: true };
  },
};
