import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Kysely } from 'kysely';
import { z } from 'zod';
import type { components, operations } from '../../client/openapi-types.js';
import type { AuditTree } from '../../audit/audit-tree.js';
import type { AuditLog } from '../../audit/audit-log.js';
import type { Principal } from '../../auth/principal.js';
import { readRunAllowance } from '../../budgets/run-allowance.js';
import type { DB } from '../../db/schema.js';
import { capabilityModifiersSchema } from '../../grants/capability-modifiers.js';
import type { Handoff, HandoffRequest } from '../../runs/handoff.js';
import type { HandoffService } from '../../handoffs/handoff-service.js';
import type { RunControls } from '../../runs/run-controls.js';
import type { RunExecutor } from '../../runs/run-executor.js';
import type { AnswerSerializer, RunAnswer, RunRequest } from '../../runs/run-types.js';
import { findRun, listRuns, type RunKey, type RunRecord } from '../../runs/run-repository.js';
import { principalOf } from '../auth.js';
import { decodeCursor, encodeCursor } from '../cursor.js';
import { ApiError } from '../errors.js';
import { refuseCrossTenant, tenantInReach } from '../tenant-access.js';
import { contextValueProblem, identifier } from '../../validation/fields.js';
import { isPositiveUnits, POSITIVE_UNITS } from '../../validation/values.js';
import { invalidField, parseInput, type Defaulted } from '../validation.js';

export interface RunRouteDeps {
  db: Kysely<DB>;
  audit: AuditLog;
  executor: RunExecutor;
  controls: RunControls;
  handoffs: HandoffService;
  tree: AuditTree;
  maxPlanSteps: number;
}

type RunRequestBody = components['schemas']['RunRequest'];
type HandoffBody = components['schemas']['HandoffRequest'];
type ControlBody = { reason?: string };
type RunParams = { run_id: string };
type TenantQuery = { tenant_id?: string };
type ListQuery = Defaulted<operations['listRuns']['parameters']['query'], 'limit'>;

/**
 * What openapi.yaml cannot say of a run request: the plan's length is a setting, a context value
 * is bounded by its length as JSON, and units have six decimal places.
 */
function checkRunRequest(body: RunRequestBody, maxPlanSteps: number): RunRequest {
  if (body.plan.length > maxPlanSteps)
    throw invalidField(
      'body.plan',
      `a plan has at most ${maxPlanSteps} steps; longer plans are refused, never truncated`,
    );
  const context = body.context ?? {};
  const problem = contextValueProblem(context);
  if (problem) throw invalidField(`body.context.${problem.key}`, problem.message);
  if (body.budget_units !== undefined && !isPositiveUnits(body.budget_units))
    throw invalidField('body.budget_units', POSITIVE_UNITS);
  return { ...body, context };
}

/** A hand-off as the service takes it: its modifiers normalised (zod: hosts trimmed and lower-cased). */
function handoffRequest(body: HandoffBody): HandoffRequest {
  return {
    ...body,
    capability_modifiers: parseInput(capabilityModifiersSchema, body.capability_modifiers, 'body.capability_modifiers'),
    approval_requirement: body.approval_requirement ?? 'none',
  };
}

const cursorSchema = z.object({ created_at: z.iso.datetime(), tenant_id: identifier, run_id: identifier });

/**
 * `POST /runs/execute` (agents), `GET /runs/{run_id}` (owner or operators), `GET /runs`
 * (operators), the run controls, and hand-offs (`/runs/{run_id}/handoffs`).
 */
export async function runRoutes(app: FastifyInstance, deps: RunRouteDeps): Promise<void> {
  app.post<{ Body: RunRequestBody }>('/runs/execute', { config: { access: 'agent' } }, async (request, reply) => {
    const principal = principalOf(request);
    if (principal.kind !== 'agent') throw new Error('unreachable: agent route');
    const runRequest = checkRunRequest(request.body, deps.maxPlanSteps);
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

  app.post<{ Body: ControlBody }>('/runs/:run_id/cancel', { config: { access: 'any' } }, async (request) => {
    const { reason } = request.body;
    return presentRun(
      await deps.controls.cancel(
        controller(request),
        await runKeyOf(request, principalOf(request), deps.audit),
        reason,
      ),
    );
  });

  app.post<{ Body: ControlBody }>('/runs/:run_id/kill', { config: { access: 'operator' } }, async (request) => {
    const { reason } = request.body;
    return presentRun(
      await deps.controls.kill(controller(request), await runKeyOf(request, principalOf(request), deps.audit), reason),
    );
  });

  app.post<{ Body: ControlBody }>('/runs/:run_id/pause', { config: { access: 'operator' } }, async (request) => {
    const { reason } = request.body;
    return presentRun(
      await deps.controls.pause(controller(request), await runKeyOf(request, principalOf(request), deps.audit), reason),
    );
  });

  app.post('/runs/:run_id/resume', { config: { access: 'any' } }, async (request, reply) => {
    return sendAnswer(
      reply,
      await deps.controls.resume(controller(request), await runKeyOf(request, principalOf(request), deps.audit)),
    );
  });

  app.post('/runs/:run_id/complete', { config: { access: 'agent' } }, async (request) => {
    return presentRun(
      await deps.controls.complete(controller(request), await runKeyOf(request, principalOf(request), deps.audit)),
    );
  });

  app.post<{ Body: HandoffBody; Params: RunParams }>(
    '/runs/:run_id/handoffs',
    { config: { access: 'agent', idempotent: true } },
    async (request, reply) => {
      const principal = principalOf(request);
      if (principal.kind !== 'agent') throw new Error('unreachable: agent route');
      const { run_id } = request.params;
      const body = handoffRequest(request.body);
      const result = await deps.handoffs.create(principal, run_id, body, request.traceId);
      if (!result.ok) throw new ApiError(result.code, result.message, result.details ?? {});
      return reply.code(201).send({ ...presentHandoff(result.handoff), approval_id: result.approvalId });
    },
  );

  app.get('/runs/:run_id/handoffs', { config: { access: 'any' } }, async (request) => {
    const principal = principalOf(request);
    const run = await findRun(deps.db, ...keyArgs(await runKeyOf(request, principal, deps.audit)));
    if (!run || (principal.kind === 'agent' && run.agent_id !== principal.id)) {
      throw new ApiError('not_found', `run ${(request.params as { run_id: string }).run_id} not found`);
    }
    return { items: (await deps.handoffs.list(run.tenant_id, run.run_id)).map(presentHandoff), next_cursor: null };
  });

  app.get<{ Querystring: ListQuery }>('/runs', { config: { access: 'operator' } }, async (request) => {
    const query = request.query;
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
  const { run_id } = request.params as RunParams;
  const { tenant_id } = request.query as TenantQuery;
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
