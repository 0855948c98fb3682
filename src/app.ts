import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import { AuditLog } from './audit/audit-log.js';
import type { VerificationKeys } from './auth/jwt-keys.js';
import type { Config } from './config/config.js';
import type { Database } from './db/database.js';
import { GrantExpirySweeper } from './grants/grant-expiry-sweeper.js';
import { GrantService } from './grants/grant-service.js';
import type { ToolFactsLookup } from './grants/tool-facts.js';
import { authPlugin } from './http/auth.js';
import { installErrorHandlers } from './http/error-handler.js';
import { requestIdOf, traceIdOf } from './http/request-context.js';
import { auditRoutes } from './http/routes/audit.js';
import { docsRoutes } from './http/routes/docs.js';
import { grantRoutes } from './http/routes/grants.js';
import { killSwitchRoutes } from './http/routes/kill-switches.js';
import { operationsRoutes } from './http/routes/operations.js';
import { tenantRoutes } from './http/routes/tenants.js';
import { whoamiRoutes } from './http/routes/whoami.js';
import { KillSwitchService } from './kill-switches/kill-switch-service.js';
import { KillSwitchSnapshot } from './kill-switches/kill-switch-snapshot.js';
import { createMetrics, type Metrics } from './metrics/metrics.js';

export interface AppOptions {
  config: Config;
  database: Database;
  keys: VerificationKeys;
  logger: Logger;
  now?: () => Date;
  /** What grants and kill switches read of registered tools (until the registry is wired in). */
  tools?: ToolFactsLookup;
}

/** The services built once by the composition root and shared by every route. */
export interface Services {
  config: Config;
  database: Database;
  audit: AuditLog;
  metrics: Metrics;
  now: () => Date;
  /** Grant resolution for the admission pipeline (`resolve`), and grant changes. */
  grants: GrantService;
  /** This replica's kill-switch snapshot: `decide` for the admission pipeline. */
  killSwitches: KillSwitchSnapshot;
}

declare module 'fastify' {
  interface FastifyInstance {
    services: Services;
    /** Every route registered, as `METHOD /path`: the contract test compares it with openapi.yaml. */
    registeredRoutes: string[];
  }
}

/**
 * The composition root: builds every service once, wires routes to them, and closes what it
 * opened with the app. The database itself belongs to the caller (server.ts or a test).
 */
export async function buildApp(options: AppOptions): Promise<FastifyInstance> {
  const { config, database, logger } = options;
  const now = options.now ?? (() => new Date());
  const metrics = createMetrics();
  const audit = new AuditLog(database.db, now, (batchSize) => {
    metrics.auditEventsCommitted.inc(batchSize);
    metrics.auditCommitBatchSize.observe(batchSize);
  });
  const tools: ToolFactsLookup = options.tools ?? { resolve: () => ({ ok: false, code: 'tool_not_registered' }) };
  const grants = new GrantService({ db: database.db, audit, tools, now });
  const killSwitches = new KillSwitchSnapshot({
    db: database.db,
    listener: database.listener,
    registry: metrics.registry,
    logger,
    ...config.killSwitches,
  });
  const expirySweeper = new GrantExpirySweeper({
    db: database.db,
    now,
    intervalMs: config.grants.expirySweepIntervalMs,
    logger,
  });
  const services: Services = { config, database, audit, metrics, now, grants, killSwitches };

  const app = Fastify({
    loggerInstance: logger as FastifyBaseLogger,
    bodyLimit: config.bodyLimitBytes,
    // One line per request, written by the onResponse hook below.
    logController: new LogController({ disableRequestLogging: true, requestIdLogLabel: 'request_id' }),
    genReqId: requestIdOf,
    childLoggerFactory: (parent, bindings, childOptions, raw) =>
      parent.child({ ...bindings, trace_id: traceIdOf(raw) }, childOptions),
    ajv: { customOptions: { removeAdditional: false, coerceTypes: false } },
    return503OnClosing: true,
  });
  app.decorate('services', services);
  app.decorate('registeredRoutes', [] as string[]);
  app.addHook('onRoute', (route) => {
    for (const method of [route.method].flat()) app.registeredRoutes.push(`${method} ${route.url}`);
  });
  app.decorateRequest('traceId', '');

  installErrorHandlers(app);
  app.addHook('onRequest', async (request, reply) => {
    request.traceId = traceIdOf(request.raw);
    reply.header('x-request-id', request.id);
  });
  app.addHook('onResponse', async (request, reply) => {
    const route = request.routeOptions.url ?? 'unmatched';
    metrics.httpDuration.observe(
      { method: request.method, route, status_code: String(reply.statusCode) },
      reply.elapsedTime / 1000,
    );
    request.log.info(
      { method: request.method, route, url: request.url.split('?')[0], status: reply.statusCode, duration_ms: reply.elapsedTime },
      'request',
    );
  });
  app.addHook('onReady', async () => {
    await killSwitches.start();
    expirySweeper.start();
  });
  app.addHook('onClose', async () => {
    await expirySweeper.stop();
    await killSwitches.stop();
    await audit.drain();
  });

  await app.register(authPlugin, {
    keys: options.keys,
    issuer: config.jwt.issuer,
    audience: config.jwt.audience,
    audit,
  });
  await app.register(operationsRoutes, { database, metrics, readinessChecks: [() => killSwitches.readiness()] });
  await app.register(docsRoutes);
  await app.register(whoamiRoutes);
  await app.register(auditRoutes, { db: database.db, audit });
  await app.register(grantRoutes, { grants, audit, now });
  await app.register(killSwitchRoutes, {
    service: new KillSwitchService(database.db, killSwitches, now),
    snapshot: killSwitches,
    audit,
    tools,
  });
  await app.register(tenantRoutes, { db: database.db, audit, now });
  return app;
}
