import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Kysely } from 'kysely';
import { z } from 'zod';
import type { AuditTree } from '../../audit/audit-tree.js';
import type { AuditLog } from '../../audit/audit-log.js';
import type { Principal } from '../../auth/principal.js';
import { readRunAllowance } from '../../budgets/run-allowance.js';
import { MAX_UNITS } from '../../budgets/budget-units.js';
import type { DB } from '../../db/schema.js';
import { capabilityModifiersSchema } from '../../grants/capability-modifiers.js';
import { APPROVAL_REQUIREMENTS, type Handoff } from '../../runs/handoff.js';
import type { HandoffService } from '../../handoffs/handoff-service.js';
import type { RunControls } from '../../runs/run-controls.js';
import type { RunExecutor } from '../../runs/run-executor.js';
import type { AnswerSerializer, RunAnswer } from '../../runs/run-types.js';
import { findRun, listRuns, type RunKey, type RunRecord } from '../../runs/run-repository.js';
import { RUN_STATUSES } from '../../runs/run-types.js';
import { principalOf } from '../auth.js';
import { decodeCursor, encodeCursor } from '../cursor.js';
import { ApiError } from '../errors.js';
import { refuseCrossTenant, tenantInReach } from '../tenant-access.js';
import { agentId, identifier, parseInput, positiveUnits, runContext, toolId, versionRange } from '../validation.js';

export interface RunRouteDeps {
  db: Kysely<DB>;
  audit: AuditLog;
  executor: RunExecutor;
  controls: RunControls;
  handoffs: HandoffService;
  tree: AuditTree;
  maxPlanSteps: number;
}

function executeBody(maxPlanSteps: number) {
  return z.strictObject({
    run_id: identifier,
    parent_run_id: identifier.optional(),
    pipeline_instance_id: identifier.optional(),
    session_id: identifier.optional(),
    user_id: identifier.optional(),
    context: runContext.default({}),
    plan: z
      .array(
        z.strictObject({
          tool_id: toolId,
          version: versionRange.optional(),
          input: z.unknown().refine((value) => value !== undefined, 'input is required'),
        }),
      )
      .min(1, 'a plan has at least one step')
      .max(maxPlanSteps, `a plan has at most ${maxPlanSteps} steps; longer plans are refused, never truncated`),
    budget_units: positiveUnits.optional(),
    dry_run: z.boolean().optional(),
    keep_open: z.boolean().optional(),
  });
}

const handoffBody = z.strictObject({
  sub_agent_id: agentId,
  sub_run_id: identifier,
  // Not positive is a typed refusal (`budget_non_positive`), checked in its turn, not a 400.
  budget_units: z.number().finite().max(MAX_UNITS),
  delegable_tool_ids: z.array(toolId).max(100),
  // Past 1000 the one reason given is that bound, not also the largest safe integer.
  max_fanout: z.number().min(0).max(1000, { abort: true }).int(),
  capability_modifiers: capabilityModifiersSchema.default({}),
  approval_requirement: z.enum(APPROVAL_REQUIREMENTS).default('none'),
});

const controlBody = z.strictObject({ reason: z.string().max(2000).optional() });
const runParams = z.object({ run_id: identifier });
const tenantQuery = z.strictObject({ tenant_id: z.string().min(1).optional() });

const listQuery = z.strictObject({
  tenant_id: z.string().min(1).optional(),
  agent_id: z.string().min(1).optional(),
  status: z.enum(RUN_STATUSES).optional(),
  limit: z.coerce.number().int().min(1).max(200).default(50),
  cursor: z.string().optional(),
});

const cursorSchema = z.object({ created_at: z.iso.datetime(), tenant_id: identifier, run_id: identifier });

/**
 * `POST /runs/execute` (agents), `GET /runs/{run_id}` (owner or operators), `GET /runs`
 * (operators), the run controls, and hand-offs (`/runs/{run_id}/handoffs`).
 */
