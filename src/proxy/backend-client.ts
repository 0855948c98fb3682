import { customAlphabet } from 'nanoid';
import { Agent, errors as undiciErrors, request, type Dispatcher } from 'undici';
import { urlWithInputQuery } from './backend-query.js';

/** Where and how a tool's backend is called (the resolved form of the contract's `backend`). */
export interface BackendTarget {
  url: string;
  method: string;
  timeoutMs: number;
  maxResponseBytes: number;
  /** Header values with secrets already resolved; never logged. */
  headers: Record<string, string>;
}

/** Who the call is for: sent to the backend as headers, and the W3C trace to continue. */
export interface CallAttribution {
  runId: string;
  tenantId: string;
  agentId: string;
  toolCallId: string;
  traceId: string;
  /** The backend call's client span as a W3C parent, when traces are on; else a fresh parent id in `traceId`. */
  traceparent?: string | undefined;
}

export type DispatchResult =
  | { ok: true; output: unknown; reportedCostUnits: number | undefined; status: number }
  | {
      ok: false;
      code: 'tool_backend_timeout' | 'tool_backend_failed';
      message: string;
      details: Record<string, unknown>;
    };

/** A backend may report what a call actually cost in this response header. */
export const COST_HEADER = 'x-toolgate-cost-units';

class ResponseTooLarge extends Error {}

/** A W3C parent id: 8 random bytes in hex, from nanoid's pool (one randomBytes call costs microseconds). */
const spanId = customAlphabet('0123456789abcdef', 16);

/**
 * Calls tool backends over keep-alive connection pools (one per origin, held by an undici
 * Agent), with the tool's deadline covering the whole exchange and a cap on the response size.
 * Failures are values: the pipeline turns them into step outcomes.
 */
export class BackendClient {
  private readonly agent: Agent;

  constructor(options: { connectionsPerOrigin?: number; dispatcher?: Agent } = {}) {
    this.agent =
      options.dispatcher ??
      new Agent({ connections: options.connectionsPerOrigin ?? 64, keepAliveTimeout: 10_000, pipelining: 1 });
  }

  async call(target: BackendTarget, input: unknown, who: CallAttribution): Promise<DispatchResult> {
    const method = target.method.toUpperCase() as Dispatcher.HttpMethod;
    const hasBody = method !== 'GET' && method !== 'HEAD';
    // Without a body the input travels in the query, after the registered URL's own parameters,
    // which it can never replace (see backend-query.ts).
    const url = hasBody ? new URL(target.url) : urlWithInputQuery(target.url, input).url;
    const signal = AbortSignal.timeout(target.timeoutMs);
    try {
      const response = await request(url, {
        dispatcher: this.agent,
        method,
        signal,
        headers: {
          ...target.headers,
          accept: 'application/json',
          ...(hasBody ? { 'content-type': 'application/json' } : {}),
          traceparent: who.traceparent ?? `00-${who.traceId}-${spanId()}-01`,
          'x-toolgate-run-id': who.runId,
          'x-toolgate-tenant-id': who.tenantId,
          'x-toolgate-agent-id': who.agentId,
          'x-toolgate-tool-call-id': who.toolCallId,
        },
        ...(hasBody ? { body: JSON.stringify(input ?? null) } : {}),
      });
      const text = await readCapped(response.body, target.maxResponseBytes);
      if (response.statusCode < 200 || response.statusCode >= 300) {
        return failed(`the backend answered HTTP ${response.statusCode}`, { backend_status: response.statusCode });
      }
      const contentType = String(response.headers['content-type'] ?? '');
      if (!/^application\/([a-z0-9.+-]*\+)?json\b/i.test(contentType)) {
        return failed('the backend did not answer JSON', { content_type: contentType || null });
      }
      let output: unknown;
      try {
        output = JSON.parse(text);
      } catch {
        return failed('the backend answered malformed JSON', {});
      }
      return {
        ok: true,
        output,
        reportedCostUnits: reportedCost(response.headers[COST_HEADER]),
        status: response.statusCode,
      };
    } catch (error) {
      if (
        signal.aborted ||
        error instanceof undiciErrors.HeadersTimeoutError ||
        error instanceof undiciErrors.BodyTimeoutError
      ) {
        return {
          ok: false,
          code: 'tool_backend_timeout',
          message: `the backend did not answer within ${target.timeoutMs} ms`,
          details: { timeout_ms: target.timeoutMs },
        };
      }
      if (error instanceof ResponseTooLarge) {
        return failed(`the backend answered more than ${target.maxResponseBytes} bytes`, {
          max_response_bytes: target.maxResponseBytes,
        });
      }
      const code = (error as { code?: unknown }).code;
      return failed('the backend could not be reached', {
        cause: typeof code === 'string' ? code : 'connection_error',
      });
    }
  }

  close(): Promise<void> {
    return this.agent.close();
  }
}

function failed(message: string, details: Record<string, unknown>): DispatchResult {
  return { ok: false, code: 'tool_backend_failed', message, details };
}

async function readCapped(body: Dispatcher.ResponseData['body'], maxBytes: number): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of body) {
    size += (chunk as Buffer).length;
    if (size > maxBytes) {
      body.destroy();
      throw new ResponseTooLarge();
    }
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks).toString('utf8');
}

function reportedCost(header: string | string[] | undefined): number | undefined {
  if (typeof header !== 'string') return undefined;
  const value = Number(header);
  return Number.isFinite(value) && value >= 0 ? value : undefined;
}
