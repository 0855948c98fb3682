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
import { McpDoor, type McpCaller, type McpDoorDeps } from './mcp-door.js';
import { ToolListChanges } from './tool-list-changes.js';

export interface McpRouteDeps extends Omit<McpDoorDeps, 'version' | 'logger'> {
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
  const door = new McpDoor({ ...deps, logger: app.log, version: VERSION });
  const changes = new ToolListChanges({
    catalog: deps.catalog,
    db: deps.db,
    now: deps.now,
    intervalMs: deps.changeCheckMs,
    listening: () => door.listening,
    onChange: () => door.toolsChanged(),
    logger: app.log,
  });
  app.addHook('onReady', async () => changes.start());
  // Open listen streams would hold the server open: they end as closing begins.
  app.addHook('preClose', async () => {
    changes.stop();
    await door.close();
  });

  app.setErrorHandler((error, request, reply) => {
    if (error instanceof ApiError && error.code === 'unauthenticated') {
      const presented = request.headers.authorization !== undefined;
      reply.header(
        'www-authenticate',
        `Bearer ${presented ? 'error="invalid_token", ' : ''}resource_metadata="${originOf(request, config)}${MCP_METADATA_PATH}"`,
      );
    }
    // The gateway's own error handler answers, in the error envelope.
    throw error;
  });

  app.addHook('onResponse', async (request, reply) => {
    if (request.routeOptions.url !== '/mcp') return;
    deps.metrics.mcpRequests.inc({
      method: methodOf(request),
      outcome: request.mcpCaller?.outcome ?? outcomeOfStatus(reply.statusCode),
    });
  });

  app.post('/mcp', { config: { access: 'agent' } }, async (request, reply) => {
    const principal = principalOf(request);
    if (principal.kind !== 'agent') throw new Error('unreachable: agent route');
    if (config.resource !== undefined && !audienceNames(request.user, config.resource)) {
      throw new ApiError(
        'unauthenticated',
        `the bearer token is not valid: its audience does not name ${config.resource}`,
      );
    }
    const origin = request.headers.origin;
    if (origin !== undefined && !config.allowedOrigins.includes(origin)) {
      throw new ApiError('forbidden', `requests from origin ${origin} are not allowed on /mcp`, { origin });
    }
    const caller: McpCaller = { principal, traceId: request.traceId, requestId: request.id };
    request.mcpCaller = caller;
    const response = await door.serve(
      inboundRequestOf(request.headers, streamEnd(request, reply)),
      request.body,
      caller,
    );
    return send(reply, response, caller);
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

  app.get(MCP_METADATA_PATH, { config: { access: 'public' } }, async (request) => ({
    resource: config.resource ?? `${originOf(request, config)}/mcp`,
    ...(config.authorizationServers.length > 0 ? { authorization_servers: config.authorizationServers } : {}),
    bearer_methods_supported: ['header'],
    resource_name: 'toolgate',
  }));
}

/** A Host header that is a host name or address, with an optional port. */
const HOST =
  /^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])(?::\d{1,5})?$/;

/**
 * The gateway's origin as clients reach it: the configured resource's, else the request's (a
 * `Host` that is no host name gets `localhost`: it names nothing a client could reach anyway).
 */
function originOf(request: FastifyRequest, config: Config['mcp']): string {
  if (config.resource !== undefined) return new URL(config.resource).origin;
  return `${request.protocol}://${HOST.test(request.host) ? request.host : 'localhost'}`;
}

/** Whether a verified token's `aud` (a string or a list; its top-level claims, as auth reads them) names the resource. */
function audienceNames(claims: unknown, resource: string): boolean {
  const aud = (claims as { aud?: unknown } | undefined)?.aud;
  return Array.isArray(aud) ? aud.includes(resource) : aud === resource;
}

/**
 * For a listen stream, a signal that fires when its client goes away, so that the SDK ends the
 * subscription. Other exchanges end with their answer, and a signal on a `Request` is not free.
 */
function streamEnd(request: FastifyRequest, reply: FastifyReply): AbortSignal | undefined {
  if ((request.body as { method?: unknown } | undefined)?.method !== 'subscriptions/listen') return undefined;
  const aborted = new AbortController();
  reply.raw.on('close', () => {
    if (!reply.raw.writableFinished) aborted.abort();
  });
  return aborted.signal;
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
