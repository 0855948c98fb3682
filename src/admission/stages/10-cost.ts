import type { Reservation } from '../ports.js';
import { toolOf, type Stage } from '../step.js';

/** 10. The call's cost fits every budget (reserved now, settled after dispatch). */
export const costStage: Stage = {
  name: 'cost',
  async check({ principal, run, dryRun }, state, { budgets }) {
    const tool = toolOf(state);
    const cap = state.grant?.capability_modifiers.max_cost_units;
    if (typeof cap === 'number' && tool.cost_units > cap) {
      return {
        ok: false,
        code: 'budget_exceeded',
        message: 'the call costs more than the grant allows per call',
        details: { cost_units: tool.cost_units, max_cost_units: cap },
      };
    }
    const query = {
      tenantId: principal.tenantId,
      agentId: principal.id,
      runId: run.run_id,
      units: tool.cost_units,
      requestLimitUnits: run.budget_units,
      keepsRunTotal: run.budget_units !== undefined || run.keep_open === true || run.parent_run_id !== undefined,
    };
    const result = dryRun ? await budgets.check(query) : await budgets.reserve(query);
    if (!result.ok)
      return {
        ok: false,
        code: 'budget_exceeded',
        message: 'the budget does not allow this call',
        details: result.details ?? {},
      };
    if ('reservation' in result) state.reservation = result.reservation as Reservation;
    state.warnings.push(...result.warnings);
    return { ok: true };
  },
};
