import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Kysely } from 'kysely';
import { z } from 'zod';
import type { AuditLog } from '../../audit/audit-log.js';
import { actorOf } from '../../auth/principal.js';
import { BUDGET_SCOPES, type BudgetUsage } from '../../budgets/budget.js';
import { BUDGET_PERIODS } from '../../budgets/budget-period.js';
import { findBudget, listBudgets, withUsage } from '../../budgets/budget-repository.js';
import {
  changeBudgetLimits,
  createBudget,
  getBudget,
  removeBudget,
  type ChangeContext,
} from '../../budgets/budget-service.js';
import { MAX_UNITS } from '../../budgets/budget-units.js';
import type { DB } from '../../db/schema.js';
import { operatorOf } from '../auth.js';
import { decodeCursor, encodeCursor } from '../cursor.js';
import { ApiError } from '../errors.js';
import { refuseCrossTenantObject, tenantInReach } from '../tenant-access.js';
import { identifier, parseInput, positiveUnits } from '../validation.js';

/** What the budget routes need from the composition root. */
export interface BudgetRouteDeps {
  db: Kysely<DB>;
  audit: AuditLog;
  now: () => Date;
}

const subjectId = identifier;
const graceUnits = z.number().min(0).max(MAX_UNITS);
const warnRatio = z.number().gt(0).max(1);

const createBody = z
  .strictObject({
    tenant_id: subjectId.optional(),
    scope: z.enum(BUDGET_SCOPES),
    agent_id: subjectId.nullable().optional(),
    run_id: subjectId.nullable().optional(),
    period: z.enum(BUDGET_PERIODS),
    limit_units: positiveUnits,
    warn_ratio: warnRatio.default(0.8),
    grace_units: graceUnits.default(0),
  })
  .superRefine((body, ctx) => {
    const needs = { agent_id: body.scope === 'agent', run_id: body.scope === 'run' } as const;
    for (const field of ['agent_id', 'run_id'] as const) {
      const given = body[field] !== undefined && body[field] !== null;
      if (needs[field] && !given)
        ctx.addIssue({ code: 'custom', path: [field], message: `required for ${body.scope} scope` });
      if (!needs[field] && given)
        ctx.addIssue({ code: 'custom', path: [field], message: `not allowed for ${body.scope} scope` });
    }
  });

const updateBody = z
  .strictObject({
    limit_units: positiveUnits.optional(),
    warn_ratio: warnRatio.optional(),
    grace_units: graceUnits.optional(),
  })
  .refine((body) => Object.keys(body).length > 0, 'give at least one of limit_units, warn_ratio, grace_units');

const idParams = z.strictObject({ id: z.string().min(1).max(200) });

const listQuery = z.strictObject({
  tenant_id: subjectId.optional(),
  scope: z.enum(BUDGET_SCOPES).optional(),
  agent_id: subjectId.optional(),
  run_id: subjectId.optional(),
  period: z.enum(BUDGET_PERIODS).optional(),
  limit: z.coerce.number().int().min(1).max(500).default(50),
  cursor: z.string().optional(),
});

const cursorSchema = z.tuple([z.iso.datetime(), z.string().min(1)]);

/** A budget as the API shows it. */
export function budgetJson(usage: BudgetUsage): Record<string, unknown> {
  const { budget } = usage;
  return {
    id: budget.id,
    tenant_id: budget.tenant_id,
    scope: budget.scope,
    agent_id: budget.agent_id,
    run_id: budget.run_id,
    period: budget.period,
    limit_units: budget.limit_units,
    warn_ratio: budget.warn_ratio,
    grace_units: budget.grace_units,
    spent_units: usage.spent_units,
    reserved_units: usage.reserved_units,
    period_start: usage.period_start.toISOString(),
    period_end: usage.period_end?.toISOString() ?? null,
    created_at: budget.created_at.toISOString(),
    created_by: budget.created_by,
    updated_at: budget.updated_at.toISOString(),
    updated_by: budget.updated_by,
    removed_at: budget.removed_at?.toISOString() ?? null,
  };
}

