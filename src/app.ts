import { randomBytes } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import { Counter, Gauge } from 'prom-client';
import { AuditLog } from './audit/audit-log.js';
import type { VerificationKeys } from './auth/jwt-keys.js';
import { BudgetLedger } from './budgets/budget-ledger.js';
import type { Config } from './config/config.js';
import type { Database } from './db/database.js';
import { GroupCommit } from './db/group-commit.js';
import { jsonProblem } from './db/json-limits.js';
import { waitAtMost } from './db/wait-at-most.js';
import { GrantExpirySweeper } from './grants/grant-expiry-sweeper.js';
import { GrantService } from './grants/grant-service.js';
import { authPlugin } from './http/auth.js';
import { idempotencyPlugin } from './http/idempotency.js';
import { IdempotencyKeys } from './idempotency/idempotency-keys.js';
import { clientErrorHandler, frameworkErrors, installErrorHandlers } from './http/error-handler.js';
import { ApiError } from './http/errors.js';
import { requestIdOf, traceIdOf } from './http/request-context.js';
import { auditRoutes } from './http/routes/audit.js';
import { budgetRoutes } from './http/routes/budgets.js';
import { docsRoutes } from './http/routes/docs.js';
import { grantRoutes } from './http/routes/grants.js';
import { killSwitchRoutes } from './http/routes/kill-switches.js';
import { operationsRoutes } from './http/routes/operations.js';
import { tenantRoutes } from './http/routes/tenants.js';
import { runRoutes } from './http/routes/runs.js';
import { toolRoutes } from './http/routes/tools.js';
import type { AdmissionPorts } from './admission/ports.js';
import { createEgressExecutor } from './egress/egress-executor.js';
import type { Resolver } from './egress/resolver.js';
import { BackendClient } from './proxy/backend-client.js';
import { RunExecutor } from './runs/run-executor.js';
import { RunCascades } from './runs/run-cascades.js';
import { RunControls } from './runs/run-controls.js';
import { RunRecovery } from './runs/run-recovery.js';
import { runEndRider } from './runs/run-end-rider.js';
import { ReplicaLease } from './replicas/replica-lease.js';
import { RetentionSweeper } from './retention/retention-sweeper.js';
import { recordGrantUses, type GrantUse } from './runs/run-repository.js';
import { ApprovalService } from './approvals/approval-service.js';
import { HandoffService } from './handoffs/handoff-service.js';
import { approvalRoutes } from './http/routes/approvals.js';
import { whoamiRoutes } from './http/routes/whoami.js';
import { KillSwitchService } from './kill-switches/kill-switch-service.js';
import { KillSwitchSnapshot } from './kill-switches/kill-switch-snapshot.js';
import { mcpRoutes } from './mcp/mcp-routes.js';
import { createMetrics, type Metrics } from './metrics/metrics.js';
import { ToolCatalog } from './registry/tool-catalog.js';
import type { AgentIdentity } from './registry/tool-access.js';
import { getTenantPolicy } from './tenants/tenant-policy.js';
import { RateLimiter } from './rate-limits/rate-limiter.js';

export interface AppOptions {
  config: Config;
  database: Database;
  keys: VerificationKeys;
  logger: Logger;
  now?: () => Date;
  /** How the egress executor resolves host names (default `dns.lookup`); tests stand in for the internet. */
  resolver?: Resolver;
  /** This replica's id in the `replicas` table (default: a fresh random one). */
  replicaId?: string;
}

/** The services built once by the composition root and shared by every route. */
export interface Services {
  config: Config;
  database: Database;
  audit: AuditLog;
  metrics: Metrics;
  now: () => Date;
  /** This replica's copy of the tool registry: synchronous lookups for the hot path. */
  catalog: ToolCatalog;
  /** Budget admission: reserve before dispatch, settle or release after (SPEC §5). */
  budgets: BudgetLedger;
  /** Token buckets per (tenant, agent, tool) (SPEC §5). */
  rateLimiter: RateLimiter;
  /** Grant resolution for the admission pipeline (`resolve`), and grant changes. */
  grants: GrantService;
  /** This replica's kill-switch snapshot: `decide` for the admission pipeline. */
  killSwitches: KillSwitchSnapshot;
  /** Executes runs: admission, dispatch, audit (SPEC §6). */
  runs: RunExecutor;
  /** Cancel, kill, pause, resume, complete (SPEC §6 run controls). */
  runControls: RunControls;
  /** Proposed actions and the operators' decisions on them (SPEC §6 step 8). */
  approvals: ApprovalService;
  /** Sub-agent hand-offs (SPEC §6). */
  handoffs: HandoffService;
  /** This replica's lease: what tells the others it is alive. */
  lease: ReplicaLease;
  /** Ends busy runs whose executor was lost. */
  recovery: RunRecovery;
}

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
 * The composition root: builds every service once, wires routes to them, and closes what it
 * opened with the app. The database itself belongs to the caller (server.ts or a test).
 */
