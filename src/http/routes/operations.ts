import type { FastifyInstance } from 'fastify';
import type { Database } from '../../db/database.js';
import type { Metrics } from '../../metrics/metrics.js';
import { errorBody } from '../errors.js';

export interface OperationsDeps {
  database: Database;
  metrics: Metrics;
  /** Extra readiness conditions added by other rooms (e.g. snapshot freshness). */
  readinessChecks: Array<() => { ok: boolean; reason?: string }>;
}

/**
 * How long `/ready` waits on its database ping: within the Docker healthcheck's 3 s timeout, and
 * short of the 20 s a silent partition can hold a query.
 */
const READY_PING_WAIT_MS = 2_000;

/** `/health`, `/ready` and `/metrics`: public, for orchestrators and scrapers. */
export async function operationsRoutes(app: FastifyInstance, deps: OperationsDeps): Promise<void> {
  app.get('/health', { config: { access: 'public' } }, async () => ({ status: 'ok' }));

  const unconfirmed = () => deps.readinessChecks.map((check) => check()).find((result) => !result.ok);
  // One ping at a time: probes arriving while one is unanswered wait on it rather than each
  // holding another pooled connection on a database that is slow already.
  let pinging: Promise<void> | undefined;
  const pingOnce = () => (pinging ??= deps.database.ping().finally(() => (pinging = undefined)));

  app.get('/ready', { config: { access: 'public' } }, async (request, reply) => {
    const unready = (stale: { reason?: string }) =>
      reply.code(503).send(errorBody('gateway_unavailable', stale.reason ?? 'not ready', { check: 'snapshot' }));
    // What this replica already knows first: a copy it cannot confirm answers at once, without
    // waiting on a ping a silent network may hold until its timeout.
    const stale = unconfirmed();
    if (stale) return unready(stale);
    const ping = await settledWithin(pingOnce(), READY_PING_WAIT_MS);
    if (ping.settled && !ping.ok) {
      request.log.warn({ err: ping.error }, 'readiness: database unreachable');
      return reply.code(503).send(errorBody('gateway_unavailable', 'database unreachable', { check: 'database' }));
    }
    if (!ping.settled) {
      // Unanswered is not refused: a slow database does not take the replica out of rotation
      // while the snapshots, confirmed against it every second or less, are within their bound,
      // which also bounds how long a silent partition goes unnoticed here (5 s by default).
      const staleNow = unconfirmed();
      request.log.warn(
        { waited_ms: READY_PING_WAIT_MS, snapshots_confirmed: !staleNow },
        'readiness: database ping unanswered',
      );
      if (staleNow) return unready(staleNow);
    }
    return { status: 'ready', database: deps.database.kind };
  });

  app.get('/metrics', { config: { access: 'public' } }, async (_request, reply) => {
    reply.header('content-type', deps.metrics.registry.contentType);
    return deps.metrics.registry.metrics();
  });
}

/** Waits for `promise` at most `ms`; what it came to, if it came to anything by then. */
function settledWithin(
  promise: Promise<unknown>,
  ms: number,
): Promise<{ settled: false } | { settled: true; ok: true } | { settled: true; ok: false; error: unknown }> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve({ settled: false }), ms);
    promise.then(
      () => {
        clearTimeout(timer);
        resolve({ settled: true, ok: true });
      },
      (error: unknown) => {
        clearTimeout(timer);
        resolve({ settled: true, ok: false, error });
      },
    );
  });
}
