import {
  createMcpHandler,
  isLegacyRequest,
  ProtocolError,
  ProtocolErrorCode,
  Server,
  WebStandardStreamableHTTPServerTransport,
  type CallToolResult,
  type McpHttpHandler,
  type McpRequestContext,
} from '@modelcontextprotocol/server';
import type { Logger } from 'pino';
import type { AgentPrincipal } from '../admission/step.js';
import type { ApprovalService } from '../approvals/approval-service.js';
import { isDatabaseUnavailable, isDataException } from '../db/unavailable.js';
import { CodedError } from '../errors/coded-error.js';
import type { ToolCatalog } from '../registry/tool-catalog.js';
import { mcpNameOf } from '../registry/mcp-names.js';
import { agentViewOf } from '../registry/tool-views.js';
import type { RunControls } from '../runs/run-controls.js';
import type { RunExecutor } from '../runs/run-executor.js';
import type { RunAnswer } from '../runs/run-types.js';
import type { RunRequest } from '../runs/run-types.js';
import type { Approval } from '../runs/approval.js';
import { inputSha256Of } from '../runs/approval.js';
import {
  awaitingApproval,
  callResultOf,
  refusalResult,
  runRequestOf,
  traceIdOfMeta,
  unavailable,
  type HeaderRunFields,
} from './mcp-calls.js';
import { ListenerBus, type Listener } from './listener-bus.js';
import { withRemoteParent } from '../telemetry/spans.js';
import { claimsEnvelope, plainlyLegacy } from './mcp-eras.js';
import type { ChangeAudience } from './tool-list-changes.js';
import { advertisedOutputSchema, mcpToolOf, toolsPage, TOOLS_LIST_TTL_MS } from './mcp-tools.js';

/** Who is calling through the door, and what became of the call (for the request metrics). */
export interface McpCaller {
  principal: AgentPrincipal;
  /** The trace of the HTTP request; a call's `_meta.traceparent` overrides it. */
  traceId: string;
  requestId: string;
  /** Run fields from the request's `Toolgate-*` headers, under those of a call's `_meta`. */
  runFields?: HeaderRunFields;
  /** Set by the handlers: `tool_error` for an `isError` result, `error` for a JSON-RPC error. */
  outcome?: 'ok' | 'tool_error' | 'error';
}

export interface McpDoorDeps {
  catalog: ToolCatalog;
  runs: RunExecutor;
  runControls: RunControls;
  approvals: Pick<ApprovalService, 'get' | 'openForCall'>;
  /** Whether a tenant's agents may be offered `external_call` tools (its policy). */
  externalCallEnabled: (tenantId: string) => Promise<boolean>;
  /** The tools an agent holds a live grant for: its list offers no other. */
  grantedTools: (agent: Listener) => Promise<ReadonlySet<string>>;
  /** Open listen streams on this process, over all agents. */
  maxListenStreams: number;
  logger: Pick<Logger, 'info' | 'warn' | 'error'>;
  version: string;
}

const SERVER_NAME = 'toolgate';

const INSTRUCTIONS =
  'toolgate governs every tool call: grants, kill switches, budgets, rate limits, approvals and an audit log. ' +
  'A refused call is an isError result whose text starts with its code; _meta["dev.toolgate/result"] carries run_id, status, code, ' +
  'retry_after_seconds (call again after it) and approval_id (make the same call again once an operator approved it). ' +
  'Run fields (run_id, context, budget_units, version...) go in _meta["dev.toolgate/run"] or the Toolgate-Run-Id, ' +
  'Toolgate-Context and Toolgate-Budget-Units headers.';

/**
 * The MCP door: an SDK `Server` per HTTP request, holding nothing between requests, so any replica serves any. Tool
 * calls reach the run executor with arguments the SDK did not validate, so every refusal is toolgate's, and audited.
 */
