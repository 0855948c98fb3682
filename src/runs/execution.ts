import { randomUUID } from 'node:crypto';
import type {
  AdmissibleTool,
  AdmissionPorts,
  Denial,
  GrantAssumed,
  GrantPrefetch,
  Hold,
  Reservation,
} from '../admission/ports.js';
import type { AgentPrincipal, StepRequest } from '../admission/step.js';
import { chargeOf } from '../admission/stages/10-cost.js';
import type { AuditEventInput } from '../audit/audit-event.js';
import { CanonicalPayload } from '../audit/audit-hash.js';
import type { AuditLog } from '../audit/audit-log.js';
import type { PreparedReservations, ReserveRequest } from '../budgets/budget-reservation.js';
import { actorOf } from '../auth/principal.js';
import type { Handoff } from './handoff.js';
import type { ErrorCode } from '../errors/error-codes.js';
import type { Metrics } from '../metrics/metrics.js';
import type { BackendClient } from '../proxy/backend-client.js';
import { attributionOf } from './run-lifecycle.js';
import type { RunRecovery } from './run-recovery.js';
import type { ClaimedRunStartAnswer } from './run-claim-repository.js';
import type { RunRecord } from './run-repository.js';
import type { CallEnd, CallEndAnswer, RunStartChange } from './run-end-rider.js';
import {
  newToolCallId,
  type AnswerSerializer,
  type LapsedApprovals,
  type RunAnswer,
  type RunRequest,
  type StepResult,
  type Via,
} from './run-types.js';
import type { Database } from '../db/database.js';
import type { GrantUseIf } from '../grants/grant-snapshot-repository.js';
import { ATTRIBUTES, inSpan } from '../telemetry/spans.js';

/** What the executor is built from, by the composition root. */
export interface RunExecutorDeps {
  database: Database;
  /** The call's last record carries its run's end and its settlement (`callEndRider`). */
  audit: AuditLog<CallEnd, CallEndAnswer, RunStartChange, ClaimedRunStartAnswer | undefined>;
  ports: AdmissionPorts;
  backend: BackendClient;
  metrics: Metrics;
  now: () => Date;
  /** How long a proposed action waits for an operator, and an approval for its use. */
  approvalTtlMs: number;
  /** What expires an approval that lapsed while its run was throttled. */
  approvals: LapsedApprovals;
  /** This replica: the executor id its claims and take-ups record. */
  replicaId: string;
  /** Which runs this replica executes; ends the busy runs whose executor was lost. */
  recovery: RunRecovery;
  /** This replica's lease: while it may have lapsed, nothing is dispatched. */
  lease: { valid(): boolean };
  /** Reservations decided before a batch of runs is claimed, for the claim's statement to write. */
  charges?: { prepare(requests: ReserveRequest[]): PreparedReservations | undefined };
}

/** Denials that are security events are recorded under their own event type. */
export const SECURITY_DENIALS: Partial<Record<ErrorCode, string>> = {
  tool_category_blocked: 'security.category_blocked',
  unauthorized_tool_access: 'security.unauthorized_tool_access',
  egress_denied: 'security.egress_blocked',
};

/** One executor's hold on one run, from taking it up to letting it go. */
export interface Execution {
  /** Who the run executes as: its owning agent. */
  principal: AgentPrincipal;
  request: RunRequest;
  traceId: string;
  /** The door the request came through when not the REST API (`mcp`): its records say so. */
  via: Via | undefined;
  /** The run as this executor took it up (its epoch is this executor's). */
  run: RunRecord;
  /** The hand-off that made this run, for a sub-run: its envelope and budget. */
  delegation: Handoff | undefined;
  /** The actor whose request drives this execution: the proposer of any approval it asks for. */
  actor: string;
  /** The reply's serialiser, when the door that asked has one. */
  answerJson?: AnswerSerializer | undefined;
  /** The first step's grants, read while the run was claimed; taken by that step. */
  prefetchedGrants?: GrantPrefetch | undefined;
  /** The first step's grant, its use recorded with the run's claim; taken by that step. */
  reliedOn?: GrantAssumed | undefined;
  /** The first step's budget reservation, written with the run's claim; taken by that step. */
  reserved?: Reservation | undefined;
  /** The first step's budget refusal, found exact by the run's claim; that step's, at that price. */
  budgetRefusal?: StepRequest['budgetRefusal'];
}

export interface StepOutcome {
  step: StepResult;
  stop?: { code: ErrorCode; retryAfterSeconds?: number };
  /** What the stop is recorded as besides the step's own record: committed with the run's end. */
  ending?: AuditEventInput[];
  held?: Hold;
  tool?: AdmissibleTool;
  /** The run moved on while the call was admitted: nothing was sent, its reservation released. */
  movedOn?: Pick<RunRecord, 'status' | 'stop'>;
  /** The step ended the run in the commit of its own record: the run's answer. */
  ended?: RunAnswer;
  /** The first step of a run not claimed yet: its intent record was not appended, and what its claim did instead. */
  unclaimed?: ClaimedRunStartAnswer;
}

/**
 * The run's end after a step, for a step whose record can carry it (see `closingAt`): the
 * answer, when the step ends the run, or undefined when the run goes on or must end otherwise.
 */
export type Closing = (step: StepResult, stop: StepOutcome['stop']) => RunAnswer | undefined;

