import { randomUUID } from 'node:crypto';
import type { Kysely } from 'kysely';
import { admitStep } from '../admission/admission-pipeline.js';
import type { AdmissibleTool, AdmissionPorts, Denial, Reservation } from '../admission/ports.js';
import type { AgentPrincipal, StepRequest } from '../admission/step.js';
import type { AuditEventInput } from '../audit/audit-event.js';
import { payloadHash } from '../audit/audit-hash.js';
import type { AuditLog } from '../audit/audit-log.js';
import { actorOf } from '../auth/principal.js';
import type { DB } from '../db/schema.js';
import { ApiError, statusForCode, type ErrorCode } from '../http/errors.js';
import type { Metrics } from '../metrics/metrics.js';
import type { BackendClient } from '../proxy/backend-client.js';
import { claimRun, finishRun, resumeThrottledRun, type RunRecord } from './run-repository.js';
import { statusAfter, TERMINAL_STATUSES, type RunEnvelope, type RunRequest, type StepResult } from './run-types.js';

export interface RunExecutorDeps {
  db: Kysely<DB>;
  audit: AuditLog;
  ports: AdmissionPorts;
  backend: BackendClient;
  metrics: Metrics;
  now: () => Date;
}

/** What `POST /runs/execute` answers: the HTTP status of the step that stopped the run, and the envelope. */
export interface RunAnswer {
  httpStatus: number;
  envelope: RunEnvelope;
  replayed: boolean;
}

/** Denials that are security events (SPEC §8) are recorded under their own event type. */
const SECURITY_DENIALS: Partial<Record<ErrorCode, string>> = {
  tool_category_blocked: 'security.category_blocked',
  unauthorized_tool_access: 'security.unauthorized_tool_access',
  egress_denied: 'security.egress_blocked',
};

type CallResult =
  | { ok: true; output: unknown; reportedCostUnits: number | undefined; status: number }
  | { ok: false; code: ErrorCode; message: string; details: Record<string, unknown> };

interface CallContext {
  principal: AgentPrincipal;
  request: RunRequest;
  traceId: string;
}

/**
 * Executes runs: claims the run id, takes each step through admission, dispatches what is
 * admitted with an intent record committed first, and stores the envelope for replays.
 */
export class RunExecutor {
  constructor(private readonly deps: RunExecutorDeps) {}

  async execute(principal: AgentPrincipal, request: RunRequest, traceId: string): Promise<RunAnswer> {
    const call: CallContext = { principal, request, traceId };
    if (request.dry_run) return this.dryRun(call);

    const requestSha256 = payloadHash(request);
    const { claimed, run } = await claimRun(this.deps.db, {
      tenant_id: principal.tenantId,
      run_id: request.run_id,
      agent_id: principal.id,
      parent_run_id: request.parent_run_id,
      pipeline_instance_id: request.pipeline_instance_id,
      session_id: request.session_id,
      user_id: request.user_id,
      request_sha256: requestSha256,
      trace_id: traceId,
      created_at: this.deps.now(),
    });
    let completedBefore: StepResult[] = [];
    if (!claimed) {
      const prior = await this.priorRun(call, run, requestSha256);
      if ('replay' in prior) return prior.replay;
      completedBefore = prior.completed;
    }
    const answer = await this.runSteps(call, completedBefore);
    await finishRun(this.deps.db, principal.tenantId, request.run_id, answer.httpStatus, answer.envelope);
    return answer;
  }

  /**
   * A run id seen before: another principal's is a conflict; the owner's finished run replays;
   * the owner's throttled run continues after its completed steps.
   */
  private async priorRun(call: CallContext, run: RunRecord, requestSha256: string): Promise<{ replay: RunAnswer } | { completed: StepResult[] }> {
    const { principal, request } = call;
    if (run.agent_id !== principal.id) {
      throw new ApiError('run_id_conflict', `run_id ${request.run_id} belongs to another principal`);
    }
    if (run.request_sha256 !== requestSha256) {
      throw new ApiError('run_id_conflict', `run_id ${request.run_id} was used for a different request`, { status: run.status });
    }
    if (TERMINAL_STATUSES.has(run.status) && run.envelope && run.http_status !== null) {
      return { replay: { httpStatus: run.http_status, envelope: run.envelope, replayed: true } };
    }
    if (run.status === 'throttled') {
      const resumed = await resumeThrottledRun(this.deps.db, {
        tenant_id: principal.tenantId,
        run_id: request.run_id,
        agent_id: principal.id,
        request_sha256: requestSha256,
      });
      if (resumed) return { completed: (resumed.envelope?.steps ?? []).filter((s) => s.status === 'completed') };
    }
    throw new ApiError('run_id_conflict', `run ${request.run_id} is ${run.status}; it cannot be executed again now`, { status: run.status });
  }

