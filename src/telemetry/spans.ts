import type { EventEmitter } from 'node:events';
import {
  context,
  isSpanContextValid,
  propagation,
  SpanKind,
  SpanStatusCode,
  trace,
  type Attributes,
  type Span,
} from '@opentelemetry/api';

/**
 * The spans the domain rooms make, through the OpenTelemetry API only: with no SDK started (traces
 * off) the API's no-op tracer answers, and each helper costs a function call. Attribute values
 * name who and what, never a payload, a token or a secret (docs/operations.md#traces).
 */

const TRACER_NAME = 'toolgate';
const tracer = trace.getTracer(TRACER_NAME);

export type { Span } from '@opentelemetry/api';

/** The attribute names toolgate sets, the GenAI ones as the OpenTelemetry conventions spell them. */
export const ATTRIBUTES = {
  operation: 'gen_ai.operation.name',
  toolName: 'gen_ai.tool.name',
  toolCallId: 'gen_ai.tool.call.id',
  agent: 'gen_ai.agent.id',
  errorType: 'error.type',
  tenant: 'toolgate.tenant.id',
  run: 'toolgate.run.id',
  step: 'toolgate.step.index',
  stepStatus: 'toolgate.step.status',
  toolVersion: 'toolgate.tool.version',
  decision: 'toolgate.decision',
  stage: 'toolgate.admission.stage',
  reasonCode: 'toolgate.reason_code',
  via: 'toolgate.via',
  auditEventType: 'toolgate.audit.event_type',
} as const;

/** Runs `fn` in a new span, a child of the active one, ending it when `fn` settles (an error it throws recorded). */
export function inSpan<T>(
  name: string,
  attributes: Attributes,
  fn: (span: Span) => Promise<T>,
  kind: SpanKind = SpanKind.INTERNAL,
): Promise<T> {
  return tracer.startActiveSpan(name, { kind, attributes }, async (span) => {
    try {
      return await fn(span);
    } catch (error) {
      failed(span, error);
      throw error;
    } finally {
      span.end();
    }
  });
}

/** A client span: the backend call, whose id the backend receives in `traceparent`. */
export function inClientSpan<T>(name: string, attributes: Attributes, fn: (span: Span) => Promise<T>): Promise<T> {
  return inSpan(name, attributes, fn, SpanKind.CLIENT);
}

/** A tool call in the GenAI conventions: `execute_tool {tool}`. */
export function inToolSpan<T>(
  call: { toolId: string; tenantId: string; agentId: string; runId: string; step: number; via?: string | undefined },
  fn: (span: Span) => Promise<T>,
): Promise<T> {
  return inSpan(
    `execute_tool ${call.toolId}`,
    {
      [ATTRIBUTES.operation]: 'execute_tool',
      [ATTRIBUTES.toolName]: call.toolId,
      [ATTRIBUTES.tenant]: call.tenantId,
      [ATTRIBUTES.agent]: call.agentId,
      [ATTRIBUTES.run]: call.runId,
      [ATTRIBUTES.step]: call.step,
      ...(call.via ? { [ATTRIBUTES.via]: call.via } : {}),
    },
    fn,
  );
}

/** Adds attributes to the active span (a tool call's id, known once its admission named the tool's version). */
export function describeActiveSpan(attributes: Attributes): void {
  trace.getActiveSpan()?.setAttributes(attributes);
}

/** Marks a span as ended by an error code (a refusal, a backend failure): `error.type` and an error status. */
export function endedWith(span: Span, code: string, message?: string): void {
  span.setAttribute(ATTRIBUTES.errorType, code);
  span.setStatus({ code: SpanStatusCode.ERROR, ...(message ? { message } : {}) });
}

/** The W3C `traceparent` naming this span as the parent, or undefined when the span has no valid context (traces off). */
export function traceparentOf(span: Span): string | undefined {
  const ids = span.spanContext();
  if (!isSpanContextValid(ids)) return undefined;
  return `00-${ids.traceId}-${ids.spanId}-${ids.traceFlags.toString(16).padStart(2, '0')}`;
}

/** The trace and span ids of the active span, for log lines; empty outside any span. */
export function activeTraceFields(): { trace_id?: string; span_id?: string } {
  const ids = trace.getActiveSpan()?.spanContext();
  return ids && isSpanContextValid(ids) ? { trace_id: ids.traceId, span_id: ids.spanId } : {};
}

/**
 * Runs `fn` with a remote parent from a W3C `traceparent` (an MCP call's `_meta.traceparent`), so
 * that its spans continue the caller's trace; with none valid, in the active context as it is.
 */
export function withRemoteParent<T>(traceparent: unknown, fn: () => T): T {
  if (typeof traceparent !== 'string') return fn();
  const parent = propagation.extract(context.active(), { traceparent });
  return parent === context.active() ? fn() : context.with(parent, fn);
}

/** A request's server span, and the context the rest of the request runs in. */
export interface ServerSpan {
  /** Undefined when the span has no valid context (the SDK was not started). */
  readonly traceId: string | undefined;
  /** Runs `fn` with this span active. */
  run<T>(fn: () => T): T;
  /** Makes the listeners later added to `emitter` run with this span active (a request body's `data` and `end`). */
  bind(emitter: EventEmitter): void;
  /** Ends the span with the response's status; a 5xx is an error. Only the first call counts. */
  end(statusCode: number | undefined): void;
}

/** Starts a server span continuing the W3C trace the request's headers carry, if any. */
export function startServerSpan(
  name: string,
  headers: Record<string, string | string[] | undefined>,
  attributes: Attributes,
): ServerSpan {
  const parent = propagation.extract(context.active(), headers);
  const span = tracer.startSpan(name, { kind: SpanKind.SERVER, attributes }, parent);
  const active = trace.setSpan(parent, span);
  let ended = false;
  return {
    traceId: isSpanContextValid(span.spanContext()) ? span.spanContext().traceId : undefined,
    run: (fn) => context.with(active, fn),
    bind: (emitter) => {
      context.bind(active, emitter);
    },
    end: (statusCode) => {
      if (ended) return;
      ended = true;
      if (statusCode !== undefined) span.setAttribute('http.response.status_code', statusCode);
      if (statusCode === undefined || statusCode >= 500) span.setStatus({ code: SpanStatusCode.ERROR });
      span.end();
    },
  };
}

function failed(span: Span, error: unknown): void {
  // The error's class only: its message may quote a value.
  span.setAttribute(ATTRIBUTES.errorType, error instanceof Error ? error.name : 'error');
  span.setStatus({ code: SpanStatusCode.ERROR });
}