export class McpDoor {
  private readonly bus: ListenerBus;
  private readonly modern: McpHttpHandler;
  /** Tool ids by MCP name, as of a registry revision. */
  private names: { revision: number; ids: Map<string, string> } | undefined;

  constructor(private readonly deps: McpDoorDeps) {
    this.bus = new ListenerBus((error) => deps.logger.warn({ err: error }, 'delivering an MCP list change failed'));
    this.modern = createMcpHandler((context) => this.server(context), {
      legacy: 'reject',
      bus: this.bus,
      maxSubscriptions: deps.maxListenStreams,
      // A client's malformed request, as the SDK saw it: the client's problem, not the gateway's.
      onerror: (error) => deps.logger.info({ err: error }, 'MCP request refused by the SDK'),
    });
  }

  /** Serves one HTTP request whose body Fastify has parsed; `caller` is the authenticated agent. */
  async serve(request: Request, parsedBody: unknown, caller: McpCaller): Promise<Response> {
    const authInfo = {
      token: '',
      clientId: caller.principal.id,
      scopes: [...caller.principal.scopes],
      extra: { caller },
    };
    // A request claiming a 2026-07-28 envelope is never legacy, a plain 2025-era request always
    // is: the SDK's own predicate (several schema parses of the body) is asked only about the others.
    if (
      !claimsEnvelope(parsedBody) &&
      (plainlyLegacy(request, parsedBody) || (await isLegacyRequest(request, parsedBody)))
    )
      return this.serveLegacy(request, parsedBody, authInfo);
    // A listen stream opened while serving is this agent's (and hears only what concerns it).
    const who = { tenantId: caller.principal.tenantId, agentId: caller.principal.id };
    return this.bus.within(who, () => this.modern.fetch(request, { authInfo, parsedBody }));
  }

  /** Tells the open `subscriptions/listen` streams on this replica that a change concerns that their lists may have changed. */
  toolsChanged(audience: ChangeAudience): void {
    const event = { kind: 'tools_list_changed' } as const;
    if ('everyone' in audience) this.bus.publish(event);
    else
      this.bus.publishTo(
        (who) =>
          who.tenantId === audience.tenantId && (audience.agentId === undefined || who.agentId === audience.agentId),
        event,
      );
  }

  /** The agents with a listen stream open here. */
  listeners(): Listener[] {
    return this.bus.listeners();
  }

  /** The listen streams an agent holds open here. */
  listenStreamsOf(who: Listener): number {
    return this.bus.countOf(who);
  }

  /** Ends the open listen streams and any exchange in flight. */
  close(): Promise<void> {
    return this.modern.close();
  }

  private async serveLegacy(
    request: Request,
    parsedBody: unknown,
    authInfo: { token: string; clientId: string; scopes: string[]; extra: Record<string, unknown> },
  ): Promise<Response> {
    const server = this.server({ era: 'legacy', authInfo, requestInfo: request });
    // Stateless and JSON: no session id, no stream (2025-era clients hear of changes by re-listing).
    const transport = new WebStandardStreamableHTTPServerTransport({
      sessionIdGenerator: undefined,
      enableJsonResponse: true,
    });
    await server.connect(transport);
    // In JSON mode the exchange is over with its answer and nothing outlives it: the pair is left
    // to the garbage collector rather than closed (closing builds an error, stack and all, to
    // reject requests that cannot be pending).
    return transport.handleRequest(request, { authInfo, parsedBody });
  }

