import { Ajv2020 } from 'ajv/dist/2020.js';
import addFormatsModule from 'ajv-formats';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CONTRACT_ID } from '../src/http/contract.js';
import { openapi } from './helpers/contract.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';

type Json = Record<string, any>;

const METHODS = ['get', 'put', 'post', 'delete', 'patch'];
/** MCP's door speaks JSON-RPC: its body is checked, and refused, in JSON-RPC's terms (docs/mcp.md). */
const OWN_INPUT = new Set(['POST /mcp']);
/** Routes only an agent may call; a platform-operator reaches every other one. */
const AGENT_ONLY = new Set(['POST /runs/execute', 'POST /runs/{run_id}/complete', 'POST /runs/{run_id}/handoffs']);

const addFormats = addFormatsModule as unknown as (ajv: Ajv2020) => Ajv2020;
const ajv = new Ajv2020({ strict: false });
addFormats(ajv);
ajv.addSchema({ $id: 'doc', components: openapi.components });

function deref(node: Json): Json {
  if (typeof node.$ref !== 'string') return node;
  let target: any = openapi;
  for (const part of node.$ref.replace(/^#\//, '').split('/')) target = target[part.replace(/~1/g, '/')];
  return deref(target);
}

/** A schema as the route's copy holds it: its references point into the document by its id. */
function rebased(node: unknown): unknown {
  if (Array.isArray(node)) return node.map(rebased);
  if (typeof node !== 'object' || node === null) return node;
  return Object.fromEntries(
    Object.entries(node).map(([key, value]) => [
      key,
      key === '$ref' && typeof value === 'string' ? `${CONTRACT_ID}${value}` : rebased(value),
    ]),
  );
}

function matches(schema: unknown, value: unknown): boolean {
  return ajv.compile(JSON.parse(JSON.stringify(schema).replace(/"#\/components/g, '"doc#/components')))(value);
}

interface Documented {
  name: string;
  route: string;
  path: string;
  body: { ref: string; schema: Json } | undefined;
  query: Json[];
  params: Json[];
}

/** What openapi.yaml, read here on its own, says each operation takes. */
const documented: Documented[] = Object.entries(openapi.paths).flatMap(([path, item]) =>
  Object.entries(item as Json)
    .filter(([method]) => METHODS.includes(method))
    .map(([method, operation]) => {
      const requestBody = (operation as Json).requestBody as Json | undefined;
      const at =
        requestBody === undefined
          ? undefined
          : typeof requestBody.$ref === 'string'
            ? requestBody.$ref.replace(/^#\//, '')
            : `paths/${path.replace(/\//g, '~1')}/${method}/requestBody`;
      const schema = requestBody && deref(requestBody).content?.['application/json']?.schema;
      const parameters = [...((item as Json).parameters ?? []), ...((operation as Json).parameters ?? [])].map(deref);
      const route = `${method.toUpperCase()} ${path.replace(/\{([^}]+)\}/g, ':$1')}`;
      return {
        name: `${method.toUpperCase()} ${path}`,
        route,
        path,
        body:
          schema === undefined ? undefined : { ref: `${CONTRACT_ID}#/${at}/content/application~1json/schema`, schema },
        query: parameters.filter((p) => p.in === 'query'),
        params: parameters.filter((p) => p.in === 'path'),
      };
    }),
);
const takingInput = documented.filter(
  (op) => !OWN_INPUT.has(op.name) && (op.body || op.query.length > 0 || op.params.length > 0),
);

/** The path with a value for each parameter that its documented schema takes, but `refused`'s. */
function pathOf(op: Documented, refused?: string): string {
  const candidates = ['x1', 'web.fetch', '1.0.0', '00000000-0000-4000-8000-000000000000', 'audit_events_2027_01'];
  return op.path.replace(/\{([^}]+)\}/g, (_whole, name: string) => {
    if (name === refused) return 'Not%20Valid!';
    const schema = op.params.find((p) => p.name === name)!.schema;
    const value = candidates.find((candidate) => matches(schema, candidate));
    if (value === undefined) throw new Error(`${op.name}: no sample value for ${name}`);
    return value;
  });
}

describe('the requests the gateway takes', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness();
  });
  afterAll(() => h.close());

  it('are declared on each route from its operation in openapi.yaml: its JSON body, query and path parameters', () => {
    expect(takingInput.length).toBeGreaterThan(30);
    const drifted = takingInput.flatMap((op) => {
      const declared = h.client.app.requestSchemas.get(op.route);
      if (!declared) return [`${op.name}: no request schema on the route`];
      const problems: string[] = [];
      if (op.body?.ref !== (declared.body as Json | undefined)?.$ref) problems.push(`${op.name}: body`);
      for (const [part, listed] of [
        ['querystring', op.query],
        ['params', op.params],
      ] as const) {
        const expected =
          listed.length === 0
            ? undefined
            : {
                type: 'object',
                additionalProperties: false,
                required: listed.filter((p) => p.required === true).map((p) => p.name),
                properties: Object.fromEntries(listed.map((p) => [p.name, rebased(p.schema)])),
              };
        if (JSON.stringify(declared[part]) !== JSON.stringify(expected)) problems.push(`${op.name}: ${part}`);
      }
      return problems;
    });
    expect(drifted).toEqual([]);
  });

  it('declares no input openapi.yaml does not document', () => {
    const known = new Set(takingInput.map((op) => op.route));
    expect([...h.client.app.requestSchemas.keys()].filter((route) => !known.has(route))).toEqual([]);
  });

  async function send(op: Documented, options: { body?: unknown; query?: Record<string, string>; path?: string }) {
    const token = AGENT_ONLY.has(op.name)
      ? tokens.agent('contract.agent', { tenant: 't-contract' })
      : tokens.platform();
    const [method] = op.name.split(' ');
    return h.client.request(method!, options.path ?? pathOf(op), { token, body: options.body, query: options.query });
  }

  function expectRefused(res: { status: number; body: any }, field: string, name: string) {
    expect(res.status, name).toBe(400);
    expect(res.body.error.code, name).toBe('invalid_request');
    const issues: Array<{ field: string; message: string }> = res.body.error.details.issues;
    expect(
      issues.map((issue) => issue.field),
      name,
    ).toContain(field);
    expect(res.body.error.message, name).toBe(`${issues[0]!.field}: ${issues[0]!.message}`);
  }

  it.each(takingInput.filter((op) => op.body).map((op) => [op.name, op] as const))(
    'refuses on %s a body its schema refuses: an unknown field, a missing one, the wrong type',
    async (name, op) => {
      const schema = deref(op.body!.schema);
      if (schema.additionalProperties === false) {
        expectRefused(await send(op, { body: { zz_unknown: 1 } }), 'body.zz_unknown', name);
      }
      const required: string[] = schema.required ?? [];
      if (required.length > 0) expectRefused(await send(op, { body: {} }), `body.${required[0]}`, name);
      expectRefused(await send(op, { body: [1] }), 'body', name);
    },
  );

  it.each(takingInput.filter((op) => op.query.length > 0).map((op) => [op.name, op] as const))(
    'refuses on %s a query parameter it does not document, and one of the wrong type',
    async (name, op) => {
      expectRefused(await send(op, { query: { zz_unknown: '1' } }), 'query.zz_unknown', name);
      const integer = op.query.find((p) => deref(p.schema).type === 'integer');
      if (integer) expectRefused(await send(op, { query: { [integer.name]: 'abc' } }), `query.${integer.name}`, name);
    },
  );

  it.each(
    takingInput
      .filter((op) => op.params.some((p) => deref(p.schema).pattern !== undefined))
      .map((op) => [op.name, op] as const),
  )('refuses on %s a path parameter its schema refuses', async (name, op) => {
    const param = op.params.find((p) => deref(p.schema).pattern !== undefined)!;
    const path = pathOf(op, param.name);
    expectRefused(await send(op, { path, body: op.body ? {} : undefined }), `params.${param.name}`, name);
  });

  it('takes what the documented schemas take: defaults filled in, numbers read from the query text', async () => {
    const op = (name: string) => documented.find((o) => o.name === name)!;
    const run = await send(op('POST /runs/execute'), {
      body: { run_id: 'contract-run-1', plan: [{ tool_id: 'no.such_tool', input: {} }], dry_run: true },
    });
    expect(run.body.error?.code).not.toBe('invalid_request');
    expect(run.body.run_id).toBe('contract-run-1');
    const runs = await send(op('GET /runs'), { query: { limit: '5', status: 'completed' } });
    expect(runs.status).toBe(200);
    const audit = await send(op('GET /audit'), { query: { limit: '2', since: '2027-01-01T00:00:00Z' } });
    expect(audit.status).toBe(200);
    const budget = await send(op('PUT /budgets/{id}'), { body: { warn_ratio: 0.5 } });
    expect(budget.status).toBe(404);
    const controlled = await send(op('POST /runs/{run_id}/cancel'), {});
    expect(controlled.status).toBe(404);
  });

  it('refuses an agent any query parameter on GET /tools, though the defaults an operator gets are filled in', async () => {
    const agent = tokens.agent('contract.agent', { tenant: 't-contract' });
    expect((await h.client.get('/tools', { token: agent })).status).toBe(200);
    const named = await h.client.get('/tools', { token: agent, query: { limit: '5' } });
    expect(named.status).toBe(400);
    expect(named.body.error).toMatchObject({
      code: 'invalid_request',
      details: { issues: [{ field: 'query.limit', message: 'agents pass no query parameters' }] },
    });
  });
});