/** What became of an admitted call: its output or failure, what it cost, its record. */
export type Dispatched =
  | { ok: true; output: unknown; costUnits: number; auditId: string }
  | {
      ok: false;
      code: ErrorCode;
      message: string;
      details: Record<string, unknown>;
      costUnits: number;
      auditId: string | null;
    };

/** The largest envelope (in UTF-16 code units of its JSON) a run's last record carries with it. */
export const MAX_ENVELOPE_WITH_RECORD = 64 * 1024;

/** Thrown inside a transaction to undo it when the run moved on without this executor. */
export class RunMovedOn extends Error {}

export function stepRequest(
  principal: AgentPrincipal,
  request: RunRequest,
  index: number,
  dryRun: boolean,
  exec: Pick<Execution, 'run' | 'delegation'> | undefined,
): StepRequest & { step: { canonicalInput: CanonicalPayload } } {
  const planned = request.plan[index]!;
  const delegation = exec?.delegation;
  return {
    principal,
    run: {
      run_id: request.run_id,
      parent_run_id: request.parent_run_id,
      pipeline_instance_id: request.pipeline_instance_id,
      session_id: request.session_id,
      user_id: request.user_id,
      context: request.context,
      budget_units: exec?.run.budget_units ?? request.budget_units,
      keep_open: exec?.run.keep_open ?? request.keep_open,
      delegation: delegation
        ? { delegable_tool_ids: delegation.delegable_tool_ids, capability_modifiers: delegation.capability_modifiers }
        : undefined,
    },
    step: {
      index,
      tool_id: planned.tool_id,
      version: planned.version,
      input: planned.input,
      canonicalInput: new CanonicalPayload(planned.input),
    },
    dryRun,
  };
}

/** The grant use a call decided from the copy relies on, as its run's statement records it (only if it still stands). */
export function relianceOf(tenantId: string, runId: string, assumed: GrantAssumed): GrantUseIf {
  return {
    tenant_id: tenantId,
    run_id: runId,
    grant_id: assumed.grant.id,
    assumed: {
      agent_id: assumed.assumed.agentId,
      tool_id: assumed.assumed.toolId,
      since: assumed.assumed.version,
      decided_at: assumed.assumed.decidedAt,
    },
  };
}

/**
 * What the call at `index` is to be charged, decided from the registry copy and the grant the copy chose: undefined when
 * its tool does not resolve, waits for approval, or costs more than that grant allows (admission says why).
 */
export async function chargeOfStep(
  { catalog, tenantPolicy }: Pick<AdmissionPorts, 'catalog' | 'tenantPolicy'>,
  principal: AgentPrincipal,
  request: RunRequest,
  index: number,
  assumed: GrantAssumed,
  exec: Pick<Execution, 'run' | 'delegation'> | undefined,
): Promise<ReserveRequest | undefined> {
  const planned = request.plan[index]!;
  const resolved = await catalog.resolve(planned.tool_id, planned.version, {
    as: 'caller',
    agent: { agentId: principal.id, family: principal.family },
    externalCallEnabled: () => tenantPolicy.externalCallEnabled(principal.tenantId),
  });
  if (!resolved.ok || resolved.tool.requires_approval) return undefined;
  return chargeOf(stepRequest(principal, request, index, false, exec), resolved.tool, assumed.grant).query;
}

export function auditBase(
  exec: Execution,
  index: number,
  tool: AdmissibleTool | undefined,
): AuditEventInput & { tool_call_id: string; details: Record<string, unknown> } {
  const { principal, request, traceId, run } = exec;
  const context = request.context;
  const text = (value: unknown) => (typeof value === 'string' ? value : null);
  return {
    event_type: 'run.step',
    actor: actorOf(principal),
    tenant_id: principal.tenantId,
    agent_id: principal.id,
    run_id: request.run_id,
    tool_call_id: newToolCallId(request.run_id, index, randomUUID()),
    tool_id: tool?.id ?? request.plan[index]!.tool_id,
    tool_version: tool?.version ?? null,
    tool_category: tool?.category ?? null,
    risk_level: tool?.risk_level ?? null,
    trace_id: traceId,
    organization_id: text(context.organization_id),
    assessment_id: text(context.assessment_id),
    // Which execution of the run made the call (what recovery reads back if it is lost), and,
    // for a sub-run, who it acts for: its ancestors, root first, then itself.
    details: {
      run_epoch: run.epoch,
      ...(run.depth > 0 ? { attribution: attributionOf(run) } : {}),
      ...(exec.via ? { via: exec.via } : {}),
    },
  };
}

export function stepHead(
  request: RunRequest,
  index: number,
  tool: AdmissibleTool | undefined,
): Pick<StepResult, 'index' | 'tool_id' | 'version'> {
  return { index, tool_id: request.plan[index]!.tool_id, version: tool?.version ?? null };
}

export function stepAt(request: RunRequest, index: number, status: 'skipped' | 'pending' | 'denied'): StepResult {
  return { ...stepHead(request, index, undefined), status, cost_units: 0, duration_ms: 0, audit_id: null };
}

export function errorOf(denial: Denial) {
  return { code: denial.code, message: denial.message, details: denial.details ?? {} };
}

export function elapsed(started: number): number {
  return Math.round((performance.now() - started) * 1000) / 1000;
}

/** An audit append, traced from the caller's side: the record's event type, nothing of its content. */
export function auditSpan<T>(event: AuditEventInput, append: () => Promise<T>): Promise<T> {
  return inSpan('audit.append', { [ATTRIBUTES.auditEventType]: event.event_type }, append);
}
