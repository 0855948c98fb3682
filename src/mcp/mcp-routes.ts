import { readFileSync } from 'node:fs';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Kysely } from 'kysely';
import type { Config } from '../config/config.js';
import type { DB } from '../db/schema.js';
import { principalOf } from '../http/auth.js';
import { ApiError } from '../http/errors.js';
import type { Metrics } from '../metrics/metrics.js';
import type { ToolCatalog } from '../registry/tool-catalog.js';
import { inboundRequestOf } from './inbound-request.js';
import { grantedToolIds } from './granted-tools.js';
import { headerRunFieldsOf } from './mcp-calls.js';
import { McpDoor, type McpCaller, type McpDoorDeps } from './mcp-door.js';
import { ToolListChanges } from './tool-list-changes.js';

export interface McpRouteDeps extends Omit<McpDoorDeps, 'version' | 'logger' | 'grantedTools' | 'maxListenStreams'> {
  config: Config['mcp'];
  metrics: Metrics;
  catalog: ToolCatalog;
  /** Where tenant policies are read when someone listens for changes. */
  db: Kysely<DB>;
  now: () => Date;
  /** How often tool lists are checked for changes. */
  changeCheckMs: number;
}

/** Where RFC 9728 metadata for `/mcp` is served, below the gateway's origin. */
export const MCP_METADATA_PATH = '/.well-known/oauth-protected-resource/mcp';

const VERSION = (
  JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }
).version;

/** Methods counted by name in the request metrics; anything else is `other`. */
const COUNTED_METHODS = new Set([
  'initialize',
  'notifications/initialized',
  'notifications/cancelled',
  'ping',
  'server/discover',
  'subscriptions/listen',
  'tools/list',
  'tools/call',
]);

declare module 'fastify' {
  interface FastifyRequest {
    mcpCaller?: McpCaller;
  }
}

/**
 * `POST /mcp` (agents), `GET`/`DELETE /mcp` (405: stateless, no sessions to open or close) and
 * the RFC 9728 metadata that tells a client where to get a token. Authentication is the gateway's
 * (the agent's JWT); a refusal here names the metadata in `WWW-Authenticate`, as MCP clients expect.
 */
