import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Writable } from 'node:stream';
import { Client, StreamableHTTPClientTransport, type CallToolResult } from '@modelcontextprotocol/client';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp } from '../src/app.js';
import { loadVerificationKeys } from '../src/auth/jwt-keys.js';
import { createLogger } from '../src/logger.js';
import { startTelemetry, type Telemetry } from '../src/telemetry/telemetry.js';
import { TestBackend } from './helpers/backend.js';
import { createTestDatabase, hasPostgresServer, type TestDatabase } from './helpers/database.js';
import { AppClient, testConfig } from './helpers/harness.js';
import { TEST_JWT_SECRET, tokens } from './helpers/tokens.js';
import { until } from './helpers/waits.js';
import { grantTool, newRunId, registerTool } from './helpers/world.js';

/**
 * OpenTelemetry traces (SPEC §15): a gateway exporting OTLP/HTTP (JSON) to a receiver in this
 * test, which decodes what it receives. Each call continues the caller's trace.
 */
const T = 'tenant-otel';
const AGENT = 'otel.agent';
const agentToken = tokens.agent(AGENT, { tenant: T });
const operator = tokens.tenantOperator(T);

interface OtlpSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  name: string;
  kind: number;
  attributes: Record<string, unknown>;
  events: Array<{ name: string; attributes: Record<string, unknown> }>;
  status?: { code?: number };
  resource: Record<string, unknown>;
}
const SERVER = 2;
const CLIENT = 3;

type OtlpAttribute = { key: string; value: Record<string, unknown> };
const attributesOf = (list: OtlpAttribute[] = []) =>
  Object.fromEntries(list.map(({ key, value }) => [key, Object.values(value)[0]]));

/** An OTLP/HTTP receiver (the JSON protocol): every span it was sent, decoded. */
class OtlpReceiver {
  readonly spans: OtlpSpan[] = [];
  readonly bodies: string[] = [];
  private server: Server | undefined;
  url = '';

  async start(): Promise<this> {
    this.server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (chunk: Buffer) => chunks.push(chunk));
      req.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        if (req.url === '/v1/traces' && req.method === 'POST') {
          this.bodies.push(text);
          this.decode(JSON.parse(text));
        }
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end('{}');
      });
    });
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
    return this;
  }

  private decode(body: {
    resourceSpans: Array<{
      resource: { attributes: OtlpAttribute[] };
      scopeSpans: Array<{
        spans: Array<
          Omit<OtlpSpan, 'attributes' | 'events' | 'resource'> & {
            attributes: OtlpAttribute[];
            events?: Array<{ name: string; attributes?: OtlpAttribute[] }>;
          }
        >;
      }>;
    }>;
  }): void {
    for (const resourceSpans of body.resourceSpans) {
      const resource = attributesOf(resourceSpans.resource.attributes);
      for (const scope of resourceSpans.scopeSpans)
        for (const span of scope.spans)
          this.spans.push({
            ...span,
            attributes: attributesOf(span.attributes),
            events: (span.events ?? []).map((event) => ({
              name: event.name,
              attributes: attributesOf(event.attributes),
            })),
            resource,
          });
    }
  }

  inTrace(traceId: string): OtlpSpan[] {
    return this.spans.filter((span) => span.traceId === traceId);
  }

  close(): Promise<void> {
    return new Promise((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }
}

let receiver: OtlpReceiver;
let backend: TestBackend;
let telemetry: Telemetry;
let db: TestDatabase;
let app: FastifyInstance;
let client: AppClient;
let base: string;
let mcp: Client;
const logLines: Array<Record<string, unknown>> = [];

const traceIdOf = (n: number) => `${'0af7651916cd43dd8448eb211c80319'}${n}`;
const CALLER_SPAN = 'b7ad6b7169203331';
const traceparent = (n: number) => `00-${traceIdOf(n)}-${CALLER_SPAN}-01`;

beforeAll(async () => {
  receiver = await new OtlpReceiver().start();
  backend = await new TestBackend().start();
  const config = testConfig({
    OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
    OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json',
    OTEL_SERVICE_NAME: 'toolgate-under-test',
    OTEL_RESOURCE_ATTRIBUTES: 'deployment.environment.name=test,team=gate%20keepers',
  });
  telemetry = startTelemetry(config.telemetry!);
  db = await createTestDatabase();
  const sink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      for (const line of chunk.toString('utf8').split('\n')) if (line) logLines.push(JSON.parse(line));
      done();
    },
  });
  app = await buildApp({
    config,
    database: db.database,
    keys: await loadVerificationKeys(config),
    logger: createLogger('info', { traced: true, destination: sink }),
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  base = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
  client = new AppClient(app);
  await registerTool(client, { id: 'echo', backendUrl: `${backend.url}/echo`, allowed_agents: [AGENT] });
  await registerTool(client, { id: 'ungranted', backendUrl: `${backend.url}/echo`, allowed_agents: [AGENT] });
  await grantTool(client, { tenant: T, agent: AGENT, tool: 'echo' });
  mcp = new Client({ name: 'otel-test', version: '1.0.0' });
  await mcp.connect(
    new StreamableHTTPClientTransport(new URL(`${base}/mcp`), {
      requestInit: { headers: { authorization: `Bearer ${agentToken}` } },
    }),
  );
});

