import { toMicros } from '../budgets/budget-units.js';
import type { CapabilityModifiers } from '../grants/grant.js';
import { wideningIn } from '../grants/authority-envelope.js';
import {
  APPROVAL_REQUIREMENT_RANK,
  type ApprovalRequirement,
  type HandoffRejectionReason,
  type HandoffRequest,
} from '../runs/handoff.js';

/** The parent's side of a hand-off: the authority it has to hand on, and what is left of it. */
export interface ParentAuthority {
  /** Agent ids from the root run's to the parent run's own: a sub-agent among them is a cycle. */
  trace: string[];
  /**
   * Tools the parent may hand on — its envelope's (if it is a sub-run) that it holds a live grant
   * for — each with the modifiers the parent's own calls of it run under: its grant's, narrowed by
   * its envelope's.
   */
  tools: ReadonlyMap<string, CapabilityModifiers>;
  maxFanout: number;
  /** Hand-offs the parent has made already. */
  handoffsMade: number;
  approvalRequirement: ApprovalRequirement;
  /** What is left of the parent's budget; null when it has none to hand on. */
  remainingUnits: number | null;
}

/** The verdict on a hand-off: made, or refused with the first reason that applies. */
export type HandoffCheck =
  { ok: true } | { ok: false; reason: HandoffRejectionReason; message: string; details: Record<string, unknown> };

/**
 * A hand-off's verdict: refused with the first reason that applies, in the order below. The envelope may not widen the
 * parent's authority in tools, fan-out, the modifiers of any tool handed on, or approval.
 */
export function checkHandoff(request: HandoffRequest, parent: ParentAuthority, maxDepth: number): HandoffCheck {
  if (parent.trace.includes(request.sub_agent_id)) {
    return refuse('cycle_detected', `${request.sub_agent_id} is already in this run's trace`, { trace: parent.trace });
  }
  if (parent.trace.length >= maxDepth) {
    return refuse(
      'depth_cap_exceeded',
      `a hand-off from depth ${parent.trace.length - 1} would reach the depth cap of ${maxDepth}`,
      {
        depth: parent.trace.length,
        max_depth: maxDepth,
      },
    );
  }
  const widening = wideningOf(request, parent);
  if (widening) return refuse('authority_widening_rejected', widening.message, widening.details);
  // Units have six decimal places: an amount that rounds to zero is not positive.
  if (!Number.isFinite(request.budget_units) || !(toMicros(request.budget_units) > 0)) {
    return refuse('budget_non_positive', 'a sub-run needs a positive budget', { budget_units: request.budget_units });
  }
  if (parent.remainingUnits === null || request.budget_units > parent.remainingUnits) {
    return refuse(
      'budget_exceeds_parent',
      parent.remainingUnits === null
        ? 'the parent run has no budget_units to hand on'
        : `the parent run has ${parent.remainingUnits} units left`,
      { budget_units: request.budget_units, parent_remaining_units: parent.remainingUnits ?? 0 },
    );
  }
  return { ok: true };
}

function wideningOf(
  request: HandoffRequest,
  parent: ParentAuthority,
): { message: string; details: Record<string, unknown> } | undefined {
  const outside = request.delegable_tool_ids.filter((tool) => !parent.tools.has(tool));
  if (outside.length > 0) {
    return {
      message: `the parent cannot hand on ${outside.join(', ')}`,
      details: { field: 'delegable_tool_ids', tool_ids: outside },
    };
  }
  if (request.max_fanout > parent.maxFanout) {
    return {
      message: `max_fanout ${request.max_fanout} is above the parent's ${parent.maxFanout}`,
      details: { field: 'max_fanout', parent_max_fanout: parent.maxFanout },
    };
  }
  if (parent.handoffsMade >= parent.maxFanout) {
    return {
      message: `the parent has made the ${parent.maxFanout} hand-offs its fan-out allows`,
      details: { field: 'fanout', parent_max_fanout: parent.maxFanout, handoffs_made: parent.handoffsMade },
    };
  }
  // The envelope's modifiers bind every tool it hands on, so they may be no wider than the
  // parent's for any of them: a limit the parent's grant sets must be set again, no wider.
  for (const toolId of request.delegable_tool_ids) {
    const path = wideningIn(request.capability_modifiers, parent.tools.get(toolId), 'capability_modifiers');
    if (path)
      return { message: `${path} is wider than the parent's for ${toolId}`, details: { field: path, tool_id: toolId } };
  }
  if (APPROVAL_REQUIREMENT_RANK[request.approval_requirement] < APPROVAL_REQUIREMENT_RANK[parent.approvalRequirement]) {
    return {
      message: `approval_requirement ${request.approval_requirement} is weaker than the parent's ${parent.approvalRequirement}`,
      details: { field: 'approval_requirement', parent_approval_requirement: parent.approvalRequirement },
    };
  }
  return undefined;
}

function refuse(reason: HandoffRejectionReason, message: string, details: Record<string, unknown>): HandoffCheck {
  return { ok: false, reason, message, details };
}
