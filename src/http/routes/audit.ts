import type { FastifyInstance } from 'fastify';
import type { Kysely } from 'kysely';
import { z } from 'zod';
import type { AuditLog } from '../../audit/audit-log.js';
import { listAuditEvents, verifyAuditChain } from '../../audit/audit-repository.js';
import type { DB } from '../../db/schema.js';
import { decodeCursor, encodeCursor } from '../cursor.js';
import { tenantInReach } from '../tenant-access.js';
import { identifier, parseInput } from '../validation.js';

export interface AuditRouteDeps {
  db: Kysely<DB>;
  audit: AuditLog;
}


const listQuery = z.strictObject({
  tenant_id: identifier.optional(),
  run_id: identifier.optional(),
  tool_id: identifier.optional(),
  agent_id: identifier.optional(),
  event_type: identifier.optional(),
  since: z.iso.datetime({ offset: true }).optional(),
  until: z.iso.datetime({ offset: true }).optional(),
  limit: z.coerce.number().int().min(1).max(500).default(50),
  cursor: z.string().optional(),
});

/** `GET /audit` and `GET /audit/verify`. Tenant-operators see only their own tenant. */
export async function auditRoutes(app: FastifyInstance, deps: AuditRouteDeps): Promise<void> {
  app.get('/audit', { config: { access: 'operator' } }, async (request) => {
    const query = parseInput(listQuery, request.query, 'query');
    const tenantId = await tenantInReach(request, deps.audit, query.tenant_id);
    const page = await listAuditEvents(deps.db, {
      tenantId,
      runId: query.run_id,
      toolId: query.tool_id,
      agentId: query.agent_id,
      eventType: query.event_type,
      since: query.since ? new Date(query.since) : undefined,
      until: query.until ? new Date(query.until) : undefined,
      // Any seq it issued: a row forged below 1 is listed as stored, and so are the rows after it.
      beforeSeq: query.cursor === undefined ? undefined : decodeCursor(query.cursor, z.number().int()),
      limit: query.limit,
    });
    return { items: page.items, next_cursor: page.nextBeforeSeq === null ? null : encodeCursor(page.nextBeforeSeq) };
  });

  // The chain spans every tenant, so only a platform-operator verifies it.
  app.get('/audit/verify', { config: { access: 'platform-operator' } }, async () => verifyAuditChain(deps.db));
}
