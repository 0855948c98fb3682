import type { FastifyInstance } from 'fastify';
import type { Kysely } from 'kysely';
import { z } from 'zod';
import type { AuditLog } from '../../audit/audit-log.js';
import type { DB } from '../../db/schema.js';
import { findRun, listRuns, type RunRecord } from '../../runs/run-repository.js';
import type { RunExecutor } from '../../runs/run-executor.js';
import { RUN_STATUSES } from '../../runs/run-types.js';
import { principalOf } from '../auth.js';
import { decodeCursor, encodeCursor } from '../cursor.js';
import { ApiError } from '../errors.js';
import { tenantInReach } from '../tenant-access.js';
import { parseInput } from '../validation.js';

export interface RunRouteDeps {
  db: Kysely<DB>;
  audit: AuditLog;
  executor: RunExecutor;
  maxPlanSteps: number;
}

const id = z.string().min(1).max(200).regex(/^[A-Za-z0-9][A-Za-z0-9._:@-]*$/, 'letters, digits and . _ : @ - only');

function executeBody(maxPlanSteps: number) {
  return z.strictObject({
    run_id: id,
    parent_run_id: id.optional(),
    pipeline_instance_id: id.optional(),
    session_id: id.optional(),
    user_id: id.optional(),
    context: z.record(z.string(), z.unknown()).default({}),
    plan: z
      .array(
        z.strictObject({
          tool_id: z.string().min(1).max(200),
          version: z.string().min(1).max(100).optional(),
          input: z.unknown().refine((value) => value !== undefined, 'input is required'),
        }),
      )
      .min(1, 'a plan has at least one step')
      .max(maxPlanSteps, `a plan has at most ${maxPlanSteps} steps; longer plans are refused, never truncated`),
    budget_units: z.number().positive().finite().optional(),
    dry_run: z.boolean().optional(),
  });
}

const listQuery = z.strictObject({
  tenant_id: z.string().min(1).optional(),
  agent_id: z.string().min(1).optional(),
  status: z.enum(RUN_STATUSES).optional(),
  limit: z.coerce.number().int().min(1).max(200).default(50),
  cursor: z.string().optional(),
});

const cursorSchema = z.object({ created_at: z.string(), tenant_id: z.string(), run_id: z.string() });

/** `POST /runs/execute` (agents), `GET /runs/{run_id}` (owner or operators), `GET /runs` (operators). */
export async function runRoutes(app: FastifyInstance, deps: RunRouteDeps): Promise<void> {
  const body = executeBody(deps.maxPlanSteps);

  app.post('/runs/execute', { config: { access: 'agent' } }, async (request, reply) => {
    const principal = principalOf(request);
    if (principal.kind !== 'agent') throw new Error('unreachable: agent route');
    const runRequest = parseInput(body, request.body, 'body');
    const answer = await deps.executor.execute(principal, runRequest, request.traceId);
    if (answer.envelope.retry_after_seconds !== undefined) reply.header('retry-after', String(answer.envelope.retry_after_seconds));
    if (answer.replayed) reply.header('x-toolgate-replayed', 'true');
    return reply.code(answer.httpStatus).send(answer.envelope);
  });

  app.get('/runs/:run_id', { config: { access: 'any' } }, async (request) => {
    const principal = principalOf(request);
    const { run_id } = parseInput(z.object({ run_id: id }), request.params, 'params');
    const { tenant_id } = parseInput(z.strictObject({ tenant_id: z.string().min(1).optional() }), request.query, 'query');
    const tenantId = principal.kind === 'operator' && principal.role === 'platform-operator' ? (tenant_id ?? principal.tenantId) : principal.tenantId;
    const run = await findRun(deps.db, tenantId, run_id);
    // Another agent's run, or one of another tenant, does not exist for this caller.
    if (!run || (principal.kind === 'agent' && run.agent_id !== principal.id)) {
      throw new ApiError('not_found', `run ${run_id} not found`);
    }
    return presentRun(run);
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
    created_at: run.created_at,
    updated_at: run.updated_at,
    steps: run.envelope?.steps ?? [],
    warnings: run.envelope?.warnings ?? [],
  };
}