  private server({ era, authInfo }: McpRequestContext): Server {
    const caller = authInfo?.extra?.caller as McpCaller | undefined;
    if (!caller) throw new Error('MCP request without an authenticated caller');
    const server = new Server(
      { name: SERVER_NAME, version: this.deps.version },
      {
        // Only 2026-07-28 clients can hear a list change (on a subscriptions/listen stream).
        capabilities: { tools: { listChanged: era === 'modern' } },
        cacheHints: { 'tools/list': { ttlMs: TOOLS_LIST_TTL_MS, cacheScope: 'private' } },
        instructions: INSTRUCTIONS,
      },
    );
    server.setRequestHandler('tools/list', async (request) => {
      try {
        const page = await this.listTools(caller, request.params?.cursor);
        // 2025-era answers carry the same lifetime the SDK gives 2026-07-28 ones.
        return era === 'legacy' ? { ...page, ttlMs: TOOLS_LIST_TTL_MS } : page;
      } catch (error) {
        throw this.protocolError(caller, error);
      }
    });
    server.setRequestHandler('tools/call', async (request) => {
      try {
        const result = await this.callTool(caller, request.params.name, request.params.arguments, request.params._meta);
        caller.outcome = result.isError ? 'tool_error' : 'ok';
        return result;
      } catch (error) {
        throw this.protocolError(caller, error);
      }
    });
    return server;
  }

  /**
   * The tool id an MCP tool name stands for (`mcpNameOf`). A tool id itself is taken too, as clients
   * of gateways that named tools by id call them. A name that is neither is left for the executor to refuse.
   */
  private toolIdOf(name: string): string {
    const { catalog } = this.deps;
    if (catalog.versions(name).length > 0) return name;
    if (this.names?.revision !== catalog.revision) {
      this.names = {
        revision: catalog.revision,
        ids: new Map(catalog.toolIds().map((id) => [mcpNameOf(id), id])),
      };
    }
    return this.names.ids.get(name) ?? name;
  }

  /** The agent's view of `GET /tools` narrowed to the tools it holds a grant for, as MCP tools, a page at a time. */
  private async listTools(caller: McpCaller, cursor: string | undefined) {
    const { catalog } = this.deps;
    const fresh = catalog.readiness();
    if (!fresh.ok) throw unavailable('the tool registry cannot be confirmed current on this replica');
    const { principal } = caller;
    const [externalCallEnabled, granted] = await Promise.all([
      this.deps.externalCallEnabled(principal.tenantId),
      this.deps.grantedTools({ tenantId: principal.tenantId, agentId: principal.id }),
    ]);
    // Only what the agent may use and holds a grant for: a model offered a tool it is always refused wastes turns.
    const offered = catalog
      .offeredTo({ agentId: principal.id, family: principal.family }, { externalCallEnabled })
      .filter((tool) => granted.has(tool.id));
    const page = toolsPage(
      offered.map((tool) => mcpToolOf(agentViewOf(tool))),
      cursor,
    );
    if (!page) throw new ProtocolError(ProtocolErrorCode.InvalidParams, 'cursor: not a cursor this gateway issued');
    return page;
  }

  /**
   * A one-step run through the run executor. A call held for approval is bound to the exact call (SPEC §12.1): the same
   * call again by the agent, whatever its run id, answers the pending approval, or once approved resumes the held run.
   * The same run id again resumes it too (a replay of a held run whose approval was decided).
   */
  private async callTool(
    caller: McpCaller,
    name: string,
    args: Record<string, unknown> | undefined,
    meta: Record<string, unknown> | undefined,
  ): Promise<CallToolResult> {
    const request = runRequestOf(this.toolIdOf(name), args, meta, caller.runFields);
    const traceId = traceIdOfMeta(meta) ?? caller.traceId;
    const { principal } = caller;
    const controller = { principal, traceId, via: 'mcp' as const };
    try {
      const held = await this.heldCall(principal, request);
      if (held?.status === 'pending') {
        caller.outcome = 'tool_error';
        return awaitingApproval(held.run_id, held.id);
      }
      // The call's spans continue the trace its `_meta.traceparent` names, as its records do.
      const answer = await withRemoteParent(meta?.traceparent, async (): Promise<RunAnswer> => {
        if (held)
          return this.deps.runControls.resume(controller, { tenant_id: principal.tenantId, run_id: held.run_id });
        const executed = await this.deps.runs.execute(principal, request, traceId, 'mcp');
        if (executed.replayed && executed.envelope.status === 'awaiting_approval' && (await this.decided(executed)))
          return this.deps.runControls.resume(controller, { tenant_id: principal.tenantId, run_id: request.run_id });
        return executed;
      });
      return callResultOf(name, answer, { advertisesOutput: this.advertisesOutput(answer) });
    } catch (error) {
      if (error instanceof CodedError && error.code !== 'gateway_unavailable') return refusalOf(request, error);
      throw error;
    }
  }

