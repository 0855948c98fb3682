import { randomUUID } from 'node:crypto';
import type { AdmissibleTool, Reservation } from '../admission/ports.js';
import type { AuditEventInput } from '../audit/audit-event.js';
import { payloadHash, type CanonicalPayload } from '../audit/audit-hash.js';
import { settlementOf } from '../budgets/budget-reservation.js';
import { MAX_UNITS } from '../budgets/budget-units.js';
import { jsonProblem } from '../db/json-limits.js';
import { CodedError } from '../errors/coded-error.js';
import type { ErrorCode } from '../errors/error-codes.js';
import { callEnd } from './run-end-rider.js';
import type { ClaimedRunStart, ClaimedRunStartAnswer } from './run-claim-repository.js';
import type { RunEnding } from './run-end-repository.js';
import { SECURITY_DENIALS, auditSpan, type Dispatched, type Execution, type RunExecutorDeps } from './execution.js';
import { endedWith, inClientSpan, traceparentOf } from '../telemetry/spans.js';

type CallResult =
  | { ok: true; output: unknown; reportedCostUnits: number | undefined; status: number }
  | { ok: false; code: ErrorCode; message: string; details: Record<string, unknown> };

/** Sends an admitted call to its backend between its intent record and its outcome record. */
export class Dispatcher {
  constructor(private readonly deps: RunExecutorDeps) {}

