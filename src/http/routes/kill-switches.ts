import type { FastifyInstance, FastifyRequest } from 'fastify';
import { z } from 'zod';
import type { operations } from '../../client/openapi-types.js';
import type { AuditLog } from '../../audit/audit-log.js';
import { actorOf } from '../../auth/principal.js';
import type { ToolFacts } from '../../grants/tool-facts.js';
import { GLOBAL_TARGET, PLATFORM_ONLY_SCOPES, type KillSwitch } from '../../kill-switches/kill-switch.js';
import type { KillSwitchRefusal, KillSwitchService } from '../../kill-switches/kill-switch-service.js';
import type { KillSwitchSnapshot } from '../../kill-switches/kill-switch-snapshot.js';
import { operatorOf } from '../auth.js';
import { decodeCursor, encodeCursor } from '../cursor.js';
import { ApiError } from '../errors.js';
import { ownsTenant, refuseCrossTenantObject, tenantInReach } from '../tenant-access.js';
import { TOOL_ID_PATTERN } from '../../validation/fields.js';
import { invalidField, requireThat, type Defaulted } from '../validation.js';

/** What the kill-switch routes are given by the composition root. */
export interface KillSwitchRouteDeps {
  service: KillSwitchService;
  snapshot: KillSwitchSnapshot;
  audit: AuditLog;
  /**
   * The server-side `{family, provider, region}` target of the version a call in a tenant resolves
   * to, as the executor resolves it (the newest matching version the agent may use; with no agent,
   * allowlists aside): what the safety stage judges.
   */
  callTarget(
    agent: { agentId: string; family: string | undefined } | null,
    toolId: string,
    tenantId: string,
  ): Promise<ToolFacts['target'] | undefined>;
}

type ArmBody = NonNullable<operations['armKillSwitch']['requestBody']>['content']['application/json'];
type DisarmBody = { reason: string };
type ListQuery = Defaulted<operations['listKillSwitches']['parameters']['query'], 'limit'>;
type DecideQuery = NonNullable<operations['decideKillSwitches']['parameters']['query']>;
type IdParams = { id: string };

const cursorSchema = z.tuple([z.iso.datetime(), z.string().min(1)]);

/** What openapi.yaml cannot say of an arming: a target that could match nothing is refused, not armed. */
function checkTarget(body: ArmBody): void {
  if (body.target === undefined) requireThat(body.scope === 'global', 'body.target', 'required');
  else if (body.scope !== 'global' && body.target === GLOBAL_TARGET)
    throw invalidField(
      'body.target',
      `'${GLOBAL_TARGET}' is the global switch's target; a ${body.scope} switch names one ${body.scope}`,
    );
  else if (body.scope === 'tool')
    requireThat(TOOL_ID_PATTERN.test(body.target), 'body.target', 'must be a tool id such as web.fetch');
}

/** A kill switch as the API shows it. */
export function killSwitchView(ks: KillSwitch) {
  return {
    id: ks.id,
    scope: ks.scope,
    target: ks.target,
    tenant_id: ks.tenant_id,
    state: ks.disarmed_at === null ? 'armed' : 'disarmed',
    reason: ks.reason,
    user_visible_status_copy: ks.user_visible_status_copy,
    safe_degradation_mode_id: ks.safe_degradation_mode_id,
    armed_by: ks.armed_by,
    armed_at: ks.armed_at.toISOString(),
    disarmed_by: ks.disarmed_by,
    disarmed_at: ks.disarmed_at?.toISOString() ?? null,
    disarm_reason: ks.disarm_reason,
  };
}

