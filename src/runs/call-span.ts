import type { AuditEventInput } from '../audit/audit-event.js';
import type { Execution } from './execution.js';
import type { StepResult } from './run-types.js';
import { ATTRIBUTES, endedWith, type Span } from '../telemetry/spans.js';

/** Who and what a tool call span names: never its input or output. */
export function toolCallOf(exec: Execution, index: number) {
  return {
    toolId: exec.request.plan[index]!.tool_id,
    tenantId: exec.principal.tenantId,
    agentId: exec.principal.id,
    runId: exec.request.run_id,
    step: index,
    via: exec.via,
  };
}

/** The attributes a call's first record names, once admission has resolved its tool. */
export function callAttributes(base: AuditEventInput & { tool_call_id: string }): Record<string, string> {
  return {
    [ATTRIBUTES.toolCallId]: base.tool_call_id,
    ...(base.tool_version ? { [ATTRIBUTES.toolVersion]: base.tool_version } : {}),
  };
}

/** What became of a call: admitted (then completed or failed), denied, held, or skipped (decided again, or not at all). */
export function describeStep(span: Span, step: StepResult): void {
  const decision =
    step.status === 'completed' || step.status === 'failed'
      ? 'admitted'
      : step.status === 'awaiting_approval'
        ? 'held'
        : step.status === 'denied'
          ? 'denied'
          : 'skipped';
  span.setAttributes({ [ATTRIBUTES.decision]: decision, [ATTRIBUTES.stepStatus]: step.status });
  if (step.error) endedWith(span, step.error.code);
}