  /**
   * Step 12. The intent record is committed before the backend is contacted and the outcome
   * record before the answer returns: if either cannot be written, the run stops with 503.
   */
  async dispatch(
    exec: Execution,
    tool: AdmissibleTool,
    canonicalInput: CanonicalPayload,
    base: AuditEventInput & { tool_call_id: string },
    reservation: Reservation | undefined,
    grantModifiers: Record<string, unknown>,
    approvalId: string | undefined,
    end?: (result: Dispatched) => RunEnding | undefined,
    claimWith?: ClaimedRunStart,
  ): Promise<(Dispatched & { runEnded?: boolean }) | { unclaimed: ClaimedRunStartAnswer }> {
    const { budgets } = this.deps.ports;
    const input = canonicalInput.value;
    // Hashed once for the call (by the approval stage, for a tool that needs one); its records cite it.
    const inputSha256 = canonicalInput.sha256;
    const details = { ...base.details, ...(approvalId ? { approval_id: approvalId } : {}) };
    // Nothing can be sent: refused on record, its reservation given back.
    const notConfigured = async (message: string): Promise<Dispatched | { unclaimed: ClaimedRunStartAnswer }> => {
      // A run not claimed yet is claimed the usual way first, and its call decided again there.
      if (claimWith) return { unclaimed: { claimed: false, relied: false } };
      if (reservation) await budgets.release(reservation);
      const record = await this.deps.audit.append({
        ...base,
        event_type: 'run.step.failed',
        status: 'failed',
        reason_code: 'tool_backend_not_configured',
        input_sha256: inputSha256,
        details,
      });
      return {
        ok: false,
        code: 'tool_backend_not_configured',
        message,
        details: {},
        costUnits: 0,
        auditId: record.event_id,
      };
    };
    if (!tool.backend && tool.category !== 'external_call')
      return notConfigured(`tool ${tool.id}@${tool.version} has no backend configured`);
    let headers: Record<string, string> = {};
    try {
      if (tool.backend) headers = this.deps.ports.catalog.backendHeaders(tool);
    } catch (error) {
      // A secret the backend needs is not set on this replica.
      return notConfigured((error as Error).message);
    }
    try {
      if (!this.deps.lease.valid()) {
        // Another replica may already have ended this replica's runs as lost.
        throw new CodedError(
          'gateway_unavailable',
          'this replica could not renew its lease in time; it dispatches nothing until it can',
        );
      }
      const intent: AuditEventInput = {
        ...base,
        event_type: 'run.step.dispatching',
        status: 'dispatching',
        input_sha256: inputSha256,
        cost_units: tool.cost_units,
        details: withReservation(details, reservation),
      };
      if (claimWith) {
        // The run is claimed with this record, and with its grant use and reservation: all of it, or none.
        const { record, answer } = await auditSpan(intent, () =>
          this.deps.audit.appendIf(intent, randomUUID(), claimWith),
        );
        if (!record) return { unclaimed: answer ?? { claimed: false, relied: false } };
      } else await auditSpan(intent, () => this.deps.audit.append(intent));
    } catch (error) {
      // A reservation decided before its run's claim was written with it, or not at all.
      if (reservation && !claimWith) await budgets.release(reservation).catch(() => undefined);
      throw error;
    }
    const backendStarted = performance.now();
    let result = await this.callBackend(exec, tool, input, base.tool_call_id, grantModifiers, headers);
    const unstorable = result.ok ? jsonProblem(result.output, 'output') : undefined;
    if (unstorable) {
      // An answer no record could hold or hash: the backend failed, and its output is withheld.
      result = {
        ok: false,
        code: 'tool_backend_failed',
        message: `the backend answered JSON that cannot be kept: ${unstorable.path} ${unstorable.message}`,
        details: { reason: 'output_not_storable', path: unstorable.path },
      };
    }
    const backendMs = performance.now() - backendStarted;
    this.deps.metrics.backendDuration.observe(
      { tool_id: tool.id, outcome: result.ok ? 'ok' : result.code },
      backendMs / 1000,
    );

    // The backend was contacted: the call costs what it reported, else the contract's price —
    // at most the grant's `max_cost_units` (the most one call may be charged; the cost stage
    // refused a price above it) and MAX_UNITS (what any one amount may be). The settlement
    // rides the outcome record: until it lands, the reservation still holds the units.
    const reported = result.ok ? result.reportedCostUnits : undefined;
    const cap = Math.min(
      typeof grantModifiers.max_cost_units === 'number' ? grantModifiers.max_cost_units : MAX_UNITS,
      MAX_UNITS,
    );
    const costUnits = reported === undefined ? tool.cost_units : Math.min(reported, cap);

    let outcome:
      | { ok: true; output: unknown }
      | { ok: false; code: ErrorCode; message: string; details: Record<string, unknown> } = result.ok
      ? { ok: true, output: result.output }
      : { ok: false, code: result.code, message: result.message, details: result.details };
    if (outcome.ok) {
      const validate = this.deps.ports.catalog.validators(tool).output;
      if (!validate(outcome.output)) {
        const errors = (validate.errors ?? [])
          .slice(0, 10)
          .map((e) => ({ path: e.instancePath || '/', message: e.message ?? 'invalid' }));
        outcome = {
          ok: false,
          code: 'tool_output_schema_invalid',
          message: 'the backend output does not match the output schema; it was withheld',
          details: { errors },
        };
      }
    }
    const eventId = randomUUID();
    const dispatched: Dispatched = outcome.ok
      ? { ok: true, output: outcome.output, costUnits, auditId: eventId }
      : { ...outcome, costUnits, auditId: eventId };
    // The call's last record: the settlement, and the run's end when it ends the run, go in the same commit.
    const outcomeEvent: AuditEventInput = {
      ...base,
      // Egress refused at a redirect hop is the same security event as at the input stage.
      event_type: outcome.ok ? 'run.step.completed' : (SECURITY_DENIALS[outcome.code] ?? 'run.step.failed'),
      status: outcome.ok ? 'completed' : 'failed',
      reason_code: outcome.ok ? null : outcome.code,
      input_sha256: inputSha256,
      output_sha256: result.ok ? payloadHash(result.output) : null,
      duration_ms: backendMs,
      cost_units: costUnits,
      // The reservation it settles: a settlement lost with its replica is made from this record.
      details: outcome.ok
        ? {
            ...withReservation(details, reservation),
            ...(reported !== undefined ? { reported_cost_units: reported } : {}),
            ...(reported !== undefined && reported > cap ? { reported_cost_capped: true, charged_at_most: cap } : {}),
          }
        : { ...withReservation(details, reservation), message: outcome.message, ...outcome.details },
    };
    const { answer } = await auditSpan(outcomeEvent, () =>
      this.deps.audit.appendCarrying(
        outcomeEvent,
        eventId,
        callEnd(end?.(dispatched), reservation ? [settlementOf(reservation, costUnits)] : []),
      ),
    );
    // A settlement the record could not carry (its reservation changed meanwhile) is made apart.
    const settlement =
      reservation && answer?.closed[0] === undefined ? await budgets.settle(reservation, costUnits) : answer?.closed[0];
    if (settlement === 'settled_after_expiry') {
      // Its units had been given back as abandoned meanwhile: the call is charged all the same.
      // (Recorded after the outcome, and after the run's end when that went with the outcome.)
      await this.deps.audit.append({
        ...base,
        event_type: 'budget.reservation_settled_late',
        status: 'settled',
        cost_units: costUnits,
        details: {
          ...details,
          reservation_id: reservation!.id,
          reserved_units: reservation!.units,
          charged_units: costUnits,
        },
      });
    }
    this.deps.metrics.decisions.inc({
      outcome: outcome.ok ? 'completed' : 'failed',
      reason: outcome.ok ? 'ok' : outcome.code,
    });
    return { ...dispatched, runEnded: answer?.ended === true };
  }

