import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { Kysely } from 'kysely';
import { z } from 'zod';
import type { AuditCheckpoints } from '../../audit/audit-checkpoints.js';
import type { AuditLog } from '../../audit/audit-log.js';
import type { AuditPartitions } from '../../audit/audit-partitions.js';
import type { AuditTree } from '../../audit/audit-tree.js';
import { actorOf } from '../../auth/principal.js';
import { operatorOf, principalOf } from '../auth.js';
import { listAuditEvents } from '../../audit/audit-listing.js';
import { verifyAuditChain } from '../../audit/chain-verification.js';
import type { DB } from '../../db/schema.js';
import { decodeCursor, encodeCursor } from '../cursor.js';
import { tenantInReach } from '../tenant-access.js';
import { identifier, parseInput } from '../validation.js';

export interface AuditRouteDeps {
  db: Kysely<DB>;
  audit: AuditLog;
  checkpoints: AuditCheckpoints;
  partitions: AuditPartitions;
  tree: AuditTree;
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

/** A tree size: digits only, within what a double holds exactly. */
const treeSize = z
  .string()
  .regex(/^(0|[1-9][0-9]*)$/, 'must be an integer of 0 or more')
  .transform(Number)
  .refine(Number.isSafeInteger, 'must be at most 9007199254740991');

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
    from_tree_size: treeSize.optional(),
  })
  .superRefine((query, ctx) => {
    if (query.anchor_seq !== undefined && query.anchor_hash === undefined) {
      ctx.addIssue({ code: 'custom', path: ['anchor_hash'], message: 'is required with anchor_seq' });
    } else if (query.anchor_hash !== undefined && query.anchor_seq === undefined) {
      ctx.addIssue({ code: 'custom', path: ['anchor_seq'], message: 'is required with anchor_hash' });
    }
  });

const treeCheckpointQuery = z.strictObject({ tree_size: treeSize.optional() });
const consistencyQuery = z.strictObject({ first: treeSize, second: treeSize });
const eventParams = z.strictObject({ event_id: z.uuid('must be a UUID') });

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

  // The log's signed checkpoints and proofs (SPEC §8.1): any authenticated principal; records by their tenancy.
  app.get('/audit/checkpoint', { config: { access: 'any' } }, async (request, reply) => {
    const query = parseInput(treeCheckpointQuery, request.query, 'query');
    return reply.type('text/plain; charset=utf-8').send(await deps.tree.checkpoint(query.tree_size));
  });

  app.get('/audit/log-info', { config: { access: 'any' } }, async () => deps.tree.logInfo());

  app.get('/audit/events/:event_id', { config: { access: 'any' } }, async (request) => {
    const { event_id } = parseInput(eventParams, request.params, 'params');
    return deps.tree.event(event_id, scopeOf(request));
  });

  app.get('/audit/events/:event_id/inclusion', { config: { access: 'any' } }, async (request) => {
    const { event_id } = parseInput(eventParams, request.params, 'params');
    const query = parseInput(treeCheckpointQuery, request.query, 'query');
    return deps.tree.inclusion(event_id, scopeOf(request), query.tree_size);
  });

  app.get('/audit/consistency', { config: { access: 'any' } }, async (request) => {
    const query = parseInput(consistencyQuery, request.query, 'query');
    return deps.tree.consistency(query.first, query.second);
  });

  // The chain spans every tenant, so only a platform-operator verifies it.
  app.get('/audit/verify', { config: { access: 'platform-operator' } }, async (request) => {
    const query = parseInput(verifyQuery, request.query, 'query');
    const anchor =
      query.anchor_seq !== undefined && query.anchor_hash !== undefined
        ? { seq: query.anchor_seq, hash: query.anchor_hash }
        : undefined;
    // From a checkpoint of the tree the caller trusts: only the leaves appended since.
    if (query.from_tree_size !== undefined) {
      const tree = await deps.tree.verify(query.from_tree_size);
      return { ok: tree.ok, tree };
    }
    if (query.from_checkpoint !== undefined) return deps.checkpoints.verifyFrom(query.from_checkpoint, anchor);
    const [chain, tree] = await Promise.all([verifyAuditChain(deps.db, undefined, anchor), deps.tree.verify()]);
    return { ...chain, ok: chain.ok && tree.ok, tree };
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

/** Whose records the caller sees: a platform-operator every tenant's, anyone else their own tenant's. */
function scopeOf(request: FastifyRequest): string | undefined {
  const principal = principalOf(request);
  return principal.kind === 'operator' && principal.role === 'platform-operator' ? undefined : principal.tenantId;
}