/**
 * `/budgets`: cost-unit limits per tenant, agent or run. Tenant-operators manage their
 * own tenant's; another tenant's budgets are 404 and a `security.cross_tenant_attempt` event.
 * A platform-operator may name any tenant with `tenant_id`.
 */
export async function budgetRoutes(app: FastifyInstance, deps: BudgetRouteDeps): Promise<void> {
  const context = (request: FastifyRequest): ChangeContext => ({
    actor: actorOf(operatorOf(request)),
    traceId: request.traceId,
    now: deps.now(),
  });

  /** Loads a budget the operator may see, or answers 404 (recording it if another tenant's). */
  async function visibleBudgetId(request: FastifyRequest): Promise<string> {
    const { id } = parseInput(idParams, request.params, 'params');
    const operator = operatorOf(request);
    if (operator.role === 'tenant-operator') {
      const budget = await findBudget(deps.db, id);
      if (budget && budget.tenant_id !== operator.tenantId) {
        await refuseCrossTenantObject(request, deps.audit, { budget_id: id }, notFound(id).message);
      }
    }
    return id;
  }

  app.post('/budgets', { config: { access: 'operator', idempotent: true } }, async (request, reply: FastifyReply) => {
    const body = parseInput(createBody, request.body, 'body');
    const tenantId = (await tenantInReach(request, deps.audit, body.tenant_id)) ?? operatorOf(request).tenantId;
    const result = await createBudget(
      deps.db,
      {
        tenant_id: tenantId,
        scope: body.scope,
        agent_id: body.agent_id ?? null,
        run_id: body.run_id ?? null,
        period: body.period,
        limit_units: body.limit_units,
        warn_ratio: body.warn_ratio,
        grace_units: body.grace_units,
      },
      context(request),
    );
    if (!result.ok) {
      const existing = result.existing.budget.id;
      throw new ApiError(
        'budget_conflict',
        `budget ${existing} already limits this ${body.scope} over this period; change it with PUT`,
        {
          budget_id: existing,
        },
      );
    }
    return reply.code(result.created ? 201 : 200).send(budgetJson(result.usage));
  });

  app.get('/budgets', { config: { access: 'operator' } }, async (request) => {
    const query = parseInput(listQuery, request.query, 'query');
    const tenantId = await tenantInReach(request, deps.audit, query.tenant_id);
    const after = query.cursor === undefined ? undefined : decodeCursor(query.cursor, cursorSchema);
    const page = await listBudgets(deps.db, {
      tenantId,
      scope: query.scope,
      agentId: query.agent_id,
      runId: query.run_id,
      period: query.period,
      after: after && { createdAt: new Date(after[0]), id: after[1] },
      limit: query.limit,
    });
    const items = await withUsage(deps.db, page.items, deps.now());
    return {
      items: items.map(budgetJson),
      next_cursor: page.next === null ? null : encodeCursor([page.next.createdAt.toISOString(), page.next.id]),
    };
  });

  app.get('/budgets/:id', { config: { access: 'operator' } }, async (request) => {
    const id = await visibleBudgetId(request);
    const usage = await getBudget(deps.db, id, deps.now());
    if (!usage) throw notFound(id);
    return budgetJson(usage);
  });

  app.put('/budgets/:id', { config: { access: 'operator' } }, async (request) => {
    // The body first, as every route that names an object by id: another tenant's budget and an
    // invented id must answer alike, and a body refused only for an invented id would tell them apart.
    const body = parseInput(updateBody, request.body, 'body');
    const id = await visibleBudgetId(request);
    const usage = await changeBudgetLimits(
      deps.db,
      id,
      { limit_units: body.limit_units, warn_ratio: body.warn_ratio, grace_units: body.grace_units },
      context(request),
    );
    if (!usage) throw notFound(id);
    return budgetJson(usage);
  });

  app.delete('/budgets/:id', { config: { access: 'operator' } }, async (request) => {
    const id = await visibleBudgetId(request);
    const usage = await removeBudget(deps.db, id, context(request));
    if (!usage) throw notFound(id);
    return budgetJson(usage);
  });
}

function notFound(id: string): ApiError {
  return new ApiError('not_found', `budget ${id} not found`);
}