  /**
   * The open approval of this exact call by this agent, for a tool that needs one: looked up only then, so other calls
   * cost no query. A tool the agent cannot resolve has none; the executor refuses the call as usual.
   */
  private async heldCall(principal: AgentPrincipal, request: RunRequest): Promise<Approval | undefined> {
    const step = request.plan[0];
    if (!step) return undefined;
    const resolved = await this.deps.catalog.resolve(step.tool_id, step.version, {
      as: 'caller',
      agent: { agentId: principal.id, family: principal.family },
      externalCallEnabled: () => this.deps.externalCallEnabled(principal.tenantId),
    });
    if (!resolved.ok || !resolved.tool.requires_approval) return undefined;
    return this.deps.approvals.openForCall({
      tenantId: principal.tenantId,
      agentId: principal.id,
      call: {
        toolId: resolved.tool.id,
        toolVersion: resolved.tool.version,
        inputSha256: inputSha256Of(step.input),
        context: request.context,
      },
    });
  }

  /** Whether the version a call ran advertises an output schema in the MCP listing. */
  private advertisesOutput(answer: RunAnswer): boolean {
    const step = answer.envelope.steps[0];
    if (!step?.version) return false;
    const tool = this.deps.catalog.versions(step.tool_id).find((v) => v.version === step.version);
    return tool !== undefined && advertisedOutputSchema(tool.output_schema) !== undefined;
  }

  /** Whether the approval a replayed held run waits for is no longer pending (approved, or lapsed). */
  private async decided(answer: RunAnswer): Promise<boolean> {
    const approvalId = answer.envelope.steps.find((step) => step.status === 'awaiting_approval')?.approval_id;
    if (!approvalId) return false;
    const approval = await this.deps.approvals.get(approvalId);
    return approval !== undefined && approval.status !== 'pending';
  }

  /** A JSON-RPC error for what a handler threw: the client's, or `-32603` for the gateway's own faults. */
  private protocolError(caller: McpCaller, error: unknown): ProtocolError {
    caller.outcome = 'error';
    if (error instanceof ProtocolError) return error;
    if (isDatabaseUnavailable(error) || (error instanceof CodedError && error.code === 'gateway_unavailable')) {
      this.deps.logger.warn({ err: error, request_id: caller.requestId }, 'MCP request met a gateway outage');
      return unavailable(error instanceof CodedError ? error.message : undefined);
    }
    // PostgreSQL could not take a value as given: the request's fault, as over REST.
    if (isDataException(error))
      return new ProtocolError(ProtocolErrorCode.InvalidParams, 'a value in the request cannot be used');
    this.deps.logger.error({ err: error, request_id: caller.requestId }, 'unexpected error in an MCP request');
    return new ProtocolError(
      ProtocolErrorCode.InternalError,
      `internal: an unexpected error occurred; quote request id ${caller.requestId}`,
    );
  }
}

/** A refusal of the whole request (run id conflict, run not resumable…): the run it names is unchanged. */
function refusalOf(request: RunRequest, error: CodedError): CallToolResult {
  const retryAfter = error.details.retry_after_seconds;
  return refusalResult({
    runId: request.run_id,
    status: 'rejected',
    code: error.code,
    message: error.message,
    retryAfterSeconds: typeof retryAfter === 'number' ? retryAfter : undefined,
  });
}
