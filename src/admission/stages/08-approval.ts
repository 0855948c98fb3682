import { payloadHash } from '../../audit/audit-hash.js';
import { toolOf, type Stage } from '../step.js';

/**
 * 8. A tool that `requires_approval` runs only with an operator's approval of exactly this call:
 * this run, this step, this tool version and the SHA-256 of this input. Without one the call is
 * held (the run waits as `awaiting_approval`) before safety, cost and rate, so a proposal
 * spends nothing. On resume every stage runs again, this one included.
 */
export const approvalStage: Stage = {
  name: 'approval',
  async check({ principal, run, step, dryRun }, state, { approvals }) {
    const tool = toolOf(state);
    if (!tool.requires_approval) return { ok: true };
    const inputSha256 = payloadHash(step.input);
    const approved = dryRun
      ? undefined
      : await approvals.approvedFor({
          tenantId: principal.tenantId,
          runId: run.run_id,
          stepIndex: step.index,
          toolId: tool.id,
          toolVersion: tool.version,
          inputSha256,
        });
    if (approved) {
      state.approvalId = approved.approvalId;
      return { ok: true };
    }
    return {
      ok: false,
      hold: 'approval',
      inputSha256,
      message: `${tool.id}@${tool.version} needs an operator's approval of this exact input`,
    };
  },
};
