import type { FastifyInstance } from 'fastify';
import { principalOf } from '../auth.js';

/** `GET /whoami`: what the gateway makes of the caller's token. Handy when wiring up clients. */
export async function whoamiRoutes(app: FastifyInstance): Promise<void> {
  app.get('/whoami', { config: { access: 'any' } }, async (request) => {
    const principal = principalOf(request);
    return {
      kind: principal.kind,
      id: principal.id,
      tenant_id: principal.tenantId,
      role: principal.kind === 'operator' ? principal.role : null,
      family: principal.kind === 'agent' ? (principal.family ?? null) : null,
      scopes: [...principal.scopes],
    };
  });
}
