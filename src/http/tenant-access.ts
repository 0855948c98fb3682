import type { FastifyRequest } from 'fastify';
import type { AuditLog } from '../audit/audit-log.js';
import { actorOf } from '../auth/principal.js';
import { operatorOf, principalOf } from './auth.js';
import { ApiError } from './errors.js';

/**
 * Records a tenant-operator (or an agent) naming another tenant, then answers exactly as for
 * a tenant that does not exist (`404`: whether it exists is never leaked). The event, in the caller's own
 * tenant, names what was asked for, never what exists: it is recorded whether the tenant exists or not.
 */
export async function refuseCrossTenant(
  request: FastifyRequest,
  audit: AuditLog,
  details: Record<string, unknown>,
  message: string,
): Promise<never> {
  await recordAttempt(request, audit, principalOf(request).tenantId, details);
  throw new ApiError('not_found', message);
}

/**
 * Records a tenant-operator reaching for another tenant's object and answers as for an unknown id.
 * The record is platform-wide: in the caller's tenant, `GET /audit` would tell real ids from invented.
 */
export async function refuseCrossTenantObject(
  request: FastifyRequest,
  audit: AuditLog,
  details: Record<string, unknown>,
  message: string,
): Promise<never> {
  await recordAttempt(request, audit, null, { caller_tenant_id: principalOf(request).tenantId, ...details });
  throw new ApiError('not_found', message);
}

async function recordAttempt(
  request: FastifyRequest,
  audit: AuditLog,
  tenantId: string | null,
  details: Record<string, unknown>,
): Promise<void> {
  const caller = principalOf(request);
  await audit.append({
    event_type: 'security.cross_tenant_attempt',
    actor: actorOf(caller),
    tenant_id: tenantId,
    ...(caller.kind === 'agent' ? { agent_id: caller.id } : {}),
    trace_id: request.traceId,
    status: 'denied',
    reason_code: 'not_found',
    details: {
      route: `${request.method} ${(request.routeOptions.url ?? request.url).replace(/:([A-Za-z_]+)/g, '{$1}')}`,
      ...details,
    },
  });
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