export async function runRoutes(app: FastifyInstance, deps: RunRouteDeps): Promise<void> {
  const body = executeBody(deps.maxPlanSteps);

  app.post('/runs/execute', { config: { access: 'agent' } }, async (request, reply) => {
    const principal = principalOf(request);
    if (principal.kind !== 'agent') throw new Error('unreachable: agent route');
    const runRequest = parseInput(body, request.body, 'body');
    return sendAnswer(
      reply,
      await deps.executor.execute(principal, runRequest, request.traceId, undefined, answerSerializer(reply)),
    );
  });

  app.get('/runs/:run_id', { config: { access: 'any' } }, async (request) => {
    const principal = principalOf(request);
    const run = await findRun(deps.db, ...keyArgs(await runKeyOf(request, principal, deps.audit)));
    // Another agent's run, or one of another tenant, does not exist for this caller.
    if (!run || (principal.kind === 'agent' && run.agent_id !== principal.id)) {
      throw new ApiError('not_found', `run ${(request.params as { run_id: string }).run_id} not found`);
    }
    const budget =
      run.budget_units === null ? null : await readRunAllowance(deps.db, run.tenant_id, run.run_id, run.budget_units);
    return { ...presentRun(run), budget };
  });

  // What an agent runtime keeps as proof that its calls were logged (SPEC §8.1).
  app.get('/runs/:run_id/receipt', { config: { access: 'any' } }, async (request) => {
    const principal = principalOf(request);
    const key = await runKeyOf(request, principal, deps.audit);
    return deps.tree.receipt(key.run_id, key.tenant_id, principal.kind === 'agent' ? principal.id : undefined);
  });

  const controller = (request: FastifyRequest) => ({ principal: principalOf(request), traceId: request.traceId });

  app.post('/runs/:run_id/cancel', { config: { access: 'any' } }, async (request) => {
    const { reason } = parseInput(controlBody, request.body, 'body');
    return presentRun(
      await deps.controls.cancel(
        controller(request),
        await runKeyOf(request, principalOf(request), deps.audit),
        reason,
      ),
    );
  });

  app.post('/runs/:run_id/kill', { config: { access: 'operator' } }, async (request) => {
    const { reason } = parseInput(controlBody, request.body, 'body');
    return presentRun(
      await deps.controls.kill(controller(request), await runKeyOf(request, principalOf(request), deps.audit), reason),
    );
  });

  app.post('/runs/:run_id/pause', { config: { access: 'operator' } }, async (request) => {
    const { reason } = parseInput(controlBody, request.body, 'body');
    return presentRun(
      await deps.controls.pause(controller(request), await runKeyOf(request, principalOf(request), deps.audit), reason),
    );
  });

  app.post('/runs/:run_id/resume', { config: { access: 'any' } }, async (request, reply) => {
    parseInput(controlBody, request.body, 'body');
    return sendAnswer(
      reply,
      await deps.controls.resume(controller(request), await runKeyOf(request, principalOf(request), deps.audit)),
    );
  });

  app.post('/runs/:run_id/complete', { config: { access: 'agent' } }, async (request) => {
    parseInput(controlBody, request.body, 'body');
    return presentRun(
      await deps.controls.complete(controller(request), await runKeyOf(request, principalOf(request), deps.audit)),
    );
  });

  app.post('/runs/:run_id/handoffs', { config: { access: 'agent', idempotent: true } }, async (request, reply) => {
    const principal = principalOf(request);
    if (principal.kind !== 'agent') throw new Error('unreachable: agent route');
    const { run_id } = parseInput(runParams, request.params, 'params');
    const body = parseInput(handoffBody, request.body, 'body');
    const result = await deps.handoffs.create(principal, run_id, body, request.traceId);
    if (!result.ok) throw new ApiError(result.code, result.message, result.details ?? {});
    return reply.code(201).send({ ...presentHandoff(result.handoff), approval_id: result.approvalId });
  });

  app.get('/runs/:run_id/handoffs', { config: { access: 'any' } }, async (request) => {
    const principal = principalOf(request);
    const run = await findRun(deps.db, ...keyArgs(await runKeyOf(request, principal, deps.audit)));
    if (!run || (principal.kind === 'agent' && run.agent_id !== principal.id)) {
      throw new ApiError('not_found', `run ${(request.params as { run_id: string }).run_id} not found`);
    }
    return { items: (await deps.handoffs.list(run.tenant_id, run.run_id)).map(presentHandoff), next_cursor: null };
  });

  app.get('/runs', { config: { access: 'operator' } }, async (request) => {
    const query = parseInput(listQuery, request.query, 'query');
    const tenantId = await tenantInReach(request, deps.audit, query.tenant_id);
    const page = await listRuns(deps.db, {
      tenantId,
      agentId: query.agent_id,
      status: query.status,
      after: query.cursor === undefined ? undefined : decodeCursor(query.cursor, cursorSchema),
      limit: query.limit,
    });
    return { items: page.items.map(presentRun), next_cursor: page.next ? encodeCursor(page.next) : null };
  });
}

