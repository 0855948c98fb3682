import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

/** The Prometheus metrics of one gateway instance, on a registry of its own. */
export interface Metrics {
  registry: Registry;
  httpDuration: Histogram<'method' | 'route' | 'status_code'>;
  auditEventsCommitted: Counter;
  auditCommitBatchSize: Histogram;
  /** Seconds from a record's writing to the signed checkpoint that first covers it. */
  auditSequencingDelay: Histogram;
  decisions: Counter<'outcome' | 'reason'>;
  admissionDuration: Histogram;
  backendDuration: Histogram<'tool_id' | 'outcome'>;
  /** MCP requests by JSON-RPC method and outcome. */
  mcpRequests: Counter<'method' | 'outcome'>;
}

export function createMetrics(): Metrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  return {
    registry,
    httpDuration: new Histogram({
      name: 'toolgate_http_request_duration_seconds',
      help: 'HTTP request duration by route and status',
      labelNames: ['method', 'route', 'status_code'],
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers: [registry],
    }),
    auditEventsCommitted: new Counter({
      name: 'toolgate_audit_events_committed_total',
      help: 'Audit events committed to the hash chain',
      registers: [registry],
    }),
    auditCommitBatchSize: new Histogram({
      name: 'toolgate_audit_commit_batch_size',
      help: 'Events per audit group commit',
      buckets: [1, 2, 5, 10, 25, 50, 100, 250, 500],
      registers: [registry],
    }),
    auditSequencingDelay: new Histogram({
      name: 'toolgate_audit_sequencing_delay_seconds',
      help: "Seconds from an audit record's writing to the signed checkpoint that first covers it",
      buckets: [0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 2, 5, 10],
      registers: [registry],
    }),
    decisions: new Counter({
      name: 'toolgate_decisions_total',
      help: 'Step decisions by outcome (admitted, denied, completed, failed) and reason code',
      labelNames: ['outcome', 'reason'],
      registers: [registry],
    }),
    admissionDuration: new Histogram({
      name: 'toolgate_admission_duration_seconds',
      help: 'Time to run one step through the admission stages',
      buckets: [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5],
      registers: [registry],
    }),
    backendDuration: new Histogram({
      name: 'toolgate_backend_duration_seconds',
      help: 'Tool backend call duration by tool and outcome',
      labelNames: ['tool_id', 'outcome'],
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
      registers: [registry],
    }),
    mcpRequests: new Counter({
      name: 'toolgate_mcp_requests_total',
      help: 'MCP requests by JSON-RPC method and outcome (ok, tool_error, error; unauthenticated, forbidden, method_not_allowed, invalid for refused requests)',
      labelNames: ['method', 'outcome'],
      registers: [registry],
    }),
  };
}

/** Exposes the age of this replica's copy of the tool registry, read at each scrape (-1: never confirmed). */
export function watchCatalogAge(metrics: Metrics, ageMs: () => number): void {
  new Gauge({
    name: 'toolgate_registry_catalog_age_seconds',
    help: "Time since this replica's copy of the tool registry was last confirmed current",
    registers: [metrics.registry],
    collect() {
      const age = ageMs();
      this.set(Number.isFinite(age) ? age / 1000 : -1);
    },
  });
}

/** Exposes the statements this instance sent to PostgreSQL, read at each scrape. */
export function countStatementsSent(metrics: Metrics, sent: () => number): void {
  new Counter({
    name: 'toolgate_db_statements_total',
    help: 'Statements this instance sent to PostgreSQL (each a round trip)',
    registers: [metrics.registry],
    collect() {
      this.reset();
      this.inc(sent());
    },
  });
}
