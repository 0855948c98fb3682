import { allowlistNames } from '../../registry/tool-access.js';
import { toolOf, type Stage } from '../step.js';

/**
 * 3. The agent is on the tool's allowlist, by id or as `family:<name>`; in a sub-run, the tool is
 * also inside the envelope its parent handed it (its own grant for a tool does not widen that).
 */
export const allowlistStage: Stage = {
  name: 'allowlist',
  check({ principal, run }, state) {
    const tool = toolOf(state);
    // As the registry's views decide it.
    if (!allowlistNames(tool, { agentId: principal.id, family: principal.family })) {
      return {
        ok: false,
        code: 'unauthorized_tool_access',
        message: `agent ${principal.id} is not allowed to use this tool`,
      };
    }
    if (run.delegation && !run.delegation.delegable_tool_ids.includes(tool.id)) {
      return {
        ok: false,
        code: 'unauthorized_tool_access',
        message: `${tool.id} is outside the authority handed to this sub-run`,
        details: { reason: 'outside_delegation', delegable_tool_ids: [...run.delegation.delegable_tool_ids] },
      };
    }
    return { ok: true };
  },
};
