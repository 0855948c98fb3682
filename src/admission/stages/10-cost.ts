import type { AdmissibleTool, Denial, GrantView, Reservation } from '../ports.js';
import { toolOf, type Stage, type StepRequest } from '../step.js';

/** What a call is to be charged, as the cost stage asks its budgets: undefined with the refusal when its price is over the grant's cap. */
export function chargeOf(
  { principal, run }: Pick<StepRequest, 'principal' | 'run'>,
  tool: Pick<AdmissibleTool, 'cost_units'>,
  grant: Pick<GrantView, 'capability_modifiers'> | undefined,
):
  | {
      query: {
        tenantId: string;
        agentId: string;
        runId: string;
        units: number;
        requestLimitUnits: number | undefined;
        keepsRunTotal: boolean;
      };
      refusal?: undefined;
    }
  | { query?: undefined; refusal: Denial } {
  const cap = grant?.capability_modifiers.max_cost_units;
  if (typeof cap === 'number' && tool.cost_units > cap) {
    return {
      refusal: {
        ok: false,
        code: 'budget_exceeded',
        message: 'the call costs more than the grant allows per call',
        details: { cost_units: tool.cost_units, max_cost_units: cap },
      },
    };
  }
  return {
    query: {
      tenantId: principal.tenantId,
      agentId: principal.id,
      runId: run.run_id,
      units: tool.cost_units,
      requestLimitUnits: run.budget_units,
      keepsRunTotal: run.budget_units !== undefined || run.keep_open === true || run.parent_run_id !== undefined,
    },
  };
}

function exceeded(details: Record<string, unknown>): Denial {
  return { ok: false, code: 'budget_exceeded', message: 'the budget does not allow this call', details };
}

/** 10. The call's cost fits every budget (reserved now, settled after dispatch). */
export const costStage: Stage = {
  name: 'cost',
  async check(request, state, { budgets }) {
    const tool = toolOf(state);
    const charge = chargeOf(request, tool, state.grant);
    if (charge.refusal) return charge.refusal;
    // Reserved with the run's claim, for this very price.
    const reserved = request.reserved;
    if (reserved && !request.dryRun && reserved.units === tool.cost_units) {
      state.reservation = reserved;
      return { ok: true };
    }
    // Refused with the run's claim, for this very price.
    const refused = request.budgetRefusal;
    if (refused && !request.dryRun && refused.units === tool.cost_units) return exceeded(refused.details);
    const result = request.dryRun ? await budgets.check(charge.query) : await budgets.reserve(charge.query);
    if (!result.ok) return exceeded(result.details ?? {});
    if ('reservation' in result) state.reservation = result.reservation as Reservation;
    state.warnings.push(...result.warnings);
    return { ok: true };
  },
};
