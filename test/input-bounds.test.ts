import { randomBytes } from 'node:crypto';
import {
  Client,
  ProtocolError,
  SdkHttpError,
  StreamableHTTPClientTransport,
  type CallToolResult,
} from '@modelcontextprotocol/client';
import { CommanderError } from 'commander';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { toolgateProgram } from '../src/cli/toolgate/program.js';
import { TestBackend } from './helpers/backend.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';
import { grantTool, newRunId, registerTool, toolBody } from './helpers/world.js';

/**
 * Issue 42: every value that reaches an indexed or bounded column is bounded at the door, the same
 * at every door (docs/operations.md#input-bounds). Each door gets the worst value for each field
 * and answers a clear refusal — 400 over REST, -32602 over MCP, a usage error in the CLI — never a
 * 500, and nothing of it is stored.
 */
const T = 'tenant-input-bounds';
const AGENT = 'bounds.door-agent';
const agent = tokens.agent(AGENT, { tenant: T });
const operator = tokens.tenantOperator(T);

/** Printable but incompressible: a btree entry of it cannot be made smaller than its length. */
const incompressible = (length: number) => randomBytes(length).toString('base64url').slice(0, length);

/** The worst values for a string field; the ones only length makes bad follow the pattern. */
const WORST: Array<[string, string]> = [
  ['3,000 incompressible characters', incompressible(3000)],
  ['a NUL byte', 'a\u0000b'],
  ['a lone surrogate', 'a\ud800b'],
  ['four-byte characters', '\u{1F600}'.repeat(60)],
  ['a newline', 'a\nb'],
  ['an empty string', ''],
];
const TOOL_IDS: Array<[string, string]> = [...WORST, ['129 characters', 'a'.repeat(129)]];
const IDENTIFIERS: Array<[string, string]> = [...WORST, ['201 characters', 'a'.repeat(201)]];

let h: Harness;
let backend: TestBackend;
let base: string;

beforeAll(async () => {
  h = await startHarness();
  backend = await new TestBackend().start();
  await h.client.app.listen({ port: 0, host: '127.0.0.1' });
  base = `http://127.0.0.1:${(h.client.app.server.address() as { port: number }).port}`;
  await registerTool(h.client, { id: 'echo', backendUrl: `${backend.url}/echo`, allowed_agents: [AGENT] });
  await grantTool(h.client, { tenant: T, agent: AGENT, tool: 'echo' });
});
afterAll(async () => {
  await backend?.close();
  await h?.close();
});

async function recordCount(): Promise<number> {
  const row = await h.db.database.control
    .selectFrom('audit_events')
    .select((eb) => eb.fn.countAll<string>().as('n'))
    .executeTakeFirstOrThrow();
  return Number(row.n);
}

function expectRefused(res: { status: number; body: any }, field: string): void {
  expect(res.status).toBe(400);
  expect(res.body.error.code).toBe('invalid_request');
  expect(JSON.stringify(res.body.error)).toContain(field);
}

describe('REST: POST /runs/execute', () => {
  const call = (body: Record<string, unknown>) =>
    h.client.post('/runs/execute', {
      token: agent,
      body: { run_id: newRunId(), context: {}, plan: [{ tool_id: 'echo', input: { q: 'x' } }], ...body },
    });

  it.each(TOOL_IDS)('refuses a tool id of %s', async (_kind, value) => {
    const before = await recordCount();
    expectRefused(await call({ plan: [{ tool_id: value, input: { q: 'x' } }] }), 'body.plan.0.tool_id');
    expect(await recordCount()).toBe(before);
  });

  it.each(WORST)('refuses a version of %s', async (_kind, value) => {
    expectRefused(await call({ plan: [{ tool_id: 'echo', version: value, input: { q: 'x' } }] }), 'body.plan.0');
  });

  it.each(['run_id', 'parent_run_id', 'pipeline_instance_id', 'session_id', 'user_id'])(
    'refuses every worst value of %s',
    async (field) => {
      for (const [, value] of IDENTIFIERS) expectRefused(await call({ [field]: value }), `body.${field}`);
    },
  );

  it('refuses a context value, a key or a count of keys past the bounds', async () => {
    expectRefused(await call({ context: { organization_id: incompressible(3000) } }), 'body.context');
    expectRefused(await call({ context: { organization_id: 'a\u0000b' } }), 'body.context');
    expectRefused(await call({ context: { [incompressible(300)]: 'x' } }), 'body.context');
    expectRefused(await call({ context: { 'not a key': 'x' } }), 'body.context');
    const many = Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`k${i}`, i]));
    expectRefused(await call({ context: many }), 'body.context');
  });

  it('takes values right at the bounds', async () => {
    const context = Object.fromEntries(Array.from({ length: 64 }, (_, i) => [`k${i}`, 'v'.repeat(998)]));
    const res = await call({ run_id: `r${'a'.repeat(199)}`, context });
    expect(res.status).toBe(200);
  });
});