export async function mcpRoutes(app: FastifyInstance, deps: McpRouteDeps): Promise<void> {
  const { config } = deps;
  const door = new McpDoor({
    ...deps,
    logger: app.log,
    version: VERSION,
    grantedTools: (agent) => grantedToolIds(deps.db, agent, deps.now()),
    maxListenStreams: config.maxListenStreams,
  });
  const changes = new ToolListChanges({
    catalog: deps.catalog,
    db: deps.db,
    now: deps.now,
    intervalMs: deps.changeCheckMs,
    listeners: () => door.listeners(),
    onChange: (audience) => door.toolsChanged(audience),
    logger: app.log,
  });
  app.addHook('onReady', async () => changes.start());
  // Open listen streams would hold the server open: they end as closing begins.
  app.addHook('preClose', async () => {
    changes.stop();
    await door.close();
  });

  app.setErrorHandler((error, request, reply) => {
    // The Origin is judged before the token: a page at a foreign origin learns nothing of tokens.
    const foreign = foreignOrigin(request, config);
    if (foreign !== undefined && error instanceof ApiError && AUTH_REFUSALS.has(error.code)) throw foreign;
    if (isUnparseableJson(error))
      return jsonRpcError(reply, 400, -32700, 'Parse error: the body is not valid JSON', undefined);
    if (error instanceof ApiError && error.code === 'unauthenticated') {
      const presented = request.headers.authorization !== undefined;
      const origin = originOf(request, config);
      const pointer = origin === undefined ? [] : [`resource_metadata="${origin}${MCP_METADATA_PATH}"`];
      reply.header(
        'www-authenticate',
        `Bearer ${[...(presented ? ['error="invalid_token"'] : []), ...pointer].join(', ')}`.trimEnd(),
      );
    }
    // The gateway's own error handler answers, in the error envelope.
    throw error;
  });

  // An allowed browser origin may read every answer of this door, refusals included (a 401's
  // WWW-Authenticate is how a browser client finds where to get a token).
  app.addHook('onSend', async (request, reply, payload) => {
    const origin = request.headers.origin;
    if (typeof origin === 'string' && config.allowedOrigins.includes(origin)) {
      reply.header('access-control-allow-origin', origin);
      reply.header('access-control-expose-headers', CORS_EXPOSED);
    }
    if (config.allowedOrigins.length > 0) reply.header('vary', 'Origin');
    return payload;
  });

  app.addHook('onResponse', async (request, reply) => {
    if (request.routeOptions.url !== '/mcp') return;
    deps.metrics.mcpRequests.inc({
      method: methodOf(request),
      outcome: request.mcpCaller?.outcome ?? outcomeOfStatus(reply.statusCode),
    });
  });

  app.post('/mcp', { config: { access: 'agent', ownInput: true } }, async (request, reply) => {
    const principal = principalOf(request);
    if (principal.kind !== 'agent') throw new Error('unreachable: agent route');
    if (config.resource !== undefined && !audienceNames(request.user, config.resource)) {
      throw new ApiError(
        'unauthenticated',
        `the bearer token is not valid: its audience does not name ${config.resource}`,
      );
    }
    const foreign = foreignOrigin(request, config);
    if (foreign !== undefined) throw foreign;
    const runFields = headerRunFieldsOf(request.headers);
    if (!runFields.ok) return jsonRpcError(reply, 400, -32602, runFields.message, request.body);
    const caller: McpCaller = {
      principal,
      traceId: request.traceId,
      requestId: request.id,
      runFields: runFields.fields,
    };
    request.mcpCaller = caller;
    let end: AbortSignal | undefined;
    if (isListen(request)) {
      const who = { tenantId: principal.tenantId, agentId: principal.id };
      if (door.listenStreamsOf(who) >= config.maxListenStreamsPerAgent) {
        caller.outcome = 'error';
        return jsonRpcError(
          reply,
          200,
          -32603,
          `Subscription limit reached: this agent holds ${config.maxListenStreamsPerAgent} listen streams here already; close one first`,
          request.body,
        );
      }
      await changes.watch(who);
      end = streamEnd(reply, expiryOf(request.user));
    }
    const response = await door.serve(inboundRequestOf(request.headers, end), request.body, caller);
    return send(reply, response, caller);
  });

  // CORS preflight (hand-written: @fastify/cors would answer OPTIONS on every path of the gateway,
  // and only this door serves browsers).
  app.options('/mcp', { config: { access: 'public' } }, async (request, reply) => {
    const foreign = foreignOrigin(request, config);
    if (foreign !== undefined || request.headers.origin === undefined)
      throw foreign ?? new ApiError('forbidden', 'a CORS preflight needs an Origin header');
    return reply
      .code(204)
      .header('access-control-allow-methods', 'POST')
      .header('access-control-allow-headers', CORS_ALLOWED)
      .header('access-control-max-age', '600')
      .send();
  });

  for (const method of ['GET', 'DELETE'] as const) {
    app.route({
      method,
      url: '/mcp',
      config: { access: 'public' },
      handler: async (_request, reply) =>
        reply
          .code(405)
          .header('allow', 'POST')
          .send({
            jsonrpc: '2.0',
            error: { code: -32000, message: 'Method not allowed: this MCP endpoint is stateless; use POST.' },
            id: null,
          }),
    });
  }

  app.get(MCP_METADATA_PATH, { config: { access: 'public' } }, async (request) => {
    const origin = originOf(request, config);
    // In production with no resource configured there is no URL to give but the one `Host` claims.
    if (origin === undefined)
      throw new ApiError('not_found', 'no resource is configured for /mcp (TOOLGATE_MCP_RESOURCE)');
    return {
      resource: config.resource ?? `${origin}/mcp`,
      ...(config.authorizationServers.length > 0 ? { authorization_servers: config.authorizationServers } : {}),
      bearer_methods_supported: ['header'],
      resource_name: 'toolgate',
    };
  });
}

/** Request headers a browser page may send to `/mcp` (the run-field headers included). */
const CORS_ALLOWED = [
  'Authorization',
  'Content-Type',
  'Accept',
  'Mcp-Protocol-Version',
  'Mcp-Session-Id',
  'Last-Event-ID',
  'Traceparent',
  'Toolgate-Run-Id',
  'Toolgate-Context',
  'Toolgate-Budget-Units',
].join(', ');

/** Answer headers a browser page may read. */
const CORS_EXPOSED = 'WWW-Authenticate, Mcp-Protocol-Version, Mcp-Session-Id, Retry-After, X-Request-Id';

/** The refusals of authentication and authorization that a foreign Origin's 403 takes the place of. */
const AUTH_REFUSALS: ReadonlySet<string> = new Set(['unauthenticated', 'forbidden', 'agent_forbidden']);

