import type { IncomingMessage } from 'node:http';
import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance } from 'fastify';
import type { VerificationKeys } from './auth/jwt-keys.js';
import { jsonProblem } from './db/json-limits.js';
import { authPlugin } from './http/auth.js';
import { contractPlugin } from './http/contract.js';
import { clientErrorHandler, frameworkErrors, installErrorHandlers } from './http/error-handler.js';
import { ApiError } from './http/errors.js';
import { idempotencyPlugin } from './http/idempotency.js';
import { requestIdOf, traceIdOf } from './http/request-context.js';
import { traceRequests } from './http/request-tracing.js';
import { approvalRoutes } from './http/routes/approvals.js';
import { auditRoutes } from './http/routes/audit.js';
import { budgetRoutes } from './http/routes/budgets.js';
import { consoleRoutes } from './http/routes/console.js';
import { docsRoutes } from './http/routes/docs.js';
import { grantRoutes } from './http/routes/grants.js';
import { killSwitchRoutes } from './http/routes/kill-switches.js';
import { operationsRoutes } from './http/routes/operations.js';
import { runRoutes } from './http/routes/runs.js';
import { tenantRoutes } from './http/routes/tenants.js';
import { toolRoutes } from './http/routes/tools.js';
import { whoamiRoutes } from './http/routes/whoami.js';
import { mcpRoutes } from './mcp/mcp-routes.js';
import { buildServices, type ServiceOptions, type Services } from './services.js';

export interface AppOptions extends ServiceOptions {
  keys: VerificationKeys;
}

export type { Services } from './services.js';

declare module 'fastify' {
  interface FastifyInstance {
    services: Services;
    /** Every route registered, as `METHOD /path`: the contract test compares it with openapi.yaml. */
    registeredRoutes: string[];
  }
}

/** How often a closing app looks whether only unfinished requests hold connections open. */
const DRAIN_CHECK_MS = 50;
/** How long a closing app waits for requests whose body is still arriving. */
const ARRIVING_GRACE_MS = 2_000;

/**
 * The app: the services `buildServices` makes, the hooks every request passes, and the routes,
 * closing what it opened with it. The database itself belongs to the caller (server.ts or a test).
 */
