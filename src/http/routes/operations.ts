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

/** `/health`, `/ready` and `/metrics`: public, for orchestrators and scrapers. */
export async function operationsRoutes(app: FastifyInstance, deps: OperationsDeps): Promise<void> {
  app.get('/health', { config: { access: 'public' } }, async () => ({ status: 'ok' }));

  app.get('/ready', { config: { access: 'public' } }, async (request, reply) => {
    // What this replica already knows first: a copy it cannot confirm answers at once, without
    // waiting on a ping a silent network may hold until its timeout.
    for (const check of deps.readinessChecks) {
      const result = check();
      if (!result.ok) {
        return reply.code(503).send(errorBody('gateway_unavailable', result.reason ?? 'not ready', { check: 'snapshot' }));
      }
    }
    try {
      await deps.database.ping();
    } catch (error) {
      request.log.warn({ err: error }, 'readiness: database unreachable');
      return reply.code(503).send(errorBody('gateway_unavailable', 'database unreachable', { check: 'database' }));
    }
    return { status: 'ready', database: deps.database.kind };
  });

  app.get('/metrics', { config: { access: 'public' } }, async (_request, reply) => {
    reply.header('content-type', deps.metrics.registry.contentType);
    return deps.metrics.registry.metrics();
  });
}