afterAll(async () => {
  await mcp?.close().catch(() => undefined);
  await app?.close();
  await db?.drop();
  await telemetry?.shutdown();
  await backend?.close();
  await receiver?.close();
});

/** `POST /runs/execute` over the wire, as an agent runtime sends it, with its trace. */
async function execute(n: number, runId: string, toolId: string, marker: string) {
  const response = await fetch(`${base}/runs/execute`, {
    method: 'POST',
    headers: {
      authorization: `Bearer ${agentToken}`,
      'content-type': 'application/json',
      traceparent: traceparent(n),
    },
    body: JSON.stringify({ run_id: runId, context: {}, plan: [{ tool_id: toolId, input: { q: marker } }] }),
  });
  return { status: response.status, body: (await response.json()) as { status: string } };
}

/** The spans of a trace, once its tool call span and its server or MCP span have arrived. */
async function traceOf(n: number, done: (spans: OtlpSpan[]) => boolean): Promise<OtlpSpan[]> {
  await until(
    `the spans of trace ${n}`,
    async () => {
      await telemetry.flush();
      return done(receiver.inTrace(traceIdOf(n)));
    },
    { intervalMs: 50 },
  );
  return receiver.inTrace(traceIdOf(n));
}

const toolSpanOf = (spans: OtlpSpan[]) =>
  spans.find((span) => span.attributes['gen_ai.operation.name'] === 'execute_tool');
/** The backend call's client span (the database statements' spans are client spans too). */
const isBackendCall = (span: OtlpSpan) => span.kind === CLIENT && 'http.request.method' in span.attributes;
const childrenOf = (spans: OtlpSpan[], parent: OtlpSpan) => spans.filter((span) => span.parentSpanId === parent.spanId);
/** Whether `span` descends from `ancestor` within `spans`. */
function descends(spans: OtlpSpan[], span: OtlpSpan, ancestor: OtlpSpan): boolean {
  const byId = new Map(spans.map((s) => [s.spanId, s]));
  for (let at = byId.get(span.parentSpanId ?? ''); at; at = byId.get(at.parentSpanId ?? ''))
    if (at.spanId === ancestor.spanId) return true;
  return false;
}

