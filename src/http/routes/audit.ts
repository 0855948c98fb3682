import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { Kysely } from 'kysely';
import { z } from 'zod';
import type { operations } from '../../client/openapi-types.js';
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
import { requireThat, type Defaulted } from '../validation.js';

export interface AuditRouteDeps {
  db: Kysely<DB>;
  audit: AuditLog;
  checkpoints: AuditCheckpoints;
  partitions: AuditPartitions;
  tree: AuditTree;
}

type ListQuery = Defaulted<operations['listAuditEvents']['parameters']['query'], 'limit'>;
type TreeSizeQuery = { tree_size?: number };
type ConsistencyQuery = { first: number; second: number };
type VerifyQuery = NonNullable<operations['verifyAudit']['parameters']['query']>;
type EventParams = { event_id: string };
type PartitionParams = { name: string };
type DetachBody = { last_seq: number; last_hash: string };
type CheckpointListQuery = Defaulted<operations['listAuditCheckpoints']['parameters']['query'], 'limit'>;

const checkpointCursor = z.strictObject({ seq: z.number().int().min(0), id: z.string() });

/** What openapi.yaml cannot say of an anchor: both parts or neither. */
function anchorOf(query: VerifyQuery): { seq: number; hash: string } | undefined {
  requireThat(
    query.anchor_hash !== undefined || query.anchor_seq === undefined,
    'query.anchor_hash',
    'is required with anchor_seq',
  );
  requireThat(
    query.anchor_seq !== undefined || query.anchor_hash === undefined,
    'query.anchor_seq',
    'is required with anchor_hash',
  );
  return query.anchor_seq !== undefined && query.anchor_hash !== undefined
    ? { seq: query.anchor_seq, hash: query.anchor_hash }
    : undefined;
}

/** `GET /audit`, `GET /audit/verify` and the checkpoints. Tenant-operators see only their own tenant. */
export async function auditRoutes(app: FastifyInstance, deps: AuditRouteDeps): Promise<void> {
  app.get<{ Querystring: ListQuery }>('/audit', { config: { access: 'operator' } }, async (request) => {
    const query = request.query;
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
  app.get<{ Querystring: TreeSizeQuery }>(
    '/audit/checkpoint',
    { config: { access: 'any' } },
    async (request, reply) => {
      const query = request.query;
      return reply.type('text/plain; charset=utf-8').send(await deps.tree.checkpoint(query.tree_size));
    },
  );

  app.get('/audit/log-info', { config: { access: 'any' } }, async () => deps.tree.logInfo());

  app.get<{ Params: EventParams }>('/audit/events/:event_id', { config: { access: 'any' } }, async (request) => {
    const { event_id } = request.params;
    return deps.tree.event(event_id, scopeOf(request));
  });

  app.get<{ Params: EventParams; Querystring: TreeSizeQuery }>(
    '/audit/events/:event_id/inclusion',
    { config: { access: 'any' } },
    async (request) => {
      const { event_id } = request.params;
      const query = request.query;
      return deps.tree.inclusion(event_id, scopeOf(request), query.tree_size);
    },
  );

  app.get<{ Querystring: ConsistencyQuery }>('/audit/consistency', { config: { access: 'any' } }, async (request) => {
    const query = request.query;
    return deps.tree.consistency(query.first, query.second);
  });

  // The chain spans every tenant, so only a platform-operator verifies it.
  app.get<{ Querystring: VerifyQuery }>(
    '/audit/verify',
    { config: { access: 'platform-operator' } },
    async (request) => {
      const query = request.query;
      const anchor = anchorOf(query);
      // From a checkpoint of the tree the caller trusts: only the leaves appended since.
      if (query.from_tree_size !== undefined) {
        const tree = await deps.tree.verify(query.from_tree_size);
        return { ok: tree.ok, tree };
      }
      if (query.from_checkpoint !== undefined) return deps.checkpoints.verifyFrom(query.from_checkpoint, anchor);
      const [chain, tree] = await Promise.all([verifyAuditChain(deps.db, undefined, anchor), deps.tree.verify()]);
      return { ...chain, ok: chain.ok && tree.ok, tree };
    },
  );

  app.post('/audit/checkpoints', { config: { access: 'platform-operator' } }, async (request, reply) => {
    const checkpoint = await deps.checkpoints.create(actorOf(operatorOf(request)));
    return reply.code(201).send(checkpoint);
  });

  app.get('/audit/partitions', { config: { access: 'platform-operator' } }, async () => ({
    items: await deps.partitions.list(),
  }));

  app.post<{ Params: PartitionParams }>(
    '/audit/partitions/:name/seal',
    { config: { access: 'platform-operator' } },
    async (request, reply) => {
      const { name } = request.params;
      const sealed = await deps.partitions.seal(name, actorOf(operatorOf(request)));
      return reply.code(sealed.created ? 201 : 200).send(sealed.checkpoint);
    },
  );

  app.get<{ Params: PartitionParams }>(
    '/audit/partitions/:name/export',
    { config: { access: 'platform-operator' } },
    async (request, reply) => {
      const { name } = request.params;
      const exported = await deps.partitions.export(name);
      return reply
        .type('application/x-ndjson')
        .header('content-disposition', `attachment; filename="${exported.filename}"`)
        .send(exported.stream);
    },
  );

  app.post<{ Params: PartitionParams; Body: DetachBody }>(
    '/audit/partitions/:name/detach',
    { config: { access: 'platform-operator' } },
    async (request) => {
      const { name } = request.params;
      const body = request.body;
      return deps.partitions.detach(name, actorOf(operatorOf(request)), { seq: body.last_seq, hash: body.last_hash });
    },
  );

  app.get<{ Querystring: CheckpointListQuery }>(
    '/audit/checkpoints',
    { config: { access: 'platform-operator' } },
    async (request) => {
      const query = request.query;
      const before = query.cursor === undefined ? undefined : decodeCursor(query.cursor, checkpointCursor);
      const page = await deps.checkpoints.list({ limit: query.limit, before });
      return { items: page.items, next_cursor: page.next === null ? null : encodeCursor(page.next) };
    },
  );
}

/** Whose records the caller sees: a platform-operator every tenant's, anyone else their own tenant's. */
function scopeOf(request: FastifyRequest): string | undefined {
  const principal = principalOf(request);
  return principal.kind === 'operator' && principal.role === 'platform-operator' ? undefined : principal.tenantId;
}
