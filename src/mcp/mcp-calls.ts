import { randomUUID } from 'node:crypto';
import { ProtocolError, ProtocolErrorCode, type CallToolResult } from '@modelcontextprotocol/server';
import { z } from 'zod';
import type { ErrorCode } from '../errors/error-codes.js';
import { positiveUnits } from '../validation/values.js';
import { MCP_NAME_PATTERN } from '../registry/mcp-names.js';
import { identifier, runContext, toolId, versionRange } from '../validation/fields.js';
import type { RunAnswer } from '../runs/run-types.js';
import type { RunRequest, RunStatus } from '../runs/run-types.js';

/** The request `_meta` key carrying the run's fields (docs/mcp.md#connecting). */
export const RUN_META_KEY = 'dev.toolgate/run';
/** The result `_meta` key carrying what became of the call. */
export const RESULT_META_KEY = 'dev.toolgate/result';

const runMeta = z.strictObject({
  run_id: identifier.optional(),
  parent_run_id: identifier.optional(),
  version: versionRange.optional(),
  context: runContext.optional(),
  budget_units: positiveUnits.optional(),
  session_id: identifier.optional(),
  user_id: identifier.optional(),
  pipeline_instance_id: identifier.optional(),
});

/** Run fields sent as HTTP headers, by clients whose tool wrappers cannot send `_meta` (SPEC §12.1). */
export interface HeaderRunFields {
  run_id?: string;
  context?: Record<string, unknown>;
  budget_units?: number;
}

/** The headers that carry run fields, lowercase as Node gives them. */
export const RUN_HEADERS = {
  run_id: 'toolgate-run-id',
  context: 'toolgate-context',
  budget_units: 'toolgate-budget-units',
} as const;

const HEADER_NAMES: Record<keyof HeaderRunFields, string> = {
  run_id: 'Toolgate-Run-Id',
  context: 'Toolgate-Context',
  budget_units: 'Toolgate-Budget-Units',
};

/**
 * The run fields an HTTP request's headers carry, or what is wrong with the first that is malformed
 * (a client's configuration error, named so it can be fixed).
 */
export function headerRunFieldsOf(
  headers: Record<string, string | string[] | undefined>,
): { ok: true; fields: HeaderRunFields } | { ok: false; message: string } {
  const fields: HeaderRunFields = {};
  const problem = (field: keyof HeaderRunFields, message: string) => ({
    ok: false as const,
    message: `${HEADER_NAMES[field]} header: ${message}`,
  });
  for (const field of Object.keys(RUN_HEADERS) as Array<keyof HeaderRunFields>) {
    const raw = headers[RUN_HEADERS[field]];
    if (raw === undefined) continue;
    if (Array.isArray(raw)) return problem(field, 'sent more than once');
    const value = raw.trim();
    if (field === 'run_id') {
      const parsed = identifier.safeParse(value);
      if (!parsed.success) return problem(field, parsed.error.issues[0]?.message ?? 'not a run id');
      fields.run_id = parsed.data;
    } else if (field === 'budget_units') {
      // A plain decimal number: `Number` alone would take `0x10`, `1e3` or an empty string.
      const parsed = /^\d+(?:\.\d+)?$/.test(value) ? positiveUnits.safeParse(Number(value)) : undefined;
      if (!parsed?.success) return problem(field, 'must be a positive number of units, such as 25 or 0.5');
      fields.budget_units = parsed.data;
    } else {
      let context: unknown;
      try {
        context = JSON.parse(value);
      } catch {
        return problem(field, 'must be a JSON object, such as {"user_id":"u-1"}');
      }
      if (typeof context !== 'object' || context === null || Array.isArray(context))
        return problem(field, 'must be a JSON object, such as {"user_id":"u-1"}');
      fields.context = context as Record<string, unknown>;
    }
  }
  return { ok: true, fields };
}

/**
 * A `tools/call` as the one-step run `POST /runs/execute` would get: `name` is the tool id,
 * `arguments` the input, the rest from `_meta["dev.toolgate/run"]` over the request's run headers
 * (field by field; the two contexts merge, `_meta`'s winning per key); a fresh run id when none is
 * given. Malformed run fields are the client's error (`-32602`), not the model's.
 */
export function runRequestOf(
  name: string,
  args: Record<string, unknown> | undefined,
  meta: Record<string, unknown> | undefined,
  headerFields: HeaderRunFields = {},
): RunRequest {
  // Bounded as REST bounds `plan[].tool_id`: the id reaches indexed columns (docs/operations.md#input-bounds).
  const tool = toolId.safeParse(name);
  // A well-formed MCP tool name no tool has (ids hold no `-`): unknown, as the SDK says of any name it lacks.
  if (!tool.success && MCP_NAME_PATTERN.test(name)) throw unknownTool(name);
  if (!tool.success)
    throw new ProtocolError(
      ProtocolErrorCode.InvalidParams,
      `params.name: ${tool.error.issues[0]?.message ?? 'invalid'}`,
    );
  const parsed = runMeta.safeParse(meta?.[RUN_META_KEY] ?? {});
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const where = issue && issue.path.length > 0 ? `.${issue.path.join('.')}` : '';
    throw new ProtocolError(
      ProtocolErrorCode.InvalidParams,
      `_meta["${RUN_META_KEY}"]${where}: ${issue?.message ?? 'invalid'}`,
    );
  }
  const { run_id, version, context, ...fields } = parsed.data;
  // Absent fields stay absent: the same call over REST hashes the same, and replays the same.
  const present = Object.fromEntries(Object.entries(fields).filter(([, value]) => value !== undefined));
  return {
    run_id: run_id ?? headerFields.run_id ?? `mcp-${randomUUID()}`,
    ...(headerFields.budget_units !== undefined ? { budget_units: headerFields.budget_units } : {}),
    ...present,
    context: { ...headerFields.context, ...context },
    plan: [{ tool_id: name, ...(version !== undefined ? { version } : {}), input: args ?? {} }],
  };
}

