import { describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from '../../src/config/config.js';

/** The standard OTEL_* variables, read by config like every other (SPEC §15). */
const telemetryOf = (env: Record<string, string>) => loadConfig(env).telemetry;

describe('OpenTelemetry configuration', () => {
  it('is off unless an OTLP endpoint or OTEL_TRACES_EXPORTER asks for traces', () => {
    expect(telemetryOf({})).toBeUndefined();
    expect(telemetryOf({ OTEL_SERVICE_NAME: 'gate', OTEL_TRACES_SAMPLER: 'always_on' })).toBeUndefined();
    expect(telemetryOf({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318' })).toBeDefined();
    expect(telemetryOf({ OTEL_TRACES_EXPORTER: 'otlp' })).toBeDefined();
  });

  it('stays off when OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none', () => {
    const endpoint = { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318' };
    expect(telemetryOf({ ...endpoint, OTEL_SDK_DISABLED: 'true' })).toBeUndefined();
    expect(telemetryOf({ ...endpoint, OTEL_TRACES_EXPORTER: 'none' })).toBeUndefined();
  });

  it('adds /v1/traces to the general endpoint, takes the traces endpoint as given, and defaults to localhost:4318', () => {
    expect(telemetryOf({ OTEL_EXPORTER_OTLP_ENDPOINT: 'https://collector:4318/' })?.endpoint).toBe(
      'https://collector:4318/v1/traces',
    );
    expect(
      telemetryOf({
        OTEL_EXPORTER_OTLP_ENDPOINT: 'https://collector:4318',
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'https://api.honeycomb.io/v1/traces',
      })?.endpoint,
    ).toBe('https://api.honeycomb.io/v1/traces');
    expect(telemetryOf({ OTEL_TRACES_EXPORTER: 'otlp' })?.endpoint).toBe('http://localhost:4318/v1/traces');
  });

  it('reads the defaults of the specification: http/protobuf, parentbased_always_on, service toolgate', () => {
    expect(telemetryOf({ OTEL_TRACES_EXPORTER: 'otlp' })).toEqual({
      exporter: 'otlp',
      endpoint: 'http://localhost:4318/v1/traces',
      protocol: 'http/protobuf',
      headers: {},
      serviceName: 'toolgate',
      resourceAttributes: {},
      sampler: 'parentbased_always_on',
      samplerRatio: 1,
    });
  });

  it('reads headers, resource attributes (percent-encoded), the service name, the protocol and the sampler', () => {
    expect(
      telemetryOf({
        OTEL_EXPORTER_OTLP_ENDPOINT: 'https://api.honeycomb.io',
        OTEL_EXPORTER_OTLP_HEADERS: 'x-honeycomb-team=abc%3D123,x-other=1',
        OTEL_EXPORTER_OTLP_TRACES_HEADERS: 'x-other=2',
        OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json',
        OTEL_RESOURCE_ATTRIBUTES: 'service.name=ignored,deployment.environment.name=prod,team=gate%20keepers',
        OTEL_SERVICE_NAME: 'gateway-eu',
        OTEL_TRACES_SAMPLER: 'parentbased_traceidratio',
        OTEL_TRACES_SAMPLER_ARG: '0.25',
      }),
    ).toMatchObject({
      headers: { 'x-honeycomb-team': 'abc=123', 'x-other': '2' },
      protocol: 'http/json',
      serviceName: 'gateway-eu',
      resourceAttributes: { 'deployment.environment.name': 'prod', team: 'gate keepers' },
      sampler: 'parentbased_traceidratio',
      samplerRatio: 0.25,
    });
    expect(
      telemetryOf({ OTEL_TRACES_EXPORTER: 'otlp', OTEL_RESOURCE_ATTRIBUTES: 'service.name=from-resource' })
        ?.serviceName,
    ).toBe('from-resource');
  });

  it('refuses what it cannot honour, naming the variable', () => {
    for (const [name, value] of [
      ['OTEL_EXPORTER_OTLP_PROTOCOL', 'grpc'],
      ['OTEL_TRACES_EXPORTER', 'zipkin'],
      ['OTEL_TRACES_SAMPLER', 'sometimes'],
      ['OTEL_TRACES_SAMPLER_ARG', '2'],
      ['OTEL_EXPORTER_OTLP_ENDPOINT', 'collector:4318'],
      ['OTEL_RESOURCE_ATTRIBUTES', 'no-value'],
    ] as const) {
      expect(() => loadConfig({ OTEL_TRACES_EXPORTER: 'otlp', [name]: value }), name).toThrow(ConfigError);
      expect(() => loadConfig({ OTEL_TRACES_EXPORTER: 'otlp', [name]: value }), name).toThrow(name);
    }
  });
});