function sendAnswer(reply: FastifyReply, answer: RunAnswer) {
  if (answer.envelope.retry_after_seconds !== undefined)
    reply.header('retry-after', String(answer.envelope.retry_after_seconds));
  if (answer.replayed) reply.header('x-toolgate-replayed', 'true');
  // Written by this route's serialiser already, to store the run's end: sent as it is.
  if (answer.json !== undefined)
    return reply.code(answer.httpStatus).type('application/json; charset=utf-8').send(answer.json);
  return reply.code(answer.httpStatus).send(answer.envelope);
}

/** The serialiser `send` would use at a status, for the run's end to be written once for its row and its reply. */
function answerSerializer(reply: FastifyReply): AnswerSerializer {
  return (status, envelope) =>
    reply.getSerializationFunction(
      String(status),
      'application/json',
    )?.(envelope as unknown as Record<string, unknown>);
}

/**
 * The run a route names: in the caller's tenant, or for a platform-operator the one it names.
 * Anyone else naming another tenant gets the 404 of a run that does not exist, and is recorded.
 */
async function runKeyOf(request: FastifyRequest, principal: Principal, audit: AuditLog): Promise<RunKey> {
  const { run_id } = parseInput(runParams, request.params, 'params');
  const { tenant_id } = parseInput(tenantQuery, request.query, 'query');
  if (principal.kind === 'operator' && principal.role === 'platform-operator')
    return { tenant_id: tenant_id ?? principal.tenantId, run_id };
  if (tenant_id !== undefined && tenant_id !== principal.tenantId) {
    await refuseCrossTenant(request, audit, { requested_tenant_id: tenant_id, run_id }, `run ${run_id} not found`);
  }
  return { tenant_id: principal.tenantId, run_id };
}

function keyArgs(key: RunKey): [string, string] {
  return [key.tenant_id, key.run_id];
}

function presentHandoff(handoff: Handoff) {
  return {
    ...handoff,
    created_at: handoff.created_at.toISOString(),
    closed_at: handoff.closed_at === null ? null : handoff.closed_at.toISOString(),
  };
}

function presentRun(run: RunRecord) {
  return {
    run_id: run.run_id,
    tenant_id: run.tenant_id,
    agent_id: run.agent_id,
    parent_run_id: run.parent_run_id,
    pipeline_instance_id: run.pipeline_instance_id,
    session_id: run.session_id,
    user_id: run.user_id,
    status: run.status,
    depth: run.depth,
    keep_open: run.keep_open,
    budget_units: run.budget_units,
    created_at: run.created_at,
    updated_at: run.updated_at,
    steps: run.envelope?.steps ?? [],
    warnings: run.envelope?.warnings ?? [],
  };
}
