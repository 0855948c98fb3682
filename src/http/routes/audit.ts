import type { FastifyInstance } from 'fastify';
import type { Kysely } from 'kysely';
import { z } from 'zod';
import type { AuditCheckpoints } from '../../audit/audit-checkpoints.js';
import type { AuditLog } from '../../audit/audit-log.js';
import type { AuditPartitions } from '../../audit/audit-partitions.js';
import { actorOf } from '../../auth/principal.js';
import { operatorOf } from '../auth.js';
import { listAuditEvents, verifyAuditChain } from '../../audit/audit-repository.js';
import type { DB } from '../../db/schema.js';
import { decodeCursor, encodeCursor } from '../cursor.js';
import { tenantInReach } from '../tenant-access.js';
import { identifier, parseInput } from '../validation.js';

export interface AuditRouteDeps {
  db: Kysely<DB>;
  audit: AuditLog;
  checkpoints: AuditCheckpoints;
  partitions: AuditPartitions;
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

/**
 * An anchor to check the chain against: both parts or neither. The seq is digits only (no `1e3`,
 * `0x10` or spaces, which a number coercion would take) and within what a double holds exactly.
 */
const verifyQuery = z
  .strictObject({
    anchor_seq: z
      .string()
      .regex(/^[1-9][0-9]*$/, 'must be an integer of 1 or more')
      .transform(Number)
      .refine(Number.isSafeInteger, 'must be at most 9007199254740991')
      .optional(),
    anchor_hash: z
      .string()
      .regex(/^[0-9a-f]{64}$/, 'must be 64 lowercase hex digits')
      .optional(),
    from_checkpoint: identifier.optional(),
  })
  .superRefine((query, ctx) => {
    if (query.anchor_seq !== undefined && query.anchor_hash === undefined) {
      ctx.addIssue({ code: 'custom', path: ['anchor_hash'], message: 'is required with anchor_seq' });
    } else if (query.anchor_hash !== undefined && query.anchor_seq === undefined) {
      ctx.addIssue({ code: 'custom', path: ['anchor_seq'], message: 'is required with anchor_hash' });
    }
  });

const checkpointListQuery = z.strictObject({
  limit: z.coerce.number().int().min(1).max(500).default(50),
  cursor: z.string().optional(),
});
const checkpointCursor = z.strictObject({ seq: z.number().int().min(0), id: z.string() });

const partitionParams = z.strictObject({
  name: z.string().regex(/^audit_events_[a-z0-9_]{1,60}$/, 'must name a partition of audit_events'),
});
/** The last record of the export the operator archived: the detach proceeds only if the partition still ends there. */
const detachBody = z.strictObject({
  last_seq: z.number().int().min(1).max(Number.MAX_SAFE_INTEGER),
  last_hash: z.string().regex(/^[0-9a-f]{64}$/, 'must be 64 lowercase hex digits'),
});

/** `GET /audit`, `GET /audit/verify` and the checkpoints. Tenant-operators see only their own tenant. */
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
  app.get('/audit/verify', { config: { access: 'platform-operator' } }, async (request) => {
    const query = parseInput(verifyQuery, request.query, 'query');
    const anchor =
      query.anchor_seq !== undefined && query.anchor_hash !== undefined
        ? { seq: query.anchor_seq, hash: query.anchor_hash }
        : undefined;
    if (query.from_checkpoint !== undefined) return deps.checkpoints.verifyFrom(query.from_checkpoint, anchor);
    return verifyAuditChain(deps.db, undefined, anchor);
  });

  app.post('/audit/checkpoints', { config: { access: 'platform-operator' } }, async (request, reply) => {
    const checkpoint = await deps.checkpoints.create(actorOf(operatorOf(request)));
    return reply.code(201).send(checkpoint);
  });

  app.get('/audit/partitions', { config: { access: 'platform-operator' } }, async () => ({
    items: await deps.partitions.list(),
  }));

  app.post('/audit/partitions/:name/seal', { config: { access: 'platform-operator' } }, async (request, reply) => {
    const { name } = parseInput(partitionParams, request.params, 'params');
    const sealed = await deps.partitions.seal(name, actorOf(operatorOf(request)));
    return reply.code(sealed.created ? 201 : 200).send(sealed.checkpoint);
  });

  app.get('/audit/partitions/:name/export', { config: { access: 'platform-operator' } }, async (request, reply) => {
    const { name } = parseInput(partitionParams, request.params, 'params');
    const exported = await deps.partitions.export(name);
    return reply
      .type('application/x-ndjson')
      .header('content-disposition', `attachment; filename="${exported.filename}"`)
      .send(exported.stream);
  });

  app.post('/audit/partitions/:name/detach', { config: { access: 'platform-operator' } }, async (request) => {
    const { name } = parseInput(partitionParams, request.params, 'params');
    const body = parseInput(detachBody, request.body, 'body');
    return deps.partitions.detach(name, actorOf(operatorOf(request)), { seq: body.last_seq, hash: body.last_hash });
  });

  app.get('/audit/checkpoints', { config: { access: 'platform-operator' } }, async (request) => {
    const query = parseInput(checkpointListQuery, request.query, 'query');
    const before = query.cursor === undefined ? undefined : decodeCursor(query.cursor, checkpointCursor);
    const page = await deps.checkpoints.list({ limit: query.limit, before });
    return { items: page.items, next_cursor: page.next === null ? null : encodeCursor(page.next) };
  });
}
