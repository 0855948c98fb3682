import type { CapabilityModifiers } from '../grants/grant.js';

/**
 * Who must approve a sub-run before it may start. Of the source design's requirements, toolgate
 * has the principals for `operator` (a tenant- or platform-operator) only; the others
 * (`teacher`, `guardian`, `user-confirm-before-proceed`) are refused rather than stored unenforced.
 */
export const APPROVAL_REQUIREMENTS = ['none', 'operator'] as const;
export type ApprovalRequirement = (typeof APPROVAL_REQUIREMENTS)[number];

/** How strict each requirement is: a hand-off may keep or raise its parent's, never lower it. */
export const APPROVAL_REQUIREMENT_RANK: Readonly<Record<ApprovalRequirement, number>> = { none: 0, operator: 1 };

/** The typed reasons of `403 handoff_rejected`, in checking order: docs/api.md#approvals-hand-offs-and-run-controls. */
export const HANDOFF_REJECTIONS = [
  'cycle_detected',
  'depth_cap_exceeded',
  'authority_widening_rejected',
  'budget_non_positive',
  'budget_exceeds_parent',
] as const;
export type HandoffRejectionReason = (typeof HANDOFF_REJECTIONS)[number];

/** What a parent asks for when it hands work to a sub-agent (`POST /runs/{run_id}/handoffs`). */
export interface HandoffRequest {
  sub_agent_id: string;
  sub_run_id: string;
  budget_units: number;
  delegable_tool_ids: string[];
  max_fanout: number;
  capability_modifiers: CapabilityModifiers;
  approval_requirement: ApprovalRequirement;
}

/** A hand-off as stored: the sub-run's authority envelope and budget, and what became of it. */
export interface Handoff {
  id: string;
  tenant_id: string;
  parent_run_id: string;
  sub_run_id: string;
  parent_agent_id: string;
  sub_agent_id: string;
  budget_units: number;
  delegable_tool_ids: string[];
  max_fanout: number;
  capability_modifiers: CapabilityModifiers;
  approval_requirement: ApprovalRequirement;
  depth: number;
  status: 'open' | 'closed';
  /** Set when the sub-run ended: what it used, and what went back to the parent. */
  spent_units: number | null;
  returned_units: number | null;
  created_at: Date;
  closed_at: Date | null;
}