  /**
   * The tool's registered backend, or for `external_call` tools the egress executor, in a client
   * span: the `traceparent` a backend receives names it. Its attributes name the backend's host and
   * path, never the query (a GET call's input travels there).
   */
  callBackend(
    exec: Execution,
    tool: AdmissibleTool,
    input: unknown,
    toolCallId: string,
    grantModifiers: Record<string, unknown>,
    headers: Record<string, string>,
  ): Promise<CallResult> {
    const target = tool.backend ? new URL(tool.backend.url) : undefined;
    const method = tool.backend ? tool.backend.method.toUpperCase() : 'egress';
    return inClientSpan(
      `${method} ${tool.id}`,
      target
        ? {
            'http.request.method': method,
            'server.address': target.hostname,
            'server.port': Number(target.port) || (target.protocol === 'https:' ? 443 : 80),
            'url.scheme': target.protocol.slice(0, -1),
            'url.path': target.pathname,
          }
        : { 'toolgate.egress': true },
      async (span) => {
        const result = await this.callTarget(
          exec,
          tool,
          input,
          toolCallId,
          grantModifiers,
          headers,
          traceparentOf(span),
        );
        if (result.ok) span.setAttribute('http.response.status_code', result.status);
        else {
          const status = result.details.backend_status;
          if (typeof status === 'number') span.setAttribute('http.response.status_code', status);
          endedWith(span, result.code);
        }
        return result;
      },
    );
  }

  private async callTarget(
    exec: Execution,
    tool: AdmissibleTool,
    input: unknown,
    toolCallId: string,
    grantModifiers: Record<string, unknown>,
    headers: Record<string, string>,
    traceparent: string | undefined,
  ): Promise<CallResult> {
    if (tool.category === 'external_call') {
      if (!tool.egress)
        return {
          ok: false,
          code: 'tool_backend_not_configured',
          message: 'the tool has no egress policy',
          details: {},
        };
      const result = await this.deps.ports.egress.execute(input, tool.egress, grantModifiers);
      if (result.ok)
        return { ok: true, output: result.output, reportedCostUnits: undefined, status: result.output.status };
      return {
        ok: false,
        code: result.code,
        message: `egress ${result.code === 'egress_denied' ? 'refused' : 'failed'}: ${result.reason}`,
        details: { reason: result.reason, ...result.details },
      };
    }
    const backend = tool.backend!;
    return this.deps.backend.call(
      {
        url: backend.url,
        method: backend.method,
        timeoutMs: backend.timeout_ms,
        maxResponseBytes: backend.max_response_bytes,
        headers,
      },
      input,
      {
        runId: exec.request.run_id,
        tenantId: exec.principal.tenantId,
        agentId: exec.principal.id,
        toolCallId,
        traceId: exec.traceId,
        traceparent,
      },
    );
  }
}

/** A call's record details naming the budget reservation it holds, if it holds one. */
function withReservation(
  details: Record<string, unknown>,
  reservation: Reservation | undefined,
): Record<string, unknown> {
  return reservation ? { ...details, reservation_id: reservation.id } : details;
}
