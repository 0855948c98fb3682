import type { FastifyRequest } from 'fastify';
import type { AuditLog } from '../audit/audit-log.js';
import { actorOf } from '../auth/principal.js';
import { operatorOf, principalOf } from './auth.js';
import { ApiError } from './errors.js';

/**
 * Records a tenant-operator (or an agent) reaching for another tenant's objects, then answers exactly as for
 * an object that does not exist (SPEC §1: `404`, never leaked). The event names what was asked
 * for, never what exists.
 */
export async function refuseCrossTenant(
  request: FastifyRequest,
  audit: AuditLog,
  details: Record<string, unknown>,
  message: string,
): Promise<never> {
  const caller = principalOf(request);
  await audit.append({
    event_type: 'security.cross_tenant_attempt',
    actor: actorOf(caller),
    tenant_id: caller.tenantId,
    ...(caller.kind === 'agent' ? { agent_id: caller.id } : {}),
    trace_id: request.traceId,
    status: 'denied',
    reason_code: 'not_found',
    details: { route: `${request.method} ${(request.routeOptions.url ?? request.url).replace(/:([A-Za-z_]+)/g, '{$1}')}`, ...details },
  });
  throw new ApiError('not_found', message);
}

/**
 * The tenant an operator acts in when it may name one: a tenant-operator's own (naming another
 * is a cross-tenant attempt); for a platform-operator, the named tenant, or undefined.
 */
export async function tenantInReach(
  request: FastifyRequest,
  audit: AuditLog,
  named: string | undefined,
): Promise<string | undefined> {
  const operator = operatorOf(request);
  if (operator.role === 'platform-operator') return named;
  if (named !== undefined && named !== operator.tenantId) {
    await refuseCrossTenant(request, audit, { requested_tenant_id: named }, `tenant ${named} not found`);
  }
  return operator.tenantId;
}

/** Whether an object of `tenantId` (null: platform-wide) is within the operator's reach. */
export function ownsTenant(request: FastifyRequest, tenantId: string | null): boolean {
  const operator = operatorOf(request);
  return operator.role === 'platform-operator' || tenantId === null || tenantId === operator.tenantId;
}