/** A W3C trace id from `_meta.traceparent`, when it holds a valid one. */
export function traceIdOfMeta(meta: Record<string, unknown> | undefined): string | undefined {
  const value = meta?.traceparent;
  const match =
    typeof value === 'string'
      ? /^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$/.exec(value.trim().toLowerCase())
      : null;
  return match?.[1] && !/^0+$/.test(match[1]) ? match[1] : undefined;
}

/** Codes that mean the tool does not exist for this agent: the call is answered as for a tool that is not there. */
const NOT_THERE: ReadonlySet<string> = new Set<ErrorCode>([
  'tool_not_registered',
  'tool_category_blocked',
  'unauthorized_tool_access',
]);

/** What a refusal says to the model, and the machine-readable part beside it. */
export interface Refusal {
  runId: string;
  status: RunStatus | 'rejected';
  code: string;
  message: string;
  retryAfterSeconds?: number | undefined;
  approvalId?: string | undefined;
  /** Field-level input errors (as REST's `details.errors`), so that a model can correct its arguments. */
  errors?: InputError[] | undefined;
  /**
   * Whether the errors may also travel as `structuredContent`. Not for a tool that advertises an
   * output schema: the SDK v1 client checks `structuredContent` against it even in an `isError` result.
   */
  structured?: boolean;
}

/** One field-level input error: a JSON pointer into the arguments and what is wrong there. */
export interface InputError {
  path: string;
  message: string;
}

/**
 * The MCP answer to a run's envelope: its output, or an `isError` result naming the code of the
 * step that stopped it. A tool that does not exist for the agent is `-32602`; an outage `-32603`.
 */
export function callResultOf(
  toolId: string,
  answer: RunAnswer,
  options: { advertisesOutput: boolean } = { advertisesOutput: false },
): CallToolResult {
  const { envelope } = answer;
  const step = envelope.steps[0];
  if (envelope.status === 'completed' && step?.status === 'completed') {
    const output = step.output;
    return {
      content: [{ type: 'text', text: JSON.stringify(output) }],
      ...(isPlainObject(output) ? { structuredContent: output } : {}),
      isError: false,
      _meta: {
        [RESULT_META_KEY]: {
          run_id: envelope.run_id,
          status: envelope.status,
          ...(answer.replayed ? { replayed: true } : {}),
        },
      },
    };
  }
  if (envelope.status === 'awaiting_approval')
    return awaitingApproval(envelope.run_id, envelope.steps.find((s) => s.status === 'awaiting_approval')?.approval_id);
  const error = envelope.steps.find((s) => s.error)?.error;
  const code = error?.code ?? envelope.status;
  if (NOT_THERE.has(code)) throw unknownTool(toolId);
  if (code === 'gateway_unavailable') throw unavailable(error?.message);
  return refusalResult({
    runId: envelope.run_id,
    status: envelope.status,
    code,
    message: error?.message ?? `the run is ${envelope.status}`,
    retryAfterSeconds: envelope.retry_after_seconds,
    errors: inputErrorsOf(error?.details.errors),
    structured: !options.advertisesOutput,
  });
}

function inputErrorsOf(value: unknown): InputError[] | undefined {
  if (!Array.isArray(value) || value.length === 0) return undefined;
  return value.map((e: { path?: unknown; message?: unknown }) => ({
    path: typeof e.path === 'string' ? e.path : '/',
    message: typeof e.message === 'string' ? e.message : 'invalid',
  }));
}

/** A call held for an operator's approval: the same call again, once approved, runs (SPEC §12.1). */
export function awaitingApproval(runId: string, approvalId: string | undefined): CallToolResult {
  return refusalResult({
    runId,
    status: 'awaiting_approval',
    code: 'awaiting_approval',
    message: `the call waits for an operator's approval${approvalId ? ` (${approvalId})` : ''}; once approved, make the same call again (same tool, arguments and context) and it runs`,
    approvalId,
  });
}

/** An `isError` tool result the model reads: `"<code>: <message>"`, with the code for machines in `_meta`. */
export function refusalResult(refusal: Refusal): CallToolResult {
  const { errors } = refusal;
  const fields = errors ? `: ${errors.map((e) => `${e.path} ${e.message}`).join('; ')}` : '';
  return {
    content: [{ type: 'text', text: `${refusal.code}: ${refusal.message}${fields}` }],
    ...(errors && refusal.structured
      ? { structuredContent: { code: refusal.code, message: refusal.message, errors } }
      : {}),
    isError: true,
    _meta: {
      [RESULT_META_KEY]: {
        run_id: refusal.runId,
        status: refusal.status,
        code: refusal.code,
        ...(refusal.retryAfterSeconds !== undefined ? { retry_after_seconds: refusal.retryAfterSeconds } : {}),
        ...(refusal.approvalId !== undefined ? { approval_id: refusal.approvalId } : {}),
        ...(errors ? { errors } : {}),
      },
    },
  };
}

export function unknownTool(toolId: string): ProtocolError {
  return new ProtocolError(ProtocolErrorCode.InvalidParams, `Unknown tool: ${toolId}`);
}

/** Nothing was dispatched: the gateway could not decide (its database or its registry copy is away). */
export function unavailable(message = 'the gateway cannot reach its database; nothing was done'): ProtocolError {
  return new ProtocolError(ProtocolErrorCode.InternalError, `gateway_unavailable: ${message}`);
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