/** `/kill-switches`: arm, disarm, list, read, and explain which switches stop a call. */
export async function killSwitchRoutes(app: FastifyInstance, deps: KillSwitchRouteDeps): Promise<void> {
  const { service, snapshot, audit } = deps;

  app.post<{ Body: ArmBody }>(
    '/kill-switches',
    { config: { access: 'operator', idempotent: true } },
    async (request, reply) => {
      const operator = operatorOf(request);
      const body = request.body;
      checkTarget(body);
      const target = body.target ?? GLOBAL_TARGET;
      // A tenant is named in `tenant_id`, and a tenant switch names one in `target` too.
      if (body.scope === 'tenant') await tenantInReach(request, audit, target);
      const reach = await tenantInReach(request, audit, body.tenant_id ?? undefined);
      // What was asked for goes to the service, which refuses what this operator may not arm.
      let tenantId: string | null;
      if (body.scope === 'tenant') tenantId = body.tenant_id ?? target;
      else if (PLATFORM_ONLY_SCOPES.has(body.scope) || body.tenant_id === null) tenantId = body.tenant_id ?? null;
      else tenantId = reach ?? null;
      const result = await service.arm({
        actor: { actor_id: operator.id, actor_role: operator.role },
        scope: body.scope,
        target,
        tenantId,
        reason: body.reason,
        userVisibleStatusCopy: body.user_visible_status_copy,
        safeDegradationModeId: body.safe_degradation_mode_id ?? null,
        traceId: request.traceId,
      });
      if (!result.ok) return refuse(request, audit, result);
      return reply.code(result.created ? 201 : 200).send(killSwitchView(result.killSwitch));
    },
  );

  app.get<{ Querystring: ListQuery }>('/kill-switches', { config: { access: 'operator' } }, async (request) => {
    const query = request.query;
    const tenantId = await tenantInReach(request, audit, query.tenant_id);
    const page = await service.list({
      tenantId,
      includePlatformWide: true,
      state: query.state,
      scope: query.scope,
      target: query.target,
      after: query.cursor === undefined ? undefined : fromCursor(query.cursor),
      limit: query.limit,
    });
    return {
      items: page.items.map(killSwitchView),
      next_cursor: page.next === null ? null : encodeCursor([page.next.armedAt.toISOString(), page.next.id]),
    };
  });

  app.get<{ Querystring: DecideQuery }>(
    '/kill-switches/decide',
    { config: { access: 'operator' } },
    async (request, reply) => {
      const operator = operatorOf(request);
      const query = request.query;
      const tenantId = (await tenantInReach(request, audit, query.tenant_id)) ?? operator.tenantId;
      let toolTarget: { family?: string | null; provider?: string | null; region?: string | null } | null = null;
      if (query.tool_id !== undefined) {
        // Without an agent, the version any call would run: not a newer one no call can run.
        const agent = query.agent_id === undefined ? null : { agentId: query.agent_id, family: query.family };
        toolTarget = (await deps.callTarget(agent, query.tool_id, tenantId)) ?? null;
      }
      const decision = snapshot.decide({
        tenantId,
        agentId: query.agent_id,
        family: query.family,
        toolId: query.tool_id,
        target: toolTarget,
      });
      if (!decision.ok && decision.code === 'gateway_unavailable') {
        throw new ApiError('gateway_unavailable', 'this replica cannot confirm its kill-switch state is fresh', {
          snapshot_age_ms: Number.isFinite(decision.age_ms) ? Math.round(decision.age_ms) : null,
        });
      }
      const state = snapshot.state();
      return reply.send({
        ok: decision.ok,
        code: decision.ok ? null : decision.code,
        blamed: decision.ok ? null : killSwitchView(decision.blamed),
        matches: decision.ok ? [] : decision.matches.map(killSwitchView),
        call: {
          tenant_id: tenantId,
          agent_id: query.agent_id ?? null,
          family: query.family ?? null,
          tool_id: query.tool_id ?? null,
          tool_target: toolTarget,
        },
        snapshot: { version: state.version, age_ms: Math.round(state.age_ms) },
      });
    },
  );

  app.get<{ Params: IdParams }>('/kill-switches/:id', { config: { access: 'operator' } }, async (request) => {
    const { id } = request.params;
    const ks = await service.get(id);
    if (!ks) throw new ApiError('not_found', `kill switch ${id} not found`);
    if (!ownsTenant(request, ks.tenant_id)) {
      await refuseCrossTenantObject(request, audit, { kill_switch_id: id }, `kill switch ${id} not found`);
    }
    return killSwitchView(ks);
  });

  app.post<{ Params: IdParams; Body: DisarmBody }>(
    '/kill-switches/:id/disarm',
    { config: { access: 'operator' } },
    async (request) => {
      const operator = operatorOf(request);
      const { id } = request.params;
      const body = request.body;
      const ks = await service.get(id);
      if (!ks) throw new ApiError('not_found', `kill switch ${id} not found`);
      if (!ownsTenant(request, ks.tenant_id)) {
        await refuseCrossTenantObject(request, audit, { kill_switch_id: id }, `kill switch ${id} not found`);
      }
      const result = await service.disarm({
        actor: { actor_id: operator.id, actor_role: operator.role },
        id,
        reason: body.reason,
        traceId: request.traceId,
      });
      if (!result.ok) return refuse(request, audit, result);
      return killSwitchView(result.killSwitch);
    },
  );
}

function fromCursor(cursor: string): { armedAt: Date; id: string } {
  const [armedAt, id] = decodeCursor(cursor, cursorSchema);
  return { armedAt: new Date(armedAt), id };
}

// A tenant-operator reaching for platform powers is a security event, like an agent on an
// operator route; the other refusals are plain client errors.
async function refuse(request: FastifyRequest, audit: AuditLog, refusal: KillSwitchRefusal): Promise<never> {
  if (refusal.code === 'forbidden') {
    const operator = operatorOf(request);
    await audit.append({
      event_type: 'security.escalation_attempt',
      actor: actorOf(operator),
      tenant_id: operator.tenantId,
      trace_id: request.traceId,
      status: 'denied',
      reason_code: 'forbidden',
      details: { route: `${request.method} ${request.routeOptions.url ?? request.url}`, message: refusal.message },
    });
  }
  throw new ApiError(refusal.code, refusal.message, refusal.details ?? {});
}
