import { CanonicalPayload } from '../../audit/audit-hash.js';
import { toolOf, type Stage } from '../step.js';

/**
 * 8. A `requires_approval` tool runs only with an operator's approval of this exact call (run, step, version, input
 * SHA-256). Without one the run is held before safety, cost and rate, so a proposal spends nothing.
 */
export const approvalStage: Stage = {
  name: 'approval',
  async check({ principal, run, step, dryRun }, state, { approvals }) {
    const tool = toolOf(state);
    if (!tool.requires_approval) return { ok: true };
    const inputSha256 = (step.canonicalInput ?? new CanonicalPayload(step.input)).sha256;
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
