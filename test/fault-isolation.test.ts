import { randomBytes } from 'node:crypto';
import { Client, ProtocolError, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AgentPrincipal } from '../src/admission/step.js';
import type { AuditEventInput } from '../src/audit/audit-event.js';
import { TestBackend } from './helpers/backend.js';
import { startHarness, type Harness, type TestResponse } from './helpers/harness.js';
import { execute, step } from './helpers/runs.js';
import { tokens } from './helpers/tokens.js';
import { grantTool, newRunId, registerTool } from './helpers/world.js';

/**
 * Issue 42: calls arriving together share their statements (group commit), so a value PostgreSQL
 * refuses in one member must fail that member only, never its batch — nor another tenant's calls in
 * it. The bad values here go past the doors (which refuse them), straight to the shared batches.
 */
const VICTIM = 'tenant-fault-victim';
const ATTACKER = 'tenant-fault-attacker';
const AGENT = 'victim.agent';
const MALLORY = 'mallory.agent';
const victim = tokens.agent(AGENT, { tenant: VICTIM });

let h: Harness;
let backend: TestBackend;

beforeAll(async () => {
  h = await startHarness();
  await h.client.app.listen({ port: 0, host: '127.0.0.1' });
  backend = await new TestBackend().start();
  // 300 calls at once on a loaded machine queue at the backend: what is tested is that none fails for another's
  // value, not how fast they are answered.
  await registerTool(h.client, {
    id: 'echo',
    backendUrl: `${backend.url}/echo`,
    allowed_agents: [AGENT],
    timeout_ms: 30_000,
  });
  await grantTool(h.client, { tenant: VICTIM, agent: AGENT, tool: 'echo' });
});
afterAll(async () => {
  await backend?.close();
  await h?.close();
});

/** Printable but incompressible: a btree entry of it cannot be made smaller than its length. */
const incompressible = (length: number) => randomBytes(length).toString('base64url').slice(0, length);

const attacker: AgentPrincipal = {
  kind: 'agent',
  id: MALLORY,
  tenantId: ATTACKER,
  family: undefined,
  scopes: new Set(),
};

/** The records of the victim's runs, by run id and type. */
async function recordsOf(runIds: string[]): Promise<Map<string, string[]>> {
  const rows = await h.db.database.control
    .selectFrom('audit_events')
    .select(['run_id', 'event_type'])
    .where('tenant_id', '=', VICTIM)
    .where('run_id', 'in', runIds)
    .orderBy('seq')
    .execute();
  const types = new Map<string, string[]>(runIds.map((id) => [id, []]));
  for (const row of rows) types.get(row.run_id!)!.push(row.event_type);
  return types;
}

/**
 * Runs `poison` from a few callers, each again as soon as it is answered, until `calls` settle: its
 * values land in the calls' batches, as those of an agent calling alongside would.
 */
async function beside<T>(
  calls: Promise<T>,
  poison: () => Promise<unknown>,
): Promise<{ answers: T; refused: unknown[] }> {
  let settled = false;
  const refused: unknown[] = [];
  const poisoner = async () => {
    while (!settled) {
      try {
        await poison();
        refused.push(new Error('the poisoned value was stored'));
      } catch (error) {
        refused.push(error);
      }
      // A refusal may come without I/O: let the calls' own turns come too.
      await new Promise((resolve) => setImmediate(resolve));
    }
  };
  const poisoners = Promise.all([poisoner(), poisoner(), poisoner()]);
  const answers = await calls.finally(() => (settled = true));
  await poisoners;
  return { answers, refused };
}