export async function buildApp(options: AppOptions): Promise<FastifyInstance> {
  const { config, database, logger } = options;
  const services = buildServices(options);
  const { audit, metrics, now, catalog, killSwitches, externalCallEnabled } = services;

  // With traces on, log lines take trace_id and span_id from the active span (the logger's mixin).
  const traced = config.telemetry !== undefined;
  const app = Fastify({
    loggerInstance: logger as FastifyBaseLogger,
    bodyLimit: config.bodyLimitBytes,
    // One line per request, written by the onResponse hook below.
    logController: new LogController({ disableRequestLogging: true, requestIdLogLabel: 'request_id' }),
    genReqId: requestIdOf,
    childLoggerFactory: (parent, bindings, childOptions, raw) =>
      parent.child(traced ? bindings : { ...bindings, trace_id: traceIdOf(raw) }, childOptions),
    // Requests arriving while closing are refused by the onRequest hook below, in the error envelope.
    return503OnClosing: false,
    // Identifiers are at most 200 characters; longer path segments are refused as invalid_request.
    routerOptions: { maxParamLength: 256 },
    frameworkErrors,
    clientErrorHandler: clientErrorHandler(logger as FastifyBaseLogger),
  });
  app.decorate('services', services);
  app.decorate('registeredRoutes', [] as string[]);
  app.addHook('onRoute', (route) => {
    for (const method of [route.method].flat()) app.registeredRoutes.push(`${method} ${route.url}`);
  });
  app.decorateRequest('traceId', '');

  installErrorHandlers(app);
  const tracing = traced ? traceRequests(app) : undefined;
  // Closing: calls in flight finish, late requests get 503, then lingering connections are closed
  // so that a keep-alive or a never-finished request cannot hold shutdown (docs/operations.md).
  let closing = false;
  const unanswered = new Set<IncomingMessage>();
  let drain: NodeJS.Timeout | undefined;
  app.addHook('preClose', (done) => {
    closing = true;
    const arrivingUntil = Date.now() + ARRIVING_GRACE_MS;
    drain = setInterval(() => {
      for (const request of unanswered) if (request.complete || Date.now() < arrivingUntil) return;
      clearInterval(drain);
      app.server.closeAllConnections();
    }, DRAIN_CHECK_MS);
    drain.unref();
    done();
  });
  app.addHook('onRequest', async (request, reply) => {
    // The server span's when traces are on (the caller's, or a fresh one the span started).
    if (!request.traceId) request.traceId = traceIdOf(request.raw);
    reply.header('x-request-id', request.id);
    unanswered.add(request.raw);
    reply.raw.once('close', () => unanswered.delete(request.raw));
    if (closing) throw new ApiError('gateway_unavailable', 'the gateway is shutting down');
  });
  // Input no route could store or hash — nested too deep, a NUL character, a lone surrogate — is
  // refused for every route here, before its schema is checked, naming where it is as a schema's refusal does.
  app.addHook('preValidation', async (request) => {
    for (const [where, value] of [
      ['body', request.body],
      ['query', request.query],
      ['params', request.params],
    ] as const) {
      const problem = jsonProblem(value, where);
      if (problem)
        throw new ApiError('invalid_request', `${problem.path}: ${problem.message}`, {
          issues: [{ field: problem.path, message: problem.message }],
        });
    }
  });
  app.addHook('onSend', (_request, reply, payload, done) => {
    if (closing) reply.header('connection', 'close');
    done(null, payload);
  });
  app.addHook('onResponse', async (request, reply) => {
    unanswered.delete(request.raw);
    const route = request.routeOptions.url ?? 'unmatched';
    metrics.httpDuration.observe(
      { method: request.method, route, status_code: String(reply.statusCode) },
      reply.elapsedTime / 1000,
    );
    const line = () =>
      request.log.info(
        {
          method: request.method,
          route,
          url: request.url.split('?')[0],
          status: reply.statusCode,
          duration_ms: reply.elapsedTime,
        },
        'request',
      );
    if (tracing) tracing.within(request, line);
    else line();
  });
  app.addHook('onReady', () => services.start());
  app.addHook('onClose', async () => {
    clearInterval(drain);
    await services.close();
  });

  // Before any route: each takes its response schemas from openapi.yaml as it is registered.
  await app.register(contractPlugin);
  await app.register(authPlugin, {
    keys: options.keys,
    issuer: config.jwt.issuer,
    audience: config.jwt.audience,
    maxTtlSeconds: config.jwt.maxTtlSeconds,
    audit,
  });
  await app.register(idempotencyPlugin, { keys: services.idempotencyKeys });
  await app.register(operationsRoutes, {
    database,
    metrics,
    readinessChecks: [() => catalog.readiness(), () => killSwitches.readiness()],
  });
  await app.register(docsRoutes);
  await app.register(consoleRoutes);
  await app.register(whoamiRoutes);
  await app.register(auditRoutes, {
    db: database.control,
    audit,
    checkpoints: services.auditCheckpoints,
    partitions: services.auditPartitions,
    tree: services.auditTree,
  });
  await app.register(grantRoutes, { grants: services.grants, audit, now });
  await app.register(killSwitchRoutes, {
    service: services.killSwitchChanges,
    snapshot: killSwitches,
    audit,
    callTarget: services.callTarget,
  });
  await app.register(tenantRoutes, { db: database.control, audit, now });
  await app.register(runRoutes, {
    db: database.control,
    audit,
    executor: services.runs,
    controls: services.runControls,
    handoffs: services.handoffs,
    tree: services.auditTree,
    maxPlanSteps: config.maxPlanSteps,
  });
  await app.register(approvalRoutes, { approvals: services.approvals, audit, now });
  await app.register(toolRoutes, {
    db: database.control,
    catalog,
    now,
    secrets: config.secrets,
    externalCallEnabled,
  });
  await app.register(budgetRoutes, { db: database.control, audit, now });
  if (config.mcp.enabled) {
    await app.register(mcpRoutes, {
      config: config.mcp,
      metrics,
      catalog,
      runs: services.runs,
      runControls: services.runControls,
      approvals: services.approvals,
      externalCallEnabled,
      db: database.control,
      now,
      changeCheckMs: config.registryRefreshMs,
    });
  }
  return app;
}