  private async runSteps(call: CallContext, completedBefore: StepResult[]): Promise<RunAnswer> {
    const { request } = call;
    const steps: StepResult[] = [...completedBefore];
    const warnings: string[] = [];
    for (let index = completedBefore.length; index < request.plan.length; index += 1) {
      const outcome = await this.runStep(call, index, warnings);
      steps.push(outcome.step);
      if (outcome.stop) {
        for (let rest = index + 1; rest < request.plan.length; rest += 1) steps.push(skipped(request, rest));
        const code = outcome.stop.code;
        const envelope: RunEnvelope = { run_id: request.run_id, status: statusAfter(code), dry_run: false, steps, warnings };
        if (outcome.stop.retryAfterSeconds !== undefined) envelope.retry_after_seconds = outcome.stop.retryAfterSeconds;
        return { httpStatus: statusForCode(code), envelope, replayed: false };
      }
    }
    return { httpStatus: 200, envelope: { run_id: request.run_id, status: 'completed', dry_run: false, steps, warnings }, replayed: false };
  }

  private async runStep(call: CallContext, index: number, warnings: string[]): Promise<{ step: StepResult; stop?: { code: ErrorCode; retryAfterSeconds?: number } }> {
    const { principal, request } = call;
    const planned = request.plan[index]!;
    const started = performance.now();
    const admission = await admitStep(this.stepRequest(call, index, false), this.deps.ports);
    this.deps.metrics.admissionDuration.observe((performance.now() - started) / 1000);
    const tool = admission.state.tool;
    const base = this.auditBase(call, index, tool);

    if (!admission.ok) {
      const { denial } = admission;
      this.deps.metrics.decisions.inc({ outcome: 'denied', reason: denial.code });
      const record = await this.deps.audit.append({
        ...base,
        event_type: SECURITY_DENIALS[denial.code] ?? 'run.step.denied',
        status: 'denied',
        reason_code: denial.code,
        details: { stage: admission.verdicts[admission.verdicts.length - 1]?.stage, message: denial.message, ...(denial.details ?? {}) },
      });
      return {
        step: { ...stepHead(request, index, tool), status: 'denied', error: errorOf(denial), cost_units: 0, duration_ms: elapsed(started), audit_id: record.event_id },
        stop: { code: denial.code, ...(denial.retryAfterSeconds !== undefined ? { retryAfterSeconds: denial.retryAfterSeconds } : {}) },
      };
    }

    warnings.push(...admission.state.warnings);
    const admitted = admission.state.tool!;
    const reservation = admission.state.reservation;
    this.deps.metrics.decisions.inc({ outcome: 'admitted', reason: 'ok' });
    const result = await this.dispatch(call, admitted, planned.input, base, reservation, admission.state.grant?.capability_modifiers ?? {});
    const durationMs = elapsed(started);
    if (result.ok) {
      return {
        step: { ...stepHead(request, index, admitted), status: 'completed', output: result.output, cost_units: result.costUnits, duration_ms: durationMs, audit_id: result.auditId },
      };
    }
    return {
      step: { ...stepHead(request, index, admitted), status: 'failed', error: { code: result.code, message: result.message, details: result.details }, cost_units: result.costUnits, duration_ms: durationMs, audit_id: result.auditId },
      stop: { code: result.code },
    };
  }

