import Fastify, { type FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { contractPlugin, serializerSchemas } from '../src/http/contract.js';
import { errorBody } from '../src/http/errors.js';
import { openapi } from './helpers/contract.js';
import { startHarness, type Harness } from './helpers/harness.js';

type Json = Record<string, any>;

const METHODS = ['get', 'put', 'post', 'delete', 'patch', 'options'];

function deref(node: Json): Json {
  if (typeof node.$ref !== 'string') return node;
  let target: any = openapi;
  for (const part of node.$ref.replace(/^#\//, '').split('/')) target = target[part];
  return deref(target);
}

/** What openapi.yaml, read here on its own, documents as each route's JSON answers, by `METHOD /path`. */
const documented = new Map<string, Map<string, unknown>>(
  Object.entries(openapi.paths).flatMap(([path, item]) =>
    Object.entries(item)
      .filter(([method]) => METHODS.includes(method))
      .map(([method, operation]) => {
        const answers = Object.entries((operation as Json).responses as Record<string, Json>).flatMap(
          ([status, response]) => {
            const schema = deref(response).content?.['application/json']?.schema;
            return schema === undefined ? [] : [[status, schema] as const];
          },
        );
        return [`${method.toUpperCase()} ${path}`, new Map(answers)] as const;
      }),
  ),
);

/** The two readings the serializer's copy makes explicit (open objects, no defaults), undone. */
function asWritten(node: unknown): unknown {
  if (Array.isArray(node)) return node.map(asWritten);
  if (typeof node !== 'object' || node === null) return node;
  return Object.fromEntries(
    Object.entries(node)
      .filter(([key, value]) => key !== 'default' && !(key === 'additionalProperties' && value === true))
      .map(([key, value]) => [key, asWritten(value)]),
  );
}

describe('the routes the gateway serves', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness();
  });
  afterAll(() => h.close());

  const served = () =>
    h.client.app.registeredRoutes
      .filter((route) => !/ \/docs/.test(route) && !route.startsWith('HEAD '))
      .map((route) => ({ route, template: route.replace(/:([A-Za-z_]+)/g, '{$1}') }));

  it('each declare, as response schemas, exactly the JSON answers openapi.yaml documents for them', () => {
    const declared = served().map(({ route, template }) => [
      template,
      Object.keys(h.client.app.responseSchemas.get(route) ?? {}).sort(),
    ]);
    const expected = served().map(({ template }) => [template, [...(documented.get(template)?.keys() ?? [])].sort()]);
    expect(declared).toEqual(expected);
  });

  it("take each schema from openapi.yaml: a reference that leads to the document's own schema", () => {
    const shared = serializerSchemas(openapi);
    const drifted = served().flatMap(({ route, template }) =>
      Object.entries(h.client.app.responseSchemas.get(route) ?? {}).flatMap(([status, response]) => {
        const ref = response.content['application/json'].schema.$ref;
        const [id, at] = ref.split('#/');
        let target: any = shared;
        for (const part of at!.split('/')) target = target?.[part];
        const same =
          id === shared.$id &&
          JSON.stringify(asWritten(target)) === JSON.stringify(asWritten(documented.get(template)!.get(status)));
        return same ? [] : [`${template} ${status}: ${ref}`];
      }),
    );
    expect(drifted).toEqual([]);
  });
});

