import { createRequire } from 'node:module';
import { diag, DiagLogLevel, type DiagLogger } from '@opentelemetry/api';
import { OTLPTraceExporter as JsonExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { OTLPTraceExporter as ProtobufExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { PgInstrumentation } from '@opentelemetry/instrumentation-pg';
import { resourceFromAttributes } from '@opentelemetry/resources';
import {
  AlwaysOffSampler,
  AlwaysOnSampler,
  BatchSpanProcessor,
  ConsoleSpanExporter,
  NodeTracerProvider,
  ParentBasedSampler,
  TraceIdRatioBasedSampler,
  type Sampler,
  type SpanExporter,
} from '@opentelemetry/sdk-trace-node';
import type { Logger } from 'pino';
import type { TelemetrySettings } from '../config/config.js';

/** The tracing SDK of this process, started once (server.ts) before the app is built. */
export interface Telemetry {
  /** Exports the spans ended so far (tests, and a shutdown). */
  flush(): Promise<void>;
  /** Exports what is left and stops exporting. */
  shutdown(): Promise<void>;
}

const packageVersion = (createRequire(import.meta.url)('../../package.json') as { version: string }).version;

/*
 * Of the instrumentations, only pg's fits: the http one must load before fastify (an --import hook
 * for ES modules) and would not name the route or give the audit records its trace id, so a fastify
 * hook makes the server span (src/http/request-tracing.ts); the undici one would record a GET call's
 * query, which carries its input, as `url.full`, so the dispatcher makes the backend call's span.
 */

/**
 * Starts the OpenTelemetry SDK from the settings config read: the tracer provider, registered
 * globally (with the AsyncLocalStorage context manager and the W3C propagator), its exporter, and
 * the `pg` instrumentation for database statements. Never called when traces are off: then the
 * API's no-op tracer answers every span helper.
 */
export function startTelemetry(settings: TelemetrySettings, logger?: Logger): Telemetry {
  if (logger) diag.setLogger(diagLoggerOf(logger), DiagLogLevel.WARN);
  const provider = new NodeTracerProvider({
    resource: resourceFromAttributes({
      ...settings.resourceAttributes,
      'service.name': settings.serviceName,
      'service.version': packageVersion,
    }),
    sampler: samplerOf(settings),
    spanProcessors: [new BatchSpanProcessor(exporterOf(settings))],
  });
  provider.register();
  const pg = new PgInstrumentation({ requireParentSpan: true });
  pg.setTracerProvider(provider);
  patchLoadedPg();
  return {
    flush: () => provider.forceFlush(),
    shutdown: async () => {
      pg.disable();
      await provider.shutdown();
    },
  };
}

function exporterOf(settings: TelemetrySettings): SpanExporter {
  if (settings.exporter === 'console') return new ConsoleSpanExporter();
  const options = { url: settings.endpoint, headers: settings.headers };
  return settings.protocol === 'http/json' ? new JsonExporter(options) : new ProtobufExporter(options);
}

function samplerOf({ sampler, samplerRatio }: TelemetrySettings): Sampler {
  const root = sampler.endsWith('always_on')
    ? new AlwaysOnSampler()
    : sampler.endsWith('always_off')
      ? new AlwaysOffSampler()
      : new TraceIdRatioBasedSampler(samplerRatio);
  return sampler.startsWith('parentbased_') ? new ParentBasedSampler({ root }) : root;
}

/**
 * The instrumentation patches `pg` as it is required; toolgate's ES modules imported it before the
 * SDK could start, so it is required once more here, which patches the classes every pool shares.
 */
function patchLoadedPg(): void {
  const require = createRequire(import.meta.url);
  require('pg');
  // pg-pool as pg itself loads it, wherever the installation put it.
  createRequire(require.resolve('pg'))('pg-pool');
}

function diagLoggerOf(logger: Logger): DiagLogger {
  const log =
    (level: 'warn' | 'error' | 'info' | 'debug') =>
    (message: string, ...args: unknown[]) =>
      logger[level]({ otel: args.length > 0 ? args.map(String) : undefined }, `opentelemetry: ${message}`);
  return { error: log('error'), warn: log('warn'), info: log('info'), debug: log('debug'), verbose: log('debug') };
}
