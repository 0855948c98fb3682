import { randomUUID } from 'node:crypto';
import { ProtocolError, ProtocolErrorCode, type CallToolResult } from '@modelcontextprotocol/server';
import { z } from 'zod';
import type { ErrorCode } from '../errors/error-codes.js';
import { positiveUnits } from '../validation/values.js';
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

/**
 * A `tools/call` as the one-step run `POST /runs/execute` would get: `name` is the tool id,
 * `arguments` the input, the rest from `_meta["dev.toolgate/run"]`; a fresh run id when none is
 * given. Malformed run fields are the client's error (`-32602`), not the model's.
 */
export function runRequestOf(
  name: string,
  args: Record<string, unknown> | undefined,
  meta: Record<string, unknown> | undefined,
): RunRequest {
  // Bounded as REST bounds `plan[].tool_id`: the id reaches indexed columns (docs/operations.md#input-bounds).
  const tool = toolId.safeParse(name);
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
    run_id: run_id ?? `mcp-${randomUUID()}`,
    ...present,
    context: context ?? {},
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
}

/**
 * The MCP answer to a run's envelope: its output, or an `isError` result naming the code of the
 * step that stopped it. A tool that does not exist for the agent is `-32602`; an outage `-32603`.
 */
export function callResultOf(toolId: string, answer: RunAnswer): CallToolResult {
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
  if (envelope.status === 'awaiting_approval') {
    const approvalId = envelope.steps.find((s) => s.status === 'awaiting_approval')?.approval_id;
    return refusalResult({
      runId: envelope.run_id,
      status: envelope.status,
      code: 'awaiting_approval',
      message: `the call waits for an operator's approval${approvalId ? ` (${approvalId})` : ''}; once approved, make the same call again with run_id ${envelope.run_id}`,
      approvalId,
    });
  }
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
  });
}

/** An `isError` tool result the model reads: `"<code>: <message>"`, with the code for machines in `_meta`. */
export function refusalResult(refusal: Refusal): CallToolResult {
  return {
    content: [{ type: 'text', text: `${refusal.code}: ${refusal.message}` }],
    isError: true,
    _meta: {
      [RESULT_META_KEY]: {
        run_id: refusal.runId,
        status: refusal.status,
        code: refusal.code,
        ...(refusal.retryAfterSeconds !== undefined ? { retry_after_seconds: refusal.retryAfterSeconds } : {}),
        ...(refusal.approvalId !== undefined ? { approval_id: refusal.approvalId } : {}),
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
