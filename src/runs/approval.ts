import { payloadHash } from '../audit/audit-hash.js';

/** What an approval is about: one tool call with its exact input, or a hand-off to a sub-agent. */
export const APPROVAL_KINDS = ['tool_call', 'handoff'] as const;
export type ApprovalKind = (typeof APPROVAL_KINDS)[number];

/**
 * `pending` until an operator decides; `approved` or `rejected` with a rationale; `expired` when
 * nobody decided (or used the approval) in time; `cancelled` when its run ended first or a newer
 * proposal for the same step replaced it.
 */
export const APPROVAL_STATUSES = ['pending', 'approved', 'rejected', 'expired', 'cancelled'] as const;
export type ApprovalStatus = (typeof APPROVAL_STATUSES)[number];

/** A proposed action waiting for a human, bound to the run and what it would do. */
export interface Approval {
  id: string;
  tenant_id: string;
  kind: ApprovalKind;
  run_id: string;
  /** The agent whose action it is. */
  agent_id: string;
  step_index: number | null;
  tool_id: string | null;
  tool_version: string | null;
  /** The exact input, for the approver to read; the approval lets through only its SHA-256. */
  input: unknown;
  input_sha256: string | null;
  handoff_id: string | null;
  /** The actor whose request made the proposal (`agent:<id>`, or an operator resuming a run). */
  proposed_by: string;
  status: ApprovalStatus;
  created_at: Date;
  expires_at: Date;
  decided_by: string | null;
  decided_at: Date | null;
  rationale: string | null;
}

/**
 * The status as of `now`: past its `expires_at`, a pending proposal reads as expired, and so does
 * an approval that was not used. Its row does not say whether it was (see `lapsedAt` in
 * approval-repository.ts): an approved one reads as expired only when the caller says `unused`.
 */
export function approvalStatusAt(
  approval: Pick<Approval, 'status' | 'expires_at'>,
  now: Date,
  unused = false,
): ApprovalStatus {
  if (approval.expires_at.getTime() > now.getTime()) return approval.status;
  return approval.status === 'pending' || (approval.status === 'approved' && unused) ? 'expired' : approval.status;
}

/** Whether an approval still lets its action through at `now`. */
export function approvalUsableAt(approval: Pick<Approval, 'status' | 'expires_at'>, now: Date): boolean {
  return approval.status === 'approved' && approval.expires_at.getTime() > now.getTime();
}

/** What makes two tool calls the same call for an approval (SPEC §12.1); the agent is compared beside it. */
export interface ExactCall {
  toolId: string;
  toolVersion: string;
  inputSha256: string;
  context: Record<string, unknown>;
}

/** The SHA-256 of a tool call's input, as stage 8 binds an approval to it. */
export function inputSha256Of(input: unknown): string {
  return payloadHash(input);
}

/** The SHA-256 an approval of a tool call is found by, whatever the run of an identical call. */
export function callSha256(call: ExactCall): string {
  return payloadHash({
    tool_id: call.toolId,
    tool_version: call.toolVersion,
    input_sha256: call.inputSha256,
    context: call.context,
  });
}
