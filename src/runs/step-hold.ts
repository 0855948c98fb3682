import { randomBytes } from 'node:crypto';
import type { AdmissibleTool, Hold } from '../admission/ports.js';
import { cancelPendingApprovals, insertApproval } from './approval-repository.js';
import { callSha256 } from './approval.js';
import { writeAuditEvents } from '../audit/audit-repository.js';
import { releaseRun } from './run-end-repository.js';
import { readRunStanding } from './run-repository.js';
import type { RunAnswer, RunEnvelope, StepResult } from './run-types.js';
import { changeInLockOrder } from '../db/lock-order.js';
import { auditBase, RunMovedOn, stepAt, type Execution, type RunExecutorDeps } from './execution.js';
import type { RunEnder } from './run-ender.js';
import { writtenOnce } from './step-closing.js';

/**
 * Stage 8 held a call: the proposal is recorded, bound to the run, the step, the tool version
 * and the input's SHA-256, and the run waits as `awaiting_approval` (202). Nothing was spent.
 */
export async function holdForApproval(
  deps: RunExecutorDeps,
  ender: RunEnder,
  exec: Execution,
  steps: StepResult[],
  warnings: string[],
  held: Hold,
  tool: AdmissibleTool,
): Promise<RunAnswer> {
  const { request, run } = exec;
  const index = steps.length - 1;
  const now = deps.now();
  const approvalId = `apr_${randomBytes(10).toString('hex')}`;
  try {
    return await changeInLockOrder(deps.database.control, async (trx) => {
      await cancelPendingApprovals(trx, [run], index);
      const approval = await insertApproval(trx, {
        id: approvalId,
        tenant_id: run.tenant_id,
        kind: 'tool_call',
        run_id: run.run_id,
        agent_id: run.agent_id,
        step_index: index,
        tool_id: tool.id,
        tool_version: tool.version,
        input: request.plan[index]!.input,
        input_sha256: held.inputSha256,
        call_sha256: callSha256({
          toolId: tool.id,
          toolVersion: tool.version,
          inputSha256: held.inputSha256,
          context: request.context,
        }),
        handoff_id: null,
        proposed_by: exec.actor,
        created_at: now,
        expires_at: new Date(now.getTime() + deps.approvalTtlMs),
      });
      const base = auditBase(exec, index, tool);
      const [record] = await writeAuditEvents(trx, [
        {
          occurredAt: now,
          event: {
            ...base,
            event_type: 'approval.requested',
            actor: exec.actor,
            status: 'awaiting_approval',
            input_sha256: held.inputSha256,
            details: {
              ...base.details,
              approval_id: approval.id,
              step_index: index,
              proposed_by: exec.actor,
              expires_at: approval.expires_at.toISOString(),
            },
          },
        },
      ]);
      steps[index] = { ...steps[index]!, audit_id: record!.event_id, approval_id: approval.id };
      for (let rest = index + 1; rest < request.plan.length; rest += 1) steps.push(stepAt(request, rest, 'pending'));
      const envelope: RunEnvelope = {
        run_id: request.run_id,
        status: 'awaiting_approval',
        dry_run: false,
        steps,
        warnings,
      };
      const { answer, json } = writtenOnce(exec, { httpStatus: 202, envelope, replayed: false });
      if (
        !(await releaseRun(
          trx,
          { ...run, epoch: run.epoch },
          { status: 'awaiting_approval', httpStatus: 202, envelope, envelopeJson: json },
        ))
      )
        throw new RunMovedOn();
      return answer;
    });
  } catch (error) {
    if (!(error instanceof RunMovedOn)) throw error;
    steps.length = index;
    const standing = await readRunStanding(deps.database.control, run);
    return ender.interrupted(exec, steps, warnings, standing?.status ?? 'cancelled', standing?.stop ?? null);
  }
}
