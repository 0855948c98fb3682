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
      return { ok: false, code: 'gateway_unavailable', message: 'kill-switch state cannot be confirmed fresh; refusing to admit' };
    }
    const { ok: _ok, code: _code, ...details } = decision as Record<string, unknown>;
    const copy = (decision as { blamed?: { user_visible_status_copy?: string } }).blamed?.user_visible_status_copy;
    return { ok: false, code: 'kill_switch_active', message: copy ?? 'a kill switch stops this call', details };
  },
};