describe('the attack, black-box', () => {
  it('answers the hostile tool names over MCP -32602 and completes and audits 300 calls of another tenant', async () => {
    const port = (h.client.app.server.address() as { port: number }).port;
    const mcp = new Client({ name: 'mallory', version: '1.0.0' });
    await mcp.connect(
      new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${port}/mcp`), {
        requestInit: { headers: { authorization: `Bearer ${tokens.agent(MALLORY, { tenant: ATTACKER })}` } },
      }),
    );
    try {
      const runIds = Array.from({ length: 300 }, () => newRunId('victim'));
      const calls = Promise.all(runIds.map((run_id) => execute(h.client, victim, { run_id, plan: [step('echo')] })));
      const { answers, refused } = await beside(calls, () =>
        mcp.callTool({ name: incompressible(3000), arguments: {} }),
      );

      expect(answers.map((res: TestResponse) => res.status)).toEqual(runIds.map(() => 200));
      expect(refused.length).toBeGreaterThan(0);
      for (const error of refused) {
        expect(error).toBeInstanceOf(ProtocolError);
        expect((error as ProtocolError).code).toBe(-32602);
      }
      const records = await recordsOf(runIds);
      for (const runId of runIds)
        expect(records.get(runId), runId).toEqual(['run.step.dispatching', 'run.step.completed']);
    } finally {
      await mcp.close();
    }
  });
});

describe('a batch never fails for one of its members', () => {
  it('completes and audits 300 calls of one tenant beside calls of another whose tool id no index can hold', async () => {
    const runIds = Array.from({ length: 300 }, () => newRunId('victim'));
    const calls = Promise.all(runIds.map((run_id) => execute(h.client, victim, { run_id, plan: [step('echo')] })));
    // What a 3,000-character tool name over MCP did before the doors bounded it: its denial record
    // is refused (54000, index row size exceeds btree maximum) in whatever batch it joins.
    const { answers, refused } = await beside(calls, () =>
      h.client.app.services.runs.execute(
        attacker,
        { run_id: newRunId('mallory'), context: {}, plan: [{ tool_id: incompressible(3000), input: {} }] },
        'a'.repeat(32),
      ),
    );

    expect(answers.map((res: TestResponse) => res.status)).toEqual(runIds.map(() => 200));
    expect(refused.length).toBeGreaterThan(0);
    for (const error of refused) expect(error).toMatchObject({ code: '54000' });
    const records = await recordsOf(runIds);
    for (const runId of runIds)
      expect(records.get(runId), runId).toEqual(['run.step.dispatching', 'run.step.completed']);
    const runs = await h.db.database.control
      .selectFrom('runs')
      .select(['status'])
      .where('tenant_id', '=', VICTIM)
      .where('run_id', 'in', runIds)
      .execute();
    expect(runs.map((run) => run.status)).toEqual(runIds.map(() => 'completed'));
    const lost = await h.db.database.control
      .selectFrom('audit_events')
      .select('seq')
      .where('event_type', '=', 'run.executor_lost')
      .execute();
    expect(lost).toEqual([]);
  });

  // One of each kind PostgreSQL refuses for the record's own data: a data exception, a limit, a constraint.
  const poisons: Array<[string, string, () => AuditEventInput]> = [
    ['a NUL byte in a column', '22P05', () => ({ ...base(), tool_id: 'bad\u0000tool' })],
    ['a NUL escape in details', '22P05', () => ({ ...base(), details: { note: 'a\u0000b' } })],
    ['a lone surrogate in details', '22P02', () => ({ ...base(), details: { note: 'a\ud800b' } })],
    ['a tool id no btree page holds', '54000', () => ({ ...base(), tool_id: incompressible(3000) })],
    ['an actor left out', '23502', () => ({ ...base(), actor: null as unknown as string })],
  ];
  const base = (): AuditEventInput => ({
    event_type: 'security.probe',
    actor: `agent:${MALLORY}`,
    tenant_id: ATTACKER,
    agent_id: MALLORY,
  });

  it.each(poisons)('completes the other calls of a batch poisoned by %s (%s)', async (_kind, code, poisoned) => {
    const runIds = Array.from({ length: 40 }, () => newRunId('victim'));
    const calls = Promise.all(runIds.map((run_id) => execute(h.client, victim, { run_id, plan: [step('echo')] })));
    const { answers, refused } = await beside(calls, () => h.client.app.services.audit.append(poisoned()));

    expect(answers.map((res: TestResponse) => res.status)).toEqual(runIds.map(() => 200));
    expect(refused.length).toBeGreaterThan(0);
    for (const error of refused) expect(error).toMatchObject({ code });
    const records = await recordsOf(runIds);
    for (const runId of runIds)
      expect(records.get(runId), runId).toEqual(['run.step.dispatching', 'run.step.completed']);
  });

  it('keeps the chain whole through the batches it committed again', async () => {
    const verify = await h.client.get('/audit/verify', { token: tokens.platform() });
    expect(verify.status).toBe(200);
    expect(verify.body).toMatchObject({ ok: true, first_bad_seq: null });
  });
});