  /**
   * Step 12. The intent record is committed before the backend is contacted and the outcome
   * record before the answer returns: if either cannot be written, the run stops with 503.
   */
  private async dispatch(
    call: CallContext,
    tool: AdmissibleTool,
    input: unknown,
    base: AuditEventInput,
    reservation: Reservation | undefined,
    grantModifiers: Record<string, unknown>,
  ): Promise<
    | { ok: true; output: unknown; costUnits: number; auditId: string }
    | { ok: false; code: ErrorCode; message: string; details: Record<string, unknown>; costUnits: number; auditId: string | null }
  > {
    const { budgets } = this.deps.ports;
    const inputSha256 = payloadHash(input);
    if (!tool.backend && tool.category !== 'external_call') {
      if (reservation) await budgets.release(reservation);
      const record = await this.deps.audit.append({ ...base, event_type: 'run.step.failed', status: 'failed', reason_code: 'tool_backend_not_configured', input_sha256: inputSha256 });
      return { ok: false, code: 'tool_backend_not_configured', message: `tool ${tool.id}@${tool.version} has no backend configured`, details: {}, costUnits: 0, auditId: record.event_id };
    }
    let headers: Record<string, string> = {};
    try {
      if (tool.backend) headers = this.deps.ports.catalog.backendHeaders(tool);
    } catch (error) {
      // A secret the backend needs is not set on this replica: nothing can be sent.
      if (reservation) await budgets.release(reservation);
      const record = await this.deps.audit.append({ ...base, event_type: 'run.step.failed', status: 'failed', reason_code: 'tool_backend_not_configured', input_sha256: inputSha256 });
      return { ok: false, code: 'tool_backend_not_configured', message: (error as Error).message, details: {}, costUnits: 0, auditId: record.event_id };
    }
    try {
      await this.deps.audit.append({ ...base, event_type: 'run.step.dispatching', status: 'dispatching', input_sha256: inputSha256, cost_units: tool.cost_units });
    } catch (error) {
      if (reservation) await budgets.release(reservation).catch(() => undefined);
      throw error;
    }
    const backendStarted = performance.now();
    const result = await this.callBackend(call, tool, input, base.tool_call_id!, grantModifiers, headers);
    const backendMs = performance.now() - backendStarted;
    this.deps.metrics.backendDuration.observe({ tool_id: tool.id, outcome: result.ok ? 'ok' : result.code }, backendMs / 1000);

    // The backend was contacted: the call costs what it reported, else the contract's price.
    // Settling runs alongside the outcome record: until it lands, the reservation still holds
    // the units, so budgets only err on the strict side meanwhile.
    const costUnits = result.ok ? (result.reportedCostUnits ?? tool.cost_units) : tool.cost_units;
    const settled = reservation ? budgets.settle(reservation, costUnits) : Promise.resolve();

    let outcome: { ok: true; output: unknown } | { ok: false; code: ErrorCode; message: string; details: Record<string, unknown> } = result.ok
      ? { ok: true, output: result.output }
      : { ok: false, code: result.code, message: result.message, details: result.details };
    if (outcome.ok) {
      const validate = this.deps.ports.catalog.validators(tool).output;
      if (!validate(outcome.output)) {
        const errors = (validate.errors ?? []).slice(0, 10).map((e) => ({ path: e.instancePath || '/', message: e.message ?? 'invalid' }));
        outcome = { ok: false, code: 'tool_output_schema_invalid', message: 'the backend output does not match the output schema; it was withheld', details: { errors } };
      }
    }
    const outcomeRecord = this.deps.audit.append({
      ...base,
      event_type: outcome.ok ? 'run.step.completed' : 'run.step.failed',
      status: outcome.ok ? 'completed' : 'failed',
      reason_code: outcome.ok ? null : outcome.code,
      input_sha256: inputSha256,
      output_sha256: result.ok ? payloadHash(result.output) : null,
      duration_ms: backendMs,
      cost_units: costUnits,
      details: outcome.ok ? { reported_cost_units: result.ok ? (result.reportedCostUnits ?? null) : null } : { message: outcome.message, ...outcome.details },
    });
    const [record] = await Promise.all([outcomeRecord, settled]);
    this.deps.metrics.decisions.inc({ outcome: outcome.ok ? 'completed' : 'failed', reason: outcome.ok ? 'ok' : outcome.code });
    return outcome.ok
      ? { ok: true, output: outcome.output, costUnits, auditId: record.event_id }
      : { ...outcome, costUnits, auditId: record.event_id };
  }