describe('OpenTelemetry traces', () => {
  it('traces an admitted call in the caller’s trace: server span, execute_tool, admission, audit writes, the backend’s client span, statements', async () => {
    const runId = newRunId('otel');
    const marker = 'secret-input-admitted';
    const before = backend.hitsOn('/echo').length;
    const answer = await execute(1, runId, 'echo', marker);
    expect(answer.status).toBe(200);
    expect(answer.body.status).toBe('completed');
    const spans = await traceOf(1, (s) => s.some((span) => span.kind === SERVER) && toolSpanOf(s) !== undefined);

    const server = spans.find((span) => span.kind === SERVER)!;
    expect(server.parentSpanId).toBe(CALLER_SPAN);
    expect(server.name).toBe('POST /runs/execute');
    expect(server.attributes).toMatchObject({ 'http.route': '/runs/execute', 'http.response.status_code': 200 });
    expect(server.resource).toMatchObject({
      'service.name': 'toolgate-under-test',
      'deployment.environment.name': 'test',
      team: 'gate keepers',
    });

    const tool = toolSpanOf(spans)!;
    expect(tool.name).toBe('execute_tool echo');
    expect(descends(spans, tool, server)).toBe(true);
    expect(tool.attributes).toMatchObject({
      'gen_ai.operation.name': 'execute_tool',
      'gen_ai.tool.name': 'echo',
      'gen_ai.agent.id': AGENT,
      'toolgate.tenant.id': T,
      'toolgate.run.id': runId,
      'toolgate.decision': 'admitted',
      'toolgate.tool.version': '1.0.0',
    });
    expect(tool.attributes['gen_ai.tool.call.id']).toMatch(new RegExp(`^${runId}:0:`));

    const children = childrenOf(spans, tool);
    expect(children.find((span) => span.name === 'admission')!.attributes).toMatchObject({
      'toolgate.decision': 'admitted',
    });
    expect(
      children
        .filter((span) => span.name === 'audit.append')
        .map((span) => span.attributes['toolgate.audit.event_type']),
    ).toEqual(expect.arrayContaining(['run.step.dispatching', 'run.step.completed']));

    // The backend received the client span's id as its parent.
    const hit = backend.hitsOn('/echo')[before]!;
    const sent = /^00-([0-9a-f]{32})-([0-9a-f]{16})-01$/.exec(String(hit.headers.traceparent));
    expect(sent?.[1]).toBe(traceIdOf(1));
    const backendCall = spans.find(isBackendCall)!;
    expect(backendCall.spanId).toBe(sent?.[2]);
    expect(backendCall.parentSpanId).toBe(tool.spanId);
    expect(backendCall.attributes).toMatchObject({ 'http.request.method': 'POST', 'http.response.status_code': 200 });

    // Database statements, by the pg instrumentation, within the request's trace.
    if (hasPostgresServer) {
      const statements = spans.filter((span) => span.attributes['db.system.name'] === 'postgresql');
      expect(statements.length).toBeGreaterThan(0);
      for (const statement of statements) expect(descends(spans, statement, server)).toBe(true);
    }

    // The request's log line names the request's span.
    await until('the request’s log line', () =>
      logLines.some((line) => line.msg === 'request' && line.trace_id === traceIdOf(1)),
    );
    const line = logLines.find((l) => l.msg === 'request' && l.trace_id === traceIdOf(1))!;
    expect(line.span_id).toBe(server.spanId);
  });

  it('traces a refused call with the stage that refused it and its reason code', async () => {
    const runId = newRunId('otel');
    const answer = await execute(2, runId, 'ungranted', 'secret-input-refused');
    expect(answer.status).toBe(403);
    const spans = await traceOf(2, (s) => s.some((span) => span.kind === SERVER) && toolSpanOf(s) !== undefined);
    expect(spans.find((span) => span.kind === SERVER)!.parentSpanId).toBe(CALLER_SPAN);
    const tool = toolSpanOf(spans)!;
    expect(tool.attributes).toMatchObject({
      'gen_ai.tool.name': 'ungranted',
      'toolgate.decision': 'denied',
      'error.type': 'grant_missing',
      'toolgate.run.id': runId,
    });
    const admission = childrenOf(spans, tool).find((span) => span.name === 'admission')!;
    expect(admission.attributes).toMatchObject({
      'toolgate.decision': 'denied',
      'toolgate.admission.stage': 'grant',
      'toolgate.reason_code': 'grant_missing',
    });
    expect(admission.events).toContainEqual({
      name: 'admission.refused',
      attributes: { 'toolgate.admission.stage': 'grant', 'toolgate.reason_code': 'grant_missing' },
    });
    expect(spans.some(isBackendCall)).toBe(false);
  });

  it('continues the trace of an MCP call’s _meta.traceparent', async () => {
    const runId = newRunId('otel-mcp');
    const before = backend.hitsOn('/echo').length;
    const result = (await mcp.callTool({
      name: 'echo',
      arguments: { q: 'secret-input-mcp' },
      _meta: { 'dev.toolgate/run': { run_id: runId }, traceparent: traceparent(3) },
    })) as CallToolResult;
    expect(result.isError).toBe(false);
    const spans = await traceOf(3, (s) => s.some(isBackendCall) && toolSpanOf(s) !== undefined);
    const tool = toolSpanOf(spans)!;
    expect(tool.parentSpanId).toBe(CALLER_SPAN);
    expect(tool.attributes).toMatchObject({
      'gen_ai.tool.name': 'echo',
      'toolgate.run.id': runId,
      'toolgate.via': 'mcp',
      'toolgate.decision': 'admitted',
    });
    const hit = backend.hitsOn('/echo')[before]!;
    const backendCall = spans.find(isBackendCall)!;
    expect(hit.headers.traceparent).toBe(`00-${traceIdOf(3)}-${backendCall.spanId}-01`);
  });

  it('traces an MCP call without _meta.traceparent under its HTTP request’s span', async () => {
    const headerClient = new Client({ name: 'otel-test-header', version: '1.0.0' });
    await headerClient.connect(
      new StreamableHTTPClientTransport(new URL(`${base}/mcp`), {
        requestInit: { headers: { authorization: `Bearer ${agentToken}`, traceparent: traceparent(4) } },
      }),
    );
    try {
      const runId = newRunId('otel-mcp');
      const result = (await headerClient.callTool({
        name: 'echo',
        arguments: { q: 'secret-input-mcp-header' },
        _meta: { 'dev.toolgate/run': { run_id: runId } },
      })) as CallToolResult;
      expect(result.isError).toBe(false);
      const spans = await traceOf(4, (s) => toolSpanOf(s)?.attributes['toolgate.run.id'] === runId);
      const tool = spans.find(
        (span) => span.attributes['toolgate.run.id'] === runId && span.name.startsWith('execute_tool'),
      )!;
      const server = spans.find((span) => span.kind === SERVER && descends(spans, tool, span))!;
      expect(server.name).toBe('POST /mcp');
      expect(server.parentSpanId).toBe(CALLER_SPAN);
    } finally {
      await headerClient.close().catch(() => undefined);
    }
  });

  it('puts no payload, token or secret in any attribute', async () => {
    expect(receiver.spans.length).toBeGreaterThan(0);
    const everything = JSON.stringify(receiver.spans);
    for (const forbidden of ['secret-input-', agentToken, operator, TEST_JWT_SECRET, 'Bearer '])
      expect(everything).not.toContain(forbidden);
    // Nor what was sent raw: the exporter's bodies, resource and all.
    for (const body of receiver.bodies) expect(body).not.toContain('secret-input-');
  });
});