describe('an answer serialized with its openapi.yaml schema', () => {
  let app: FastifyInstance;
  let answer: { status: number; body: unknown } = { status: 200, body: {} };
  beforeAll(async () => {
    app = Fastify();
    await app.register(contractPlugin);
    // A string goes out as kept, the way an idempotent replay's does.
    const handler = async (_request: unknown, reply: any) =>
      typeof answer.body === 'string'
        ? reply.code(answer.status).type('application/json; charset=utf-8').send(answer.body)
        : reply.code(answer.status).send(answer.body);
    for (const url of ['/whoami', '/tools/:id', '/runs/:run_id']) app.get(url, handler);
    app.post('/runs/execute', handler);
    await app.ready();
  });
  afterAll(() => app.close());

  async function serve(method: 'GET' | 'POST', url: string, status: number, body: unknown) {
    answer = { status, body };
    // A POST carries what its route takes: its request is checked against openapi.yaml too.
    const payload = method === 'POST' ? { run_id: 'r1', plan: [{ tool_id: 'web.fetch', input: {} }] } : undefined;
    const response = await app.inject({ method, url, payload });
    expect(response.statusCode).toBe(status);
    return response.json();
  }

  const principal = { kind: 'agent', id: 'a1', tenant_id: 't1', role: null, family: null, scopes: ['read'] };
  const envelope = {
    run_id: 'r1',
    status: 'failed',
    dry_run: false,
    steps: [
      {
        index: 0,
        tool_id: 'web.fetch',
        version: '1.0.0',
        status: 'denied',
        error: { code: 'grant_missing', message: 'no grant', details: { nested: { list: [1, 'two', null] } } },
        cost_units: 0,
        duration_ms: 1.5,
        audit_id: null,
      },
    ],
    warnings: [],
  };

  it('keeps every detail of an error, whose schema lists none', async () => {
    const refusal = errorBody('not_found', 'no such thing', { where: { deep: [{ a: 1 }] }, count: 2 });
    expect(await serve('GET', '/whoami', 401, refusal)).toEqual(refusal);
  });

  it('drops a property a closed schema (additionalProperties: false) does not list: the schema is the contract', async () => {
    expect(await serve('GET', '/whoami', 200, { ...principal, secret: 'x' })).toEqual(principal);
  });

  it('writes no default for a property the answer does not have', async () => {
    const tool = {
      id: 'web.fetch',
      version: '1.0.0',
      display_name: 'Fetch',
      description: 'fetches',
      category: 'external_call',
      risk_level: 'low',
      input_schema: { type: 'object', default: {}, properties: { url: { type: 'string' } } },
      output_schema: true,
      allowed_agents: [],
      required_context: [],
      required_scopes: [],
      requires_approval: false,
      side_effects: [],
      reads_from: [],
      writes_to: [],
      dependencies: [],
      deprecation: null,
      backend_configured: false,
      target: { family: null, provider: null, region: null },
      cost_units: 0.25,
      rate_limit: null,
      egress: { allowed_hosts: ['api.example.com'] },
      registered_at: '2027-01-01T00:00:00.000Z',
      registered_by: 'operator:ops',
    };
    expect(await serve('GET', '/tools/web.fetch', 200, tool)).toEqual(tool);
  });

  it('writes null or the object for a nullable one, and a Date as its ISO string', async () => {
    const run = {
      run_id: 'r1',
      tenant_id: 't1',
      agent_id: 'a1',
      parent_run_id: null,
      pipeline_instance_id: 'p1',
      session_id: null,
      user_id: null,
      status: 'completed',
      depth: 0,
      keep_open: false,
      budget_units: null,
      budget: null,
      created_at: new Date('2027-01-01T00:00:00Z'),
      updated_at: '2027-01-01T00:00:01.000Z',
      steps: [],
      warnings: ['w'],
    };
    const expected = JSON.parse(JSON.stringify(run));
    expect(await serve('GET', '/runs/r1', 200, run)).toEqual(expected);
    const allowance = { budget_units: 10, spent_units: 2.5, reserved_units: 0, remaining_units: 7.5 };
    expect(await serve('GET', '/runs/r1', 200, { ...run, budget: allowance })).toEqual({
      ...expected,
      budget: allowance,
    });
  });

  it('chooses between the branches of a oneOf by what the answer is', async () => {
    expect(await serve('POST', '/runs/execute', 403, envelope)).toEqual(envelope);
    const refusal = errorBody('run_id_conflict', 'taken', { parent_run_id: null });
    expect(await serve('POST', '/runs/execute', 409, refusal)).toEqual(refusal);
  });

  it('answers a status openapi.yaml does not document, and a string, as they are', async () => {
    const odd = { anything: { goes: true } };
    expect(await serve('GET', '/whoami', 418, odd)).toEqual(odd);
    answer = { status: 200, body: JSON.stringify({ ...principal, kept: 'as sent' }) };
    const kept = await app.inject({ method: 'GET', url: '/whoami' });
    expect(kept.body).toBe(answer.body as string);
  });
});