describe('REST: hand-offs, grants and registration', () => {
  it('refuses the worst sub-agent, sub-run and delegable tool ids of a hand-off', async () => {
    const handoff = (body: Record<string, unknown>) =>
      h.client.post(`/runs/${newRunId()}/handoffs`, {
        token: agent,
        body: {
          sub_agent_id: 'sub.agent',
          sub_run_id: newRunId(),
          budget_units: 1,
          delegable_tool_ids: [],
          max_fanout: 0,
          ...body,
        },
      });
    for (const [, value] of IDENTIFIERS) {
      expectRefused(await handoff({ sub_agent_id: value }), 'body.sub_agent_id');
      expectRefused(await handoff({ sub_run_id: value }), 'body.sub_run_id');
    }
    for (const [, value] of TOOL_IDS)
      expectRefused(await handoff({ delegable_tool_ids: [value] }), 'body.delegable_tool_ids');
  });

  it('refuses the worst tool and agent ids of a grant', async () => {
    const grant = (body: Record<string, unknown>) =>
      h.client.post('/grants', {
        token: operator,
        body: {
          agent_id: AGENT,
          tool_id: 'echo',
          scope: 'per-tenant',
          rationale: 'bounds',
          expires_at: new Date(Date.now() + 3_600_000).toISOString(),
          ...body,
        },
      });
    for (const [, value] of TOOL_IDS) expectRefused(await grant({ tool_id: value }), 'body.tool_id');
    for (const [, value] of IDENTIFIERS) expectRefused(await grant({ agent_id: value }), 'body.agent_id');
  });

  it('registers a tool id of 128 characters and refuses one of 129 (SPEC §12.1)', async () => {
    const register = (id: string) => h.client.post('/tools', { token: tokens.platform(), body: toolBody({ id }) });
    expectRefused(await register('a'.repeat(129)), 'body.id');
    expect((await register('a'.repeat(128))).status).toBe(201);
  });
});

describe('MCP: tools/call', () => {
  let client: Client;
  beforeAll(async () => {
    client = new Client({ name: 'bounds-test', version: '1.0.0' });
    await client.connect(
      new StreamableHTTPClientTransport(new URL(`${base}/mcp`), {
        requestInit: { headers: { authorization: `Bearer ${agent}` } },
      }),
    );
  });
  afterAll(() => client?.close());

  /**
   * The refusal of a call: `-32602` naming the field, or — for a NUL or a lone surrogate, which no route takes — the
   * HTTP request's own `400 invalid_request`, before JSON-RPC is read.
   */
  async function refusal(name: string, run: Record<string, unknown> = {}): Promise<string> {
    const error = await client.callTool({ name, arguments: { q: 'x' }, _meta: { 'dev.toolgate/run': run } }).then(
      (result: CallToolResult) => result,
      (e: unknown) => e,
    );
    if (error instanceof SdkHttpError) {
      expect(error.message).toContain('"code":"invalid_request"');
      return error.message.replace(/^[^{]*/, '');
    }
    expect(error, String(error)).toBeInstanceOf(ProtocolError);
    expect((error as ProtocolError).code).toBe(-32602);
    return (error as ProtocolError).message;
  }

  it.each(TOOL_IDS)('refuses a tool name of %s, without echoing it', async (_kind, value) => {
    const before = await recordCount();
    const message = await refusal(value);
    expect(message).toContain('params.name');
    expect(message.length).toBeLessThan(300);
    expect(await recordCount()).toBe(before);
  });

  it('refuses the worst run fields, version and context in _meta', async () => {
    for (const field of ['run_id', 'parent_run_id', 'session_id', 'user_id', 'pipeline_instance_id'])
      for (const [, value] of IDENTIFIERS) expect(await refusal('echo', { [field]: value })).toContain(field);
    for (const [, value] of WORST) expect(await refusal('echo', { version: value })).toContain('version');
    expect(await refusal('echo', { context: { organization_id: incompressible(3000) } })).toContain('context');
    expect(await refusal('echo', { context: { [incompressible(300)]: 'x' } })).toContain('context');
  });

  it('calls a tool whose fields are within the bounds', async () => {
    const result = (await client.callTool({
      name: 'echo',
      arguments: { q: 'x' },
      _meta: { 'dev.toolgate/run': { run_id: `m${'a'.repeat(199)}`, context: { organization_id: 'o' } } },
    })) as CallToolResult;
    expect(result.isError, JSON.stringify(result)).toBe(false);
  });
});

describe('CLI', () => {
  /** Parses a command line as `toolgate` would; a usage error is thrown before anything is sent. */
  async function usageError(args: string[]): Promise<CommanderError> {
    const program = toolgateProgram();
    program.exitOverride().configureOutput({ writeErr: () => undefined, writeOut: () => undefined });
    for (const command of program.commands)
      for (const sub of command.commands) sub.configureOutput({ writeErr: () => undefined, writeOut: () => undefined });
    const error = await program.parseAsync(['node', 'toolgate', ...args]).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(CommanderError);
    expect((error as CommanderError).code).toBe('commander.invalidArgument');
    return error as CommanderError;
  }

  it.each(TOOL_IDS.filter(([, value]) => value !== ''))('refuses a --tool of %s', async (_kind, value) => {
    await usageError(['runs', 'execute', '--tool', value, '--input', '{}']);
    await usageError(['grants', 'create', '--agent', 'a1', '--tool', value, '--scope', 'per-tenant', '--reason', 'r']);
    await usageError(['grants', 'resolve', '--agent', 'a1', '--tool', value]);
  });

  it.each(IDENTIFIERS.filter(([, value]) => value !== ''))('refuses run fields of %s', async (_kind, value) => {
    for (const option of ['--run-id', '--session', '--user', '--pipeline-instance'])
      await usageError(['runs', 'execute', '--tool', 'echo', '--input', '{}', option, value]);
    await usageError([
      'grants',
      'create',
      '--agent',
      value,
      '--tool',
      'echo',
      '--scope',
      'per-tenant',
      '--reason',
      'r',
    ]);
  });
});
