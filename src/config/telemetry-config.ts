import { z } from 'zod';

/** The samplers of the OpenTelemetry specification's `OTEL_TRACES_SAMPLER`. */
export const SAMPLERS = [
  'always_on',
  'always_off',
  'traceidratio',
  'parentbased_always_on',
  'parentbased_always_off',
  'parentbased_traceidratio',
] as const;
export type SamplerName = (typeof SAMPLERS)[number];

/**
 * OpenTelemetry traces as the standard `OTEL_*` variables ask for them (docs/operations.md#traces).
 * Read here like every other variable, and handed to the SDK as values; the exporters still read
 * their finer variables themselves (timeout, compression, certificates), which toolgate never sets.
 */
export interface TelemetrySettings {
  exporter: 'otlp' | 'console';
  /** The full URL spans are posted to (`…/v1/traces`). */
  endpoint: string;
  protocol: 'http/protobuf' | 'http/json';
  /** Sent with every export (an API key for a hosted backend): never logged. */
  headers: Record<string, string>;
  serviceName: string;
  /** `OTEL_RESOURCE_ATTRIBUTES`, without `service.name` (`serviceName` says it). */
  resourceAttributes: Record<string, string>;
  sampler: SamplerName;
  /** The ratio of the `traceidratio` samplers, 0 to 1. */
  samplerRatio: number;
}

const DEFAULT_ENDPOINT = 'http://localhost:4318';

const blank = (value: unknown) => (value === '' ? undefined : value);
const optional = z.preprocess(blank, z.string().trim().optional());
const url = z.preprocess(
  blank,
  z
    .string()
    .refine((value) => /^https?:$/.test(safeUrl(value)?.protocol ?? ''), 'must be an http(s) URL')
    .optional(),
);
/** `key=value,key=value` with percent-encoded values, as OTEL_RESOURCE_ATTRIBUTES and the header variables are. */
const keyValues = z.preprocess(
  blank,
  z
    .string()
    .optional()
    .transform((value, ctx) => {
      const pairs: Record<string, string> = {};
      for (const entry of (value ?? '').split(',')) {
        if (entry.trim() === '') continue;
        const at = entry.indexOf('=');
        const key = at > 0 ? entry.slice(0, at).trim() : '';
        let decoded: string | undefined;
        try {
          decoded = at > 0 ? decodeURIComponent(entry.slice(at + 1).trim()) : undefined;
        } catch {
          decoded = undefined;
        }
        if (key === '' || decoded === undefined) {
          ctx.addIssue({
            code: 'custom',
            message: 'must be a comma-separated list of key=value (values percent-encoded)',
          });
          return z.NEVER;
        }
        pairs[key] = decoded;
      }
      return pairs;
    }),
);
const protocol = z.preprocess(
  blank,
  z
    .enum(['http/protobuf', 'http/json', 'grpc'])
    .refine((value) => value !== 'grpc', 'grpc is not supported: use http/protobuf (port 4318) or http/json')
    .optional(),
);

export const telemetryEnvironment = z.object({
  OTEL_SDK_DISABLED: z.preprocess(blank, z.enum(['true', 'false']).optional()),
  OTEL_TRACES_EXPORTER: z.preprocess(
    blank,
    z.enum(['otlp', 'console', 'none'], { message: 'must be otlp, console or none' }).optional(),
  ),
  OTEL_EXPORTER_OTLP_ENDPOINT: url,
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: url,
  OTEL_EXPORTER_OTLP_PROTOCOL: protocol,
  OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: protocol,
  OTEL_EXPORTER_OTLP_HEADERS: keyValues,
  OTEL_EXPORTER_OTLP_TRACES_HEADERS: keyValues,
  OTEL_SERVICE_NAME: optional,
  OTEL_RESOURCE_ATTRIBUTES: keyValues,
  OTEL_TRACES_SAMPLER: z.preprocess(
    blank,
    z.enum(SAMPLERS, { message: `must be one of ${SAMPLERS.join(', ')}` }).default('parentbased_always_on'),
  ),
  OTEL_TRACES_SAMPLER_ARG: z.preprocess(blank, z.coerce.number().min(0).max(1).default(1)),
});

/**
 * Traces are off unless an OTLP endpoint or `OTEL_TRACES_EXPORTER` asks for them (and never with
 * `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`): then no SDK is started at all.
 */
export function telemetrySettingsOf(e: z.output<typeof telemetryEnvironment>): TelemetrySettings | undefined {
  const endpointGiven = e.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT ?? e.OTEL_EXPORTER_OTLP_ENDPOINT;
  if (e.OTEL_SDK_DISABLED === 'true' || e.OTEL_TRACES_EXPORTER === 'none') return undefined;
  if (e.OTEL_TRACES_EXPORTER === undefined && endpointGiven === undefined) return undefined;
  const { ['service.name']: namedService, ...resourceAttributes } = e.OTEL_RESOURCE_ATTRIBUTES;
  return {
    exporter: e.OTEL_TRACES_EXPORTER ?? 'otlp',
    // The signal-specific endpoint is used as given; the general one is a base the signal's path is added to.
    endpoint:
      e.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT ??
      `${(e.OTEL_EXPORTER_OTLP_ENDPOINT ?? DEFAULT_ENDPOINT).replace(/\/+$/, '')}/v1/traces`,
    protocol: e.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL ?? e.OTEL_EXPORTER_OTLP_PROTOCOL ?? 'http/protobuf',
    headers: { ...e.OTEL_EXPORTER_OTLP_HEADERS, ...e.OTEL_EXPORTER_OTLP_TRACES_HEADERS },
    serviceName: e.OTEL_SERVICE_NAME ?? namedService ?? 'toolgate',
    resourceAttributes,
    sampler: e.OTEL_TRACES_SAMPLER,
    samplerRatio: e.OTEL_TRACES_SAMPLER_ARG,
  };
}

function safeUrl(value: string): URL | undefined {
  try {
    return new URL(value);
  } catch {
    return undefined;
  }
}