  /** The tool's registered backend, or for `external_call` tools the egress executor (SPEC §9). */
  private async callBackend(
    call: CallContext,
    tool: AdmissibleTool,
    input: unknown,
    toolCallId: string,
    grantModifiers: Record<string, unknown>,
    headers: Record<string, string>,
  ): Promise<CallResult> {
    if (tool.category === 'external_call') {
      if (!tool.egress) return { ok: false, code: 'tool_backend_not_configured', message: 'the tool has no egress policy', details: {} };
      const result = await this.deps.ports.egress.execute(input, tool.egress, grantModifiers);
      if (result.ok) return { ok: true, output: result.output, reportedCostUnits: undefined, status: result.output.status };
      return { ok: false, code: result.code, message: `egress ${result.code === 'egress_denied' ? 'refused' : 'failed'}: ${result.reason}`, details: { reason: result.reason, ...result.details } };
    }
    const backend = tool.backend!;
    return this.deps.backend.call(
      { url: backend.url, method: backend.method, timeoutMs: backend.timeout_ms, maxResponseBytes: backend.max_response_bytes, headers },
      input,
      { runId: call.request.run_id, tenantId: call.principal.tenantId, agentId: call.principal.id, toolCallId, traceId: call.traceId },
    );
  }

  /** Steps 1–11 for every step, reserving and dispatching nothing. */
  private async dryRun(call: CallContext): Promise<RunAnswer> {
    const { request } = call;
    const steps: StepResult[] = [];
    const warnings: string[] = [];
    for (let index = 0; index < request.plan.length; index += 1) {
      const started = performance.now();
      const admission = await admitStep(this.stepRequest(call, index, true), this.deps.ports);
      warnings.push(...admission.state.warnings);
      const head = stepHead(request, index, admission.state.tool);
      steps.push(
        admission.ok
          ? { ...head, status: 'admissible', cost_units: admission.state.tool?.cost_units ?? 0, duration_ms: elapsed(started), audit_id: null, verdicts: admission.verdicts }
          : { ...head, status: 'denied', error: errorOf(admission.denial), cost_units: 0, duration_ms: elapsed(started), audit_id: null, verdicts: admission.verdicts },
      );
    }
    const firstDenied = steps.find((s) => s.status === 'denied');
    const envelope: RunEnvelope = {
      run_id: request.run_id,
      status: firstDenied?.error ? statusAfter(firstDenied.error.code) : 'completed',
      dry_run: true,
      steps,
      warnings,
    };
    return { httpStatus: 200, envelope, replayed: false };
  }

  private stepRequest(call: CallContext, index: number, dryRun: boolean): StepRequest {
    const { principal, request } = call;
    const planned = request.plan[index]!;
    return {
      principal,
      run: {
        run_id: request.run_id,
        parent_run_id: request.parent_run_id,
        pipeline_instance_id: request.pipeline_instance_id,
        session_id: request.session_id,
        user_id: request.user_id,
        context: request.context,
        budget_units: request.budget_units,
      },
      step: { index, tool_id: planned.tool_id, version: planned.version, input: planned.input },
      dryRun,
    };
  }

  private auditBase(call: CallContext, index: number, tool: AdmissibleTool | undefined): AuditEventInput & { tool_call_id: string } {
    const { principal, request, traceId } = call;
    const context = request.context;
    const text = (value: unknown) => (typeof value === 'string' ? value : null);
    return {
      event_type: 'run.step',
      actor: actorOf(principal),
      tenant_id: principal.tenantId,
      agent_id: principal.id,
      run_id: request.run_id,
      tool_call_id: `${request.run_id}:${index}:${randomUUID()}`,
      tool_id: tool?.id ?? request.plan[index]!.tool_id,
      tool_version: tool?.version ?? null,
      tool_category: tool?.category ?? null,
      risk_level: tool?.risk_level ?? null,
      trace_id: traceId,
      organization_id: text(context.organization_id),
      assessment_id: text(context.assessment_id),
      details: {},
    };
  }
}

function stepHead(request: RunRequest, index: number, tool: AdmissibleTool | undefined): Pick<StepResult, 'index' | 'tool_id' | 'version'> {
  return { index, tool_id: request.plan[index]!.tool_id, version: tool?.version ?? null };
}

function skipped(request: RunRequest, index: number): StepResult {
  return { ...stepHead(request, index, undefined), status: 'skipped', cost_units: 0, duration_ms: 0, audit_id: null };
}

function errorOf(denial: Denial) {
  return { code: denial.code, message: denial.message, details: denial.details ?? {} };
}

function elapsed(started: number): number {
  return Math.round((performance.now() - started) * 1000) / 1000;
}
