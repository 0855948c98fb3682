import { toolOf, type Stage } from '../step.js';

/** 3. The agent is on the tool's allowlist, by id or as `family:<name>`. */
export const allowlistStage: Stage = {
  name: 'allowlist',
  check({ principal }, state) {
    const allowed = toolOf(state).allowed_agents;
    if (allowed.includes(principal.id) || (principal.family !== undefined && allowed.includes(`family:${principal.family}`))) {
      return { ok: true };
    }
    return { ok: false, code: 'unauthorized_tool_access', message: `agent ${principal.id} is not allowed to use this tool` };
  },
};
