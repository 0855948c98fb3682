import { toolOf, type Stage } from '../step.js';

/** 9. No kill switch matches; a replica whose switch snapshot is stale fails closed. */
export const safetyStage: Stage = {
  name: 'safety',
  check({ principal }, state, { killSwitches }) {
    const tool = toolOf(state);
    const decision = killSwitches.decide({
      tenantId: principal.tenantId,
      agentId: principal.id,
      family: principal.family,
      toolId: tool.id,
      target: tool.target ?? {},
    });
    if (decision.ok) return { ok: true };
    if (decision.code === 'gateway_unavailable') {
      return {
        ok: false,
        code: 'gateway_unavailable',
        message: 'kill-switch state cannot be confirmed fresh; refusing to admit',
      };
    }
    // The agent learns what the operator wrote for it and how wide the stop is; the switch's
    // reason and who armed it stay with operators, behind their own routes.
    const { blamed } = decision;
    return {
      ok: false,
      code: 'kill_switch_active',
      message: blamed.user_visible_status_copy,
      details: {
        kill_switch_id: blamed.id,
        scope: blamed.scope,
        user_visible_status_copy: blamed.user_visible_status_copy,
      },
    };
  },
};
