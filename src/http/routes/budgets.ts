import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Kysely } from 'kysely';
import { z } from 'zod';
import type { components, operations } from '../../client/openapi-types.js';
import type { AuditLog } from '../../audit/audit-log.js';
import { actorOf } from '../../auth/principal.js';
import type { BudgetUsage } from '../../budgets/budget.js';
import { findBudget, listBudgets, withUsage } from '../../budgets/budget-repository.js';
import {
  changeBudgetLimits,
  createBudget,
  getBudget,
  removeBudget,
  type ChangeContext,
} from '../../budgets/budget-service.js';
import type { DB } from '../../db/schema.js';
import { operatorOf } from '../auth.js';
import { decodeCursor, encodeCursor } from '../cursor.js';
import { ApiError } from '../errors.js';
import { refuseCrossTenantObject, tenantInReach } from '../tenant-access.js';
import { isPositiveUnits, POSITIVE_UNITS } from '../../validation/values.js';
import { requireThat, type Defaulted } from '../validation.js';

/** What the budget routes need from the composition root. */
export interface BudgetRouteDeps {
  db: Kysely<DB>;
  audit: AuditLog;
  now: () => Date;
}

type CreateBody = Defaulted<components['schemas']['BudgetCreate'], 'warn_ratio' | 'grace_units'>;
type UpdateBody = components['schemas']['BudgetUpdate'];
type ListQuery = Defaulted<operations['listBudgets']['parameters']['query'], 'limit'>;

/** What openapi.yaml cannot say of a budget: which subject its scope needs, and units to six decimals. */
function checkCreate(body: CreateBody): void {
  const needs = { agent_id: body.scope === 'agent', run_id: body.scope === 'run' } as const;
  for (const field of ['agent_id', 'run_id'] as const) {
    const given = body[field] !== undefined && body[field] !== null;
    requireThat(!needs[field] || given, `body.${field}`, `required for ${body.scope} scope`);
    requireThat(needs[field] || !given, `body.${field}`, `not allowed for ${body.scope} scope`);
  }
  requireThat(isPositiveUnits(body.limit_units), 'body.limit_units', POSITIVE_UNITS);
}

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
    const { id } = request.params as { id: string };
    const operator = operatorOf(request);
    if (operator.role === 'tenant-operator') {
      const budget = await findBudget(deps.db, id);
      if (budget && budget.tenant_id !== operator.tenantId) {
        await refuseCrossTenantObject(request, deps.audit, { budget_id: id }, notFound(id).message);
      }
    }
    return id;
  }

  app.post<{ Body: CreateBody }>(
    '/budgets',
    { config: { access: 'operator', idempotent: true } },
    async (request, reply: FastifyReply) => {
      const body = request.body;
      checkCreate(body);
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
    },
  );

  app.get<{ Querystring: ListQuery }>('/budgets', { config: { access: 'operator' } }, async (request) => {
    const query = request.query;
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

  app.put<{ Body: UpdateBody }>('/budgets/:id', { config: { access: 'operator' } }, async (request) => {
    // The body first, as every route that names an object by id: another tenant's budget and an
    // invented id must answer alike, and a body refused only for an invented id would tell them apart.
    const body = request.body;
    if (body.limit_units !== undefined)
      requireThat(isPositiveUnits(body.limit_units), 'body.limit_units', POSITIVE_UNITS);
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