export async function buildApp(options: AppOptions): Promise<FastifyInstance> {
  const { config, database, logger } = options;
  const now = options.now ?? (() => new Date());
  const metrics = createMetrics();
  const audit = new AuditLog(
    database.hot,
    now,
    (batchSize) => {
      metrics.auditEventsCommitted.inc(batchSize);
      metrics.auditCommitBatchSize.observe(batchSize);
    },
    runEndRider,
  );
  const catalog = new ToolCatalog({ database, secrets: config.secrets, now, logger, refreshIntervalMs: config.registryRefreshMs });
  new Gauge({
    name: 'toolgate_registry_catalog_age_seconds',
    help: "Time since this replica's copy of the tool registry was last confirmed current",
    registers: [metrics.registry],
    collect() {
      const age = catalog.ageMs();
      this.set(Number.isFinite(age) ? age / 1000 : -1);
    },
  });
  const budgets = new BudgetLedger(database.hotAsync, {
    now,
    registry: metrics.registry,
    reservationTtlMs: config.budgetReservationTtlSeconds * 1000,
    sweepIntervalMs: Math.min(60_000, (config.budgetReservationTtlSeconds * 1000) / 2),
    onSweepError: (error) => logger.warn({ err: error }, 'releasing abandoned budget reservations failed'),
    closes: database.hot,
  });
  new Counter({
    name: 'toolgate_db_statements_total',
    help: 'Statements this instance sent to PostgreSQL (each a round trip)',
    registers: [metrics.registry],
    collect() {
      this.reset();
      this.inc(database.statementsSent());
    },
  });
  const rateLimiter = new RateLimiter(database.hotAsync, { now, registry: metrics.registry });
  // Pulling authority stops the runs that rely on it, in the same transaction (SPEC §3–§4).
  // The kill-switch target of the version an agent's call gets, as the executor resolves it.
  const callTarget = async (agent: AgentIdentity | null, toolId: string, range: string | undefined, externalCallEnabled: () => Promise<boolean>) => {
    const resolved = await catalog.resolveCall(agent, toolId, range, externalCallEnabled);
    return resolved.ok ? resolved.tool.target : undefined;
  };
  const cascades = new RunCascades(callTarget, async (trx, tenantId) => (await getTenantPolicy(trx, tenantId)).external_call_enabled);
  const grants = new GrantService({ db: database.db, hot: database.hot, audit, tools: catalog, now, onGrantsEnded: cascades.grantsEnded });
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
    onGrantsEnded: cascades.grantsEnded,
  });
  const approvals = new ApprovalService({ db: database.db, now });
  // Uses recorded at the same moment share one statement (group commit).
  const grantUseBatches = new GroupCommit((uses: GrantUse[]) => recordGrantUses(database.hotAsync, uses));
  const grantUses = { record: (use: { tenantId: string; runId: string; grantId: string }) => grantUseBatches.submit({ tenant_id: use.tenantId, run_id: use.runId, grant_id: use.grantId }) };
  const ports: AdmissionPorts = {
    catalog,
    grants,
    killSwitches,
    budgets,
    rateLimiter,
    tenantPolicy: { externalCallEnabled: async (tenantId) => (await getTenantPolicy(database.db, tenantId)).external_call_enabled },
    egress: createEgressExecutor({ allowCidrs: config.egressAllowCidrs, ...(options.resolver ? { resolver: options.resolver } : {}) }),
    approvals,
    grantUses,
  };
  const backend = new BackendClient();
  const approvalTtlMs = config.approvalTtlSeconds * 1000;
  const replicaId = options.replicaId ?? `rep_${randomBytes(8).toString('hex')}`;
  const lease = new ReplicaLease({ db: database.db, id: replicaId, leaseMs: config.replicaLeaseMs, logger });
  const recovery = new RunRecovery({ db: database.db, replicaId, now, intervalMs: config.replicaLeaseMs / 2, logger, registry: metrics.registry });
  const retention = new RetentionSweeper({ db: database.db, now, retentionDays: config.retention.days, intervalMs: config.retention.sweepIntervalMs, logger, registry: metrics.registry });
  const runs = new RunExecutor({ db: database.db, hot: database.hot, hotAsync: database.hotAsync, audit, ports, backend, metrics, now, approvalTtlMs, approvals, replicaId, recovery, lease });
  const runControls = new RunControls({ db: database.db, executor: runs, replicaId, approvals, now });
  const handoffs = new HandoffService({ db: database.db, grants, grantUses, now, approvalTtlMs, maxDepth: config.handoffs.maxDepth, rootMaxFanout: config.handoffs.rootMaxFanout });
  const services: Services = { config, database, audit, metrics, now, catalog, budgets, rateLimiter, grants, killSwitches, runs, runControls, approvals, handoffs, lease, recovery };

  const app = Fastify({
    loggerInstance: logger as FastifyBaseLogger,
    bodyLimit: config.bodyLimitBytes,
    // One line per request, written by the onResponse hook below.
    logController: new LogController({ disableRequestLogging: true, requestIdLogLabel: 'request_id' }),
    genReqId: requestIdOf,
    childLoggerFactory: (parent, bindings, childOptions, raw) =>
      parent.child({ ...bindings, trace_id: traceIdOf(raw) }, childOptions),
    ajv: { customOptions: { removeAdditional: false, coerceTypes: false } },
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
  // Closing (SIGTERM): calls in flight finish, and each connection closes after its answer.
  // Otherwise a client's keep-alive connection, busy when closing began, would hold the server
  // open until its keep-alive timeout, and the process would be killed at the shutdown timeout.
  // A request that still arrives (on a connection opened before) is refused with 503.
  // Once no request that arrived whole is left unanswered, and those still arriving had a moment
  // to finish, the connections still open (a request its client never finishes, an idle
  // keep-alive) are closed: they would hold the shutdown until the shutdown timeout killed it.
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
    request.traceId = traceIdOf(request.raw);
    reply.header('x-request-id', request.id);
    unanswered.add(request.raw);
    reply.raw.once('close', () => unanswered.delete(request.raw));
    if (closing) throw new ApiError('gateway_unavailable', 'the gateway is shutting down');
  });
  // Input no route could store or hash — nested too deep, a NUL character, a lone surrogate — is
  // refused for every route here, naming where it is (as parseInput names a field).
  app.addHook('preValidation', async (request) => {
    for (const [where, value] of [['body', request.body], ['query', request.query], ['params', request.params]] as const) {
      const problem = jsonProblem(value, where);
      if (problem) throw new ApiError('invalid_request', `${problem.path}: ${problem.message}`, { issues: [{ field: problem.path, message: problem.message }] });
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
    request.log.info(
      { method: request.method, route, url: request.url.split('?')[0], status: reply.statusCode, duration_ms: reply.elapsedTime },
      'request',
    );
  });
  app.addHook('onReady', async () => {
    await lease.start();
    await catalog.start();
    await killSwitches.start();
    expirySweeper.start();
    recovery.start();
    retention.start();
  });
  // Each step that needs the database waits for it at most CLOSE_STEP_WAIT_MS: in a silent
  // partition none would ever finish, and closing the database (the caller's next step) destroys
  // the connections still waiting.
  app.addHook('onClose', async () => {
    clearInterval(drain);
    await Promise.all([expirySweeper.stop(), recovery.stop(), retention.stop()]);
    await Promise.all([
      // Every call in flight has finished: nothing this replica held is busy any more.
      lease.stop(),
      waitAtMost(Promise.all([catalog.close(), budgets.close(), rateLimiter.close(), killSwitches.stop()])),
      backend.close(),
    ]);
    await waitAtMost(audit.drain());
  });

  await app.register(authPlugin, {
    keys: options.keys,
    issuer: config.jwt.issuer,
    audience: config.jwt.audience,
    maxTtlSeconds: config.jwt.maxTtlSeconds,
    audit,
  });
  await app.register(idempotencyPlugin, { keys: new IdempotencyKeys({ db: database.db, now }) });
  await app.register(operationsRoutes, {
    database,
    metrics,
    readinessChecks: [() => catalog.readiness(), () => killSwitches.readiness()],
  });
  await app.register(docsRoutes);
  await app.register(whoamiRoutes);
  await app.register(auditRoutes, { db: database.db, audit });
  await app.register(grantRoutes, { grants, audit, now });
  await app.register(killSwitchRoutes, {
    service: new KillSwitchService(database.db, killSwitches, now, cascades.killSwitchArmed),
    snapshot: killSwitches,
    audit,
    callTarget: (agent, toolId, tenantId) =>
      callTarget(agent, toolId, undefined, async () => (await getTenantPolicy(database.db, tenantId)).external_call_enabled),
  });
  await app.register(tenantRoutes, { db: database.db, audit, now });
  await app.register(runRoutes, { db: database.db, audit, executor: runs, controls: runControls, handoffs, maxPlanSteps: config.maxPlanSteps });
  await app.register(approvalRoutes, { approvals, audit, now });
  await app.register(toolRoutes, {
    db: database.db,
    catalog,
    now,
    secrets: config.secrets,
    externalCallEnabled: async (tenantId) => (await getTenantPolicy(database.db, tenantId)).external_call_enabled,
  });
  await app.register(budgetRoutes, { db: database.db, audit, now });
  if (config.mcp.enabled) {
    await app.register(mcpRoutes, {
      config: config.mcp,
      metrics,
      catalog,
      runs,
      runControls,
      approvals,
      externalCallEnabled: async (tenantId) => (await getTenantPolicy(database.db, tenantId)).external_call_enabled,
      db: database.db,
      now,
      changeCheckMs: config.registryRefreshMs,
    });
  }
  return app;
}