/** The 403 for a browser `Origin` not in `TOOLGATE_MCP_ALLOWED_ORIGINS`; undefined when there is none or it is allowed. */
function foreignOrigin(request: FastifyRequest, config: Config['mcp']): ApiError | undefined {
  const origin = request.headers.origin;
  if (origin === undefined || config.allowedOrigins.includes(origin)) return undefined;
  return new ApiError('forbidden', `requests from origin ${origin} are not allowed on /mcp`, { origin });
}

/** Fastify's refusal of a body that is not JSON at all (JSON-RPC's parse error). */
function isUnparseableJson(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return code === 'FST_ERR_CTP_INVALID_JSON_BODY' || code === 'FST_ERR_CTP_EMPTY_JSON_BODY';
}

/** A Host header that is a host name or address, with an optional port. */
const HOST =
  /^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])(?::\d{1,5})?$/;

/**
 * The gateway's origin as clients reach it: the configured resource's, else (not in production) the request's (a
 * `Host` that is no host name gets `localhost`: it names nothing a client could reach anyway); else none.
 */
function originOf(request: FastifyRequest, config: Config['mcp']): string | undefined {
  if (config.resource !== undefined) return new URL(config.resource).origin;
  if (!config.hostUrls) return undefined;
  return `${request.protocol}://${HOST.test(request.host) ? request.host : 'localhost'}`;
}

/** When a verified token expires (seconds since the epoch), if it says: its top-level claims, as auth reads them. */
function expiryOf(claims: unknown): number | undefined {
  const exp = (claims as { exp?: unknown } | undefined)?.exp;
  return typeof exp === 'number' && Number.isFinite(exp) ? exp : undefined;
}

function isListen(request: FastifyRequest): boolean {
  return (request.body as { method?: unknown } | undefined)?.method === 'subscriptions/listen';
}

/** Whether a verified token's `aud` (a string or a list; its top-level claims, as auth reads them) names the resource. */
function audienceNames(claims: unknown, resource: string): boolean {
  const aud = (claims as { aud?: unknown } | undefined)?.aud;
  return Array.isArray(aud) ? aud.includes(resource) : aud === resource;
}

/**
 * For a listen stream, a signal that fires when its client goes away or its token expires, so that the SDK ends the
 * subscription (a stream must not outlive the authority it was opened with). Other exchanges end with their answer,
 * and a signal on a `Request` is not free.
 */
function streamEnd(reply: FastifyReply, expiresAt: number | undefined): AbortSignal {
  const aborted = new AbortController();
  const timer =
    expiresAt === undefined
      ? undefined
      : setTimeout(() => aborted.abort(), Math.min(Math.max(0, expiresAt * 1000 - Date.now()), 2 ** 31 - 1));
  timer?.unref();
  reply.raw.on('close', () => {
    clearTimeout(timer);
    if (!reply.raw.writableFinished) aborted.abort();
  });
  return aborted.signal;
}

/** A JSON-RPC error answering the whole HTTP request (its `id` when the body had one). */
function jsonRpcError(reply: FastifyReply, status: number, code: number, message: string, body: unknown) {
  const id = (body as { id?: unknown } | undefined)?.id;
  return reply.code(status).send({
    jsonrpc: '2.0',
    error: { code, message },
    id: typeof id === 'string' || typeof id === 'number' ? id : null,
  });
}

/** A JSON answer is sent whole (with its length); a stream (a listen subscription) as it comes. */
async function send(reply: FastifyReply, response: Response, caller: McpCaller): Promise<FastifyReply> {
  if ((response.headers.get('content-type') ?? '').startsWith('text/event-stream')) return reply.send(response);
  reply.code(response.status);
  for (const [name, value] of response.headers) reply.header(name, value);
  const body = response.body === null ? undefined : await response.text();
  // The SDK's own JSON-RPC errors (an unknown method, malformed params) count as errors too.
  if (caller.outcome === undefined && response.status < 300 && body !== undefined && isJsonRpcError(body))
    caller.outcome = 'error';
  return reply.send(body);
}

function isJsonRpcError(body: string): boolean {
  try {
    return typeof (JSON.parse(body) as { error?: unknown }).error === 'object';
  } catch {
    return false;
  }
}

function methodOf(request: FastifyRequest): string {
  if (request.method !== 'POST') return request.method;
  const method = (request.body as { method?: unknown } | undefined)?.method;
  return typeof method === 'string' && COUNTED_METHODS.has(method) ? method : 'other';
}

function outcomeOfStatus(status: number): string {
  if (status < 300) return 'ok';
  if (status === 401) return 'unauthenticated';
  if (status === 403) return 'forbidden';
  if (status === 405) return 'method_not_allowed';
  return status < 500 ? 'invalid' : 'error';
}
