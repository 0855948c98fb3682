import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import type { components, operations } from '../../client/openapi-types.js';
import type { AuditLog } from '../../audit/audit-log.js';
import { capabilityModifiersSchema } from '../../grants/capability-modifiers.js';
import { grantStatus, type CapabilityModifiers, type Grant } from '../../grants/grant.js';
import type { GrantCandidate } from '../../grants/grant-resolver.js';
import type { GrantRefusal, GrantService } from '../../grants/grant-service.js';
import { operatorOf } from '../auth.js';
import { decodeCursor, encodeCursor } from '../cursor.js';
import { ApiError } from '../errors.js';
import { ownsTenant, refuseCrossTenantObject, tenantInReach } from '../tenant-access.js';
import { INSTANT_YEARS, isWrittenBack } from '../../validation/values.js';
import { parseInput, requireThat, type Defaulted } from '../validation.js';

/** What the grant routes are given by the composition root. */
export interface GrantRouteDeps {
  grants: GrantService;
  audit: AuditLog;
  now: () => Date;
}

// An agent id as agents' tokens carry it in `sub`; a grant names one agent, so no `family:` form.
// What a run names as its run, pipeline instance, session, user or tenant: identifiers.
type CreateBody = components['schemas']['GrantRequest'];
type RevokeBody = { reason: string };
type RenewBody = NonNullable<operations['renewGrant']['requestBody']>['content']['application/json'];
type ListQuery = Defaulted<operations['listGrants']['parameters']['query'], 'limit'>;
type ResolveQuery = operations['resolveGrant']['parameters']['query'];
type IdParams = { id: string };

const cursorSchema = z.tuple([z.iso.datetime(), z.string().min(1)]);

/** A grant as the API shows it, with its standing now. */
export function grantView(grant: Grant, now: Date) {
  return {
    id: grant.id,
    tenant_id: grant.tenant_id,
    agent_id: grant.agent_id,
    tool_id: grant.tool_id,
    scope: grant.scope,
    scope_ref: grant.scope_ref,
    capability_modifiers: grant.capability_modifiers,
    expires_at: grant.expires_at.toISOString(),
    granted_by: grant.granted_by,
    rationale: grant.rationale,
    granted_at: grant.granted_at.toISOString(),
    revoked_at: grant.revoked_at?.toISOString() ?? null,
    revoked_by: grant.revoked_by,
    revocation_reason: grant.revocation_reason,
    renewed_from: grant.renewed_from,
    superseded_by: grant.superseded_by,
    status: grantStatus(grant, now),
  };
}

