import type { Transaction } from 'kysely';
import type { DB } from '../db/schema.js';
import type { Denial } from '../errors/decision.js';
import type { Approval } from './approval.js';
import type { ErrorCode } from '../errors/error-codes.js';
import type { StageVerdict } from '../admission/admission-pipeline.js';

export const RUN_STATUSES = [
  'queued',
  'running',
  'paused',
  'awaiting_approval',
  'throttled',
  'completed',
  'failed',
  'cancelled',
  'killed',
] as const;
export type RunStatus = (typeof RUN_STATUSES)[number];

/** Statuses a run never leaves; an identical resubmission of such a run replays its envelope. */
export const TERMINAL_STATUSES: ReadonlySet<RunStatus> = new Set(['completed', 'failed', 'cancelled', 'killed']);

/** Statuses of a run that is not over: what controls act on and cascades stop. */
export const OPEN_STATUSES = [
  'queued',
  'running',
  'paused',
  'awaiting_approval',
  'throttled',
] as const satisfies readonly RunStatus[];
export type OpenStatus = (typeof OPEN_STATUSES)[number];
export type TerminalStatus = Exclude<RunStatus, OpenStatus>;

export function isTerminal(status: RunStatus): status is TerminalStatus {
  return TERMINAL_STATUSES.has(status);
}

/** The door a run request came through when it was not the REST API; its audit records name it. */
export type Via = 'mcp';

/** The body of `POST /runs/execute`, after validation. */
export interface RunRequest {
  run_id: string;
  parent_run_id?: string | undefined;
  pipeline_instance_id?: string | undefined;
  session_id?: string | undefined;
  user_id?: string | undefined;
  context: Record<string, unknown>;
  plan: Array<{ tool_id: string; version?: string | undefined; input: unknown }>;
  budget_units?: number | undefined;
  dry_run?: boolean | undefined;
  /** The run stays `running` after its plan, until its owner completes it (parents of sub-runs). */
  keep_open?: boolean | undefined;
}

/**
 * `awaiting_approval`: held at the approval stage; `pending`: not reached yet, in a run that is
 * paused or waiting and may go on.
 */
export type StepStatus = 'completed' | 'denied' | 'failed' | 'skipped' | 'admissible' | 'awaiting_approval' | 'pending';

export interface StepError {
  code: ErrorCode;
  message: string;
  details: Record<string, unknown>;
}

export interface StepResult {
  index: number;
  tool_id: string;
  version: string | null;
  status: StepStatus;
  output?: unknown;
  error?: StepError;
  cost_units: number;
  duration_ms: number;
  audit_id: string | null;
  /** The approval this step waits for. */
  approval_id?: string;
  /** Dry runs only: the verdict of every stage evaluated. */
  verdicts?: StageVerdict[];
}

/** The run envelope: the body of every `POST /runs/execute` answer that concerns a run. */
export interface RunEnvelope {
  run_id: string;
  status: RunStatus;
  dry_run: boolean;
  steps: StepResult[];
  warnings: string[];
  retry_after_seconds?: number;
}

/**
 * Why a control or a cascade stopped a run: what a later step, or a resume, is told. `code` is
 * `run_not_resumable` for controls, the cause's code for cascades (`grant_revoked`,
 * `grant_expired`, `kill_switch_active`) and `budget_exceeded` for a sub-run's overshoot.
 */
export interface RunStop {
  code: ErrorCode;
  message: string;
  details: Record<string, unknown>;
  audit_id: string | null;
}

/** One entry of a run's attribution chain, root first. */
export interface Attribution {
  run_id: string;
  agent_id: string;
}

/**
 * A tool call's id, `<run_id>:<step>:<uuid>`: which run and step it belongs to, unique per call.
 * Recovery reads the step back from the audit records of a lost execution.
 */
export function newToolCallId(runId: string, index: number, uuid: string): string {
  return `${runId}:${index}:${uuid}`;
}

/** The step a tool call id names (run ids may hold colons; the uuid never does). */
export function stepIndexOfToolCall(toolCallId: string): number {
  const parts = toolCallId.split(':');
  return Number(parts[parts.length - 2]);
}

/** The run status a denial or failure code leaves the run in. */
export function statusAfter(code: ErrorCode): RunStatus {
  switch (code) {
    case 'kill_switch_active':
    case 'budget_exceeded':
      return 'killed';
    case 'rate_limited':
      return 'throttled';
    default:
      return 'failed';
  }
}

/**
 * What expires an approval that lapsed while its run waited, cancelling the run: `approvals/`
 * implements it, the composition root passes it in, so runs never import approvals.
 */
export interface LapsedApprovals {
  expireLapsed(
    trx: Transaction<DB>,
    approval: Approval | undefined,
    actor: string,
    now: Date,
    traceId: string | null,
  ): Promise<Denial | undefined>;
}

/** What `POST /runs/execute` answers: the HTTP status of the step that stopped the run, and the envelope. */
export interface RunAnswer {
  httpStatus: number;
  envelope: RunEnvelope;
  replayed: boolean;
  /** The envelope as the reply's serialiser wrote it to store the run's end (`AnswerSerializer`): sent as it is. */
  json?: string | undefined;
}

/**
 * How the reply writes an envelope at an HTTP status, when the door has a serialiser of its own: a run's end stored
 * with its last record is written with it once, for the size check, the stored row and the reply.
 */
export type AnswerSerializer = (httpStatus: number, envelope: RunEnvelope) => string | undefined;
