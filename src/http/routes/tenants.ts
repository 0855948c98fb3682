import type { FastifyInstance } from 'fastify';
import type { Kysely } from 'kysely';
import type { AuditLog } from '../../audit/audit-log.js';
import { actorOf } from '../../auth/principal.js';
import type { DB } from '../../db/schema.js';
import { getTenantPolicy, putTenantPolicy } from '../../tenants/tenant-policy.js';
import { operatorOf } from '../auth.js';
import { tenantInReach } from '../tenant-access.js';

export interface TenantRouteDeps {
  db: Kysely<DB>;
  audit: AuditLog;
  now: () => Date;
}

type Params = { tenant_id: string };
type PolicyBody = { external_call_enabled: boolean };

/** `GET /tenants/{tenant_id}/policy` (operators of the tenant) and `PUT` (platform-operators). */
export async function tenantRoutes(app: FastifyInstance, deps: TenantRouteDeps): Promise<void> {
  app.get<{ Params: Params }>('/tenants/:tenant_id/policy', { config: { access: 'operator' } }, async (request) => {
    const { tenant_id } = request.params;
    await tenantInReach(request, deps.audit, tenant_id);
    return getTenantPolicy(deps.db, tenant_id);
  });

  app.put<{ Params: Params; Body: PolicyBody }>(
    '/tenants/:tenant_id/policy',
    { config: { access: 'platform-operator' } },
    async (request) => {
      const operator = operatorOf(request);
      const { tenant_id } = request.params;
      const body = request.body;
      return putTenantPolicy(deps.db, {
        tenantId: tenant_id,
        externalCallEnabled: body.external_call_enabled,
        actor: actorOf(operator),
        traceId: request.traceId,
        now: deps.now(),
      });
    },
  );
}
