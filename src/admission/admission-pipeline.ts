import type { AdmissionPorts, Denial, Hold, Reservation } from './ports.js';
import { registryStage } from './stages/01-registry.js';
import { categoryStage } from './stages/02-category.js';
import { allowlistStage } from './stages/03-allowlist.js';
import { grantStage } from './stages/04-grant.js';
import { scopesStage } from './stages/05-scopes.js';
import { contextStage } from './stages/06-context.js';
import { inputStage } from './stages/07-input.js';
import { approvalStage } from './stages/08-approval.js';
import { safetyStage } from './stages/09-safety.js';
import { costStage } from './stages/10-cost.js';
import { rateStage } from './stages/11-rate.js';
import type { Stage, StepRequest, StepState } from './step.js';
import { ATTRIBUTES, inSpan, type Span } from '../telemetry/spans.js';

/**
 * The admission order of docs/api.md#runs-post-runsexecute. Stateless checks first; safety, then the stages that spend
 * (cost, rate) last, so nothing is spent for a call an earlier stage refused.
 */
export const ADMISSION_STAGES: readonly Stage[] = [
  registryStage,
  categoryStage,
  allowlistStage,
  grantStage,
  scopesStage,
  contextStage,
  inputStage,
  approvalStage,
  safetyStage,
  costStage,
  rateStage,
];

export interface StageVerdict {
  stage: string;
  ok: boolean;
  /** An error code, or `awaiting_approval` for a call held at stage 8. */
  code?: string;
}

export type Admission =
  | { ok: true; held?: undefined; denial?: undefined; state: StepState; verdicts: StageVerdict[] }
  | {
      ok: false;
      denial: Denial;
      held?: undefined;
      state: StepState;
      verdicts: StageVerdict[];
      /** Reserved for the call before it was refused: the caller gives them back (with the denial's record). */
      unspent: Reservation[];
    }
  | { ok: false; held: Hold; denial?: undefined; state: StepState; verdicts: StageVerdict[] };

/**
 * Runs one step through every stage in order; the first denial (or hold) stops it. What a refused
 * call had reserved is the caller's to give back; a held call's is given back here. Traced as an
 * `admission` span naming the decision, and for a refusal its stage and reason code.
 */
export function admitStep(request: StepRequest, ports: AdmissionPorts): Promise<Admission> {
  return inSpan('admission', {}, async (span) => {
    const admission = await admitThroughStages(request, ports);
    describe(span, admission);
    return admission;
  });
}

function describe(span: Span, admission: Admission): void {
  if (admission.ok) {
    span.setAttribute(ATTRIBUTES.decision, 'admitted');
    return;
  }
  const refused = {
    [ATTRIBUTES.stage]: admission.verdicts[admission.verdicts.length - 1]?.stage ?? 'unknown',
    [ATTRIBUTES.reasonCode]: admission.held ? 'awaiting_approval' : admission.denial.code,
  };
  span.setAttributes({ [ATTRIBUTES.decision]: admission.held ? 'held' : 'denied', ...refused });
  span.addEvent(admission.held ? 'admission.held' : 'admission.refused', refused);
}

async function admitThroughStages(request: StepRequest, ports: AdmissionPorts): Promise<Admission> {
  const state: StepState = { warnings: [] };
  const verdicts: StageVerdict[] = [];
  for (const stage of ADMISSION_STAGES) {
    const decision = await stage.check(request, state, ports);
    if (!decision.ok) {
      verdicts.push({ stage: stage.name, ok: false, code: 'hold' in decision ? 'awaiting_approval' : decision.code });
      // A later stage refused after the budget was reserved: the reservation is given back.
      const unspent = request.unclaimed
        ? []
        : [...new Set([state.reservation, request.reserved])].filter((r) => r !== undefined);
      delete state.reservation;
      if ('hold' in decision) {
        for (const reserved of unspent) await ports.budgets.release(reserved);
        return { ok: false, held: decision, state, verdicts };
      }
      return { ok: false, denial: decision, state, verdicts, unspent };
    }
    verdicts.push({ stage: stage.name, ok: true });
  }
  // Reserved with the run's claim for a price the call no longer has: given back.
  if (request.reserved && state.reservation !== request.reserved && !request.unclaimed)
    await ports.budgets.release(request.reserved);
  return { ok: true, state, verdicts };
}