/** `/grants`: give agents tools in a scope, take them back, renew, and explain. */
export async function grantRoutes(app: FastifyInstance, deps: GrantRouteDeps): Promise<void> {
  const { grants, audit, now } = deps;

  /** Loads a grant the operator may see; another tenant's is a recorded 404. */
  async function grantInReach(request: Parameters<typeof ownsTenant>[0], id: string): Promise<Grant> {
    const grant = await grants.get(id);
    if (!grant) throw new ApiError('not_found', `grant ${id} not found`);
    if (!ownsTenant(request, grant.tenant_id)) {
      await refuseCrossTenantObject(request, audit, { grant_id: id }, `grant ${id} not found`);
    }
    return grant;
  }

  app.post<{ Body: CreateBody }>(
    '/grants',
    { config: { access: 'operator', idempotent: true } },
    async (request, reply) => {
      const operator = operatorOf(request);
      const body = request.body;
      requireThat(isWrittenBack(body.expires_at), 'body.expires_at', INSTANT_YEARS);
      const capabilityModifiers = modifiersOf(body.capability_modifiers);
      const tenantId = (await tenantInReach(request, audit, body.tenant_id)) ?? operator.tenantId;
      const ref = body.scope_ref ?? (body.scope === 'per-tenant' ? tenantId : undefined);
      if (ref === undefined) {
        throw new ApiError('invalid_request', `body.scope_ref: required for a ${body.scope} grant`, {
          issues: [{ field: 'body.scope_ref', message: 'required' }],
        });
      }
      const result = await grants.create({
        actor: { actor_id: operator.id, actor_role: operator.role },
        tenantId,
        agentId: body.agent_id,
        toolId: body.tool_id,
        scope: body.scope,
        scopeRef: ref,
        capabilityModifiers,
        expiresAt: new Date(body.expires_at),
        rationale: body.rationale,
        traceId: request.traceId,
      });
      if (!result.ok) throw refusal(result);
      return reply.code(result.created ? 201 : 200).send(grantView(result.grant, now()));
    },
  );

  app.get<{ Querystring: ListQuery }>('/grants', { config: { access: 'operator' } }, async (request) => {
    const query = request.query;
    const tenantId = await tenantInReach(request, audit, query.tenant_id);
    const page = await grants.list({
      tenantId,
      agentId: query.agent_id,
      toolId: query.tool_id,
      scope: query.scope,
      scopeRef: query.scope_ref,
      status: query.status,
      after: query.cursor === undefined ? undefined : fromCursor(query.cursor),
      limit: query.limit,
    });
    const at = now();
    return {
      items: page.items.map((grant) => grantView(grant, at)),
      next_cursor: page.next === null ? null : encodeCursor([page.next.grantedAt.toISOString(), page.next.id]),
    };
  });

  app.get<{ Querystring: ResolveQuery }>('/grants/resolve', { config: { access: 'operator' } }, async (request) => {
    const operator = operatorOf(request);
    const query = request.query;
    const tenantId = (await tenantInReach(request, audit, query.tenant_id)) ?? operator.tenantId;
    const context = {
      tenant_id: tenantId,
      run_id: query.run_id,
      pipeline_instance_id: query.pipeline_instance_id,
      session_id: query.session_id,
      user_id: query.user_id,
    };
    const decision = await grants.resolve({ tenantId, agentId: query.agent_id, toolId: query.tool_id, context });
    const at = now();
    const selected = decision.ok ? decision.grant.id : undefined;
    return {
      ok: decision.ok,
      code: decision.ok ? null : decision.code,
      grant: decision.ok ? grantView(decision.grant, at) : null,
      candidates: decision.candidates.map((candidate: GrantCandidate) => ({
        grant: grantView(candidate.grant, at),
        status: candidate.status,
        priority: candidate.priority,
        selected: candidate.grant.id === selected,
      })),
      agent_id: query.agent_id,
      tool_id: query.tool_id,
      context: Object.fromEntries(Object.entries(context).map(([key, value]) => [key, value ?? null])),
    };
  });

  app.get<{ Params: IdParams }>('/grants/:id', { config: { access: 'operator' } }, async (request) => {
    const { id } = request.params;
    return grantView(await grantInReach(request, id), now());
  });

  app.post<{ Params: IdParams; Body: RevokeBody }>(
    '/grants/:id/revoke',
    { config: { access: 'operator' } },
    async (request) => {
      const operator = operatorOf(request);
      const { id } = request.params;
      const body = request.body;
      await grantInReach(request, id);
      const result = await grants.revoke({
        actor: { actor_id: operator.id, actor_role: operator.role },
        id,
        reason: body.reason,
        traceId: request.traceId,
      });
      if (!result.ok) throw refusal(result);
      return grantView(result.grant, now());
    },
  );

  app.post<{ Params: IdParams; Body: RenewBody }>(
    '/grants/:id/renew',
    { config: { access: 'operator' } },
    async (request, reply) => {
      const operator = operatorOf(request);
      const { id } = request.params;
      const body = request.body;
      requireThat(isWrittenBack(body.expires_at), 'body.expires_at', INSTANT_YEARS);
      const capabilityModifiers =
        body.capability_modifiers === undefined ? undefined : modifiersOf(body.capability_modifiers);
      await grantInReach(request, id);
      const result = await grants.renew({
        actor: { actor_id: operator.id, actor_role: operator.role },
        id,
        rationale: body.rationale,
        expiresAt: new Date(body.expires_at),
        capabilityModifiers,
        traceId: request.traceId,
      });
      if (!result.ok) throw refusal(result);
      return reply.code(201).send(grantView(result.grant, now()));
    },
  );
}

/** A grant's modifiers normalised (zod: hosts trimmed and lower-cased, which a schema cannot do). */
function modifiersOf(modifiers: unknown): CapabilityModifiers {
  return parseInput(capabilityModifiersSchema, modifiers, 'body.capability_modifiers');
}

function refusal(result: GrantRefusal): ApiError {
  return new ApiError(result.code, result.message, result.details ?? {});
}

function fromCursor(cursor: string): { grantedAt: Date; id: string } {
  const [grantedAt, id] = decodeCursor(cursor, cursorSchema);
  return { grantedAt: new Date(grantedAt), id };
}
