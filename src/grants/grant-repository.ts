import { sql, type Kysely, type Selectable, type Transaction } from 'kysely';
import type { OperatorRole } from '../auth/principal.js';
import type { DB, GrantTable } from '../db/schema.js';
import {
  GRANT_SCOPE_CONTEXT_KEY,
  GRANT_SCOPES,
  type Grant,
  type GrantScope,
  type GrantStatus,
  type OperatorActor,
} from './grant.js';
import type { RunContext } from './grant-resolver.js';
import type { BeforeChain } from '../db/lock-order.js';

/** A grant as first written: nothing about its end yet. */
export type NewGrant = Omit<Grant, 'revoked_at' | 'revoked_by' | 'revocation_reason' | 'superseded_by'>;

/** Writes a new grant in the caller's transaction (its audit event goes in the same one). */
export async function insertGrant(trx: Transaction<DB>, grant: NewGrant): Promise<Grant> {
  const row = await trx
    .insertInto('grants')
    .values({
      id: grant.id,
      tenant_id: grant.tenant_id,
      agent_id: grant.agent_id,
      tool_id: grant.tool_id,
      scope: grant.scope,
      scope_ref: grant.scope_ref,
      capability_modifiers: JSON.stringify(grant.capability_modifiers),
      expires_at: grant.expires_at,
      granted_by_actor_id: grant.granted_by.actor_id,
      granted_by_actor_role: grant.granted_by.actor_role,
      rationale: grant.rationale,
      granted_at: grant.granted_at,
      renewed_from: grant.renewed_from,
    })
    .returningAll()
    .executeTakeFirstOrThrow();
  return toGrant(row);
}

/**
 * Ends a grant that is not already revoked; undefined when it was (or does not exist). The
 * condition makes concurrent revocations and renewals of one grant take effect once.
 */
export async function revokeGrant(
  trx: BeforeChain,
  change: { id: string; by: OperatorActor; reason: string; at: Date; supersededBy?: string },
): Promise<Grant | undefined> {
  const row = await trx
    .updateTable('grants')
    .set({
      revoked_at: change.at,
      revoked_by_actor_id: change.by.actor_id,
      revoked_by_actor_role: change.by.actor_role,
      revocation_reason: change.reason,
      ...(change.supersededBy !== undefined ? { superseded_by: change.supersededBy } : {}),
    })
    .where('id', '=', change.id)
    .where('revoked_at', 'is', null)
    .returningAll()
    .executeTakeFirst();
  return row ? toGrant(row) : undefined;
}

/** The fields that say which grant a request asks for (its expiry and rationale aside). */
export interface GrantSubject {
  tenantId: string;
  agentId: string;
  toolId: string;
  scope: GrantScope;
  scopeRef: string;
}

/**
 * Serialises grant creation for one subject until the transaction ends, so that two identical
 * requests arriving together find each other instead of both inserting.
 */
export async function lockGrantSubject(trx: BeforeChain, subject: GrantSubject): Promise<void> {
  const key = JSON.stringify([
    'grant',
    subject.tenantId,
    subject.agentId,
    subject.toolId,
    subject.scope,
    subject.scopeRef,
  ]);
  await sql`select pg_advisory_xact_lock(hashtextextended(${key}, 0))`.execute(trx);
}

/** The subject's grants that are neither revoked nor expired at `now`, newest first. */
export async function findLiveGrantsOf(trx: Transaction<DB>, subject: GrantSubject, now: Date): Promise<Grant[]> {
  const rows = await trx
    .selectFrom('grants')
    .selectAll()
    .where('tenant_id', '=', subject.tenantId)
    .where('agent_id', '=', subject.agentId)
    .where('tool_id', '=', subject.toolId)
    .where('scope', '=', subject.scope)
    .where('scope_ref', '=', subject.scopeRef)
    .where('revoked_at', 'is', null)
    .where('expires_at', '>', now)
    .orderBy('granted_at', 'desc')
    .execute();
  return rows.map(toGrant);
}

/** Locks a grant for the rest of the transaction (renewal reads, then ends, the old grant). */
export async function lockGrant(trx: BeforeChain, id: string): Promise<Grant | undefined> {
  const row = await trx.selectFrom('grants').selectAll().where('id', '=', id).forUpdate().executeTakeFirst();
  return row ? toGrant(row) : undefined;
}

/** One grant by id, whatever its standing. */
export async function findGrant(db: Kysely<DB>, id: string): Promise<Grant | undefined> {
  const row = await db.selectFrom('grants').selectAll().where('id', '=', id).executeTakeFirst();
  return row ? toGrant(row) : undefined;
}

/** One resolution's question: the grants of (tenant, agent, tool) that could apply in `context`. */
export interface GrantCandidateQuery {
  tenantId: string;
  agentId: string;
  toolId: string;
  context: RunContext;
}

/**
 * The grants of (tenant, agent, tool) whose scope_ref matches the run context: the resolver's
 * candidates, for many resolutions in one indexed query (one probe per scope and question on
 * `grants_resolution`). The answer for each question is in the question's position.
 */
export async function findGrantCandidates(db: Kysely<DB>, queries: GrantCandidateQuery[]): Promise<Grant[][]> {
  const probes = queries.flatMap((query, ord) =>
    GRANT_SCOPES.flatMap((scope) => {
      const ref = query.context[GRANT_SCOPE_CONTEXT_KEY[scope]];
      return ref === undefined ? [] : [{ ord, query, scope, ref }];
    }),
  );
  const answers: Grant[][] = queries.map(() => []);
  if (probes.length === 0) return answers;
  const rows = await sql<Selectable<GrantTable> & { ord: number }>`
    select p.ord, g.* from unnest(
      ${probes.map((p) => p.ord)}::int[],
      ${probes.map((p) => p.query.tenantId)}::text[],
      ${probes.map((p) => p.query.agentId)}::text[],
      ${probes.map((p) => p.query.toolId)}::text[],
      ${probes.map((p) => p.scope)}::text[],
      ${probes.map((p) => p.ref)}::text[]
    ) as p(ord, tenant_id, agent_id, tool_id, scope, scope_ref)
    join grants g on g.tenant_id = p.tenant_id and g.agent_id = p.agent_id and g.tool_id = p.tool_id
      and g.scope = p.scope and g.scope_ref = p.scope_ref
    -- The key lists keep the probes on grants_resolution, however many rows the planner guesses.
    where g.tenant_id = any(${[...new Set(queries.map((q) => q.tenantId))]}::text[])
      and g.agent_id = any(${[...new Set(queries.map((q) => q.agentId))]}::text[])
      and g.tool_id = any(${[...new Set(queries.map((q) => q.toolId))]}::text[])`.execute(db);
  for (const { ord, ...row } of rows.rows) answers[ord]!.push(toGrant(row));
  return answers;
}

/** Filters of `GET /grants`; `status` is judged at `now`, as `grantStatus` would. */
export interface GrantQuery {
  tenantId?: string | undefined;
  agentId?: string | undefined;
  toolId?: string | undefined;
  scope?: GrantScope | undefined;
  scopeRef?: string | undefined;
  status?: GrantStatus | undefined;
  /** The instant `status` is judged at. */
  now: Date;
  after?: { grantedAt: Date; id: string } | undefined;
  limit: number;
}

/** Newest first, one page; `next` continues the listing when more remain. */
export async function listGrants(
  db: Kysely<DB>,
  query: GrantQuery,
): Promise<{ items: Grant[]; next: { grantedAt: Date; id: string } | null }> {
  let q = db.selectFrom('grants').selectAll();
  if (query.tenantId !== undefined) q = q.where('tenant_id', '=', query.tenantId);
  if (query.agentId !== undefined) q = q.where('agent_id', '=', query.agentId);
  if (query.toolId !== undefined) q = q.where('tool_id', '=', query.toolId);
  if (query.scope !== undefined) q = q.where('scope', '=', query.scope);
  if (query.scopeRef !== undefined) q = q.where('scope_ref', '=', query.scopeRef);
  // The same precedence as grantStatus: revoked first, then expired, else live.
  if (query.status === 'revoked') q = q.where('revoked_at', 'is not', null);
  if (query.status === 'expired') q = q.where('revoked_at', 'is', null).where('expires_at', '<=', query.now);
  if (query.status === 'live') q = q.where('revoked_at', 'is', null).where('expires_at', '>', query.now);
  if (query.after !== undefined) {
    const { grantedAt, id } = query.after;
    q = q.where((eb) =>
      eb.or([eb('granted_at', '<', grantedAt), eb.and([eb('granted_at', '=', grantedAt), eb('id', '<', id)])]),
    );
  }
  const rows = await q
    .orderBy('granted_at', 'desc')
    .orderBy('id', 'desc')
    .limit(query.limit + 1)
    .execute();
  const items = rows.slice(0, query.limit).map(toGrant);
  const last = items[items.length - 1];
  return { items, next: rows.length > query.limit && last ? { grantedAt: last.granted_at, id: last.id } : null };
}

/**
 * Marks grants that lapsed by `now` as having had their expiry recorded, and returns them. Rows
 * another replica's sweeper holds are skipped, and a marked row never matches again, so each
 * expiry is returned — and recorded by the caller in this transaction — exactly once.
 */
export async function claimLapsedGrants(trx: BeforeChain, now: Date, limit: number): Promise<Grant[]> {
  const rows = await trx
    .updateTable('grants')
    .set({ expiry_recorded_at: now })
    .where('id', 'in', (eb) =>
      eb
        .selectFrom('grants')
        .select('id')
        .where('expiry_recorded_at', 'is', null)
        .where('revoked_at', 'is', null)
        .where('expires_at', '<=', now)
        .orderBy('expires_at')
        .limit(limit)
        .forUpdate()
        .skipLocked(),
    )
    .where('expiry_recorded_at', 'is', null)
    .where('revoked_at', 'is', null)
    .returningAll()
    .execute();
  return rows.map(toGrant).sort((a, b) => a.expires_at.getTime() - b.expires_at.getTime());
}

/** A grant row as the domain sees it. */
export function toGrant(row: Selectable<GrantTable>): Grant {
  return {
    id: row.id,
    tenant_id: row.tenant_id,
    agent_id: row.agent_id,
    tool_id: row.tool_id,
    scope: row.scope as GrantScope,
    scope_ref: row.scope_ref,
    capability_modifiers:
      typeof row.capability_modifiers === 'string' ? JSON.parse(row.capability_modifiers) : row.capability_modifiers,
    expires_at: new Date(row.expires_at),
    granted_by: { actor_id: row.granted_by_actor_id, actor_role: row.granted_by_actor_role as OperatorRole },
    rationale: row.rationale,
    granted_at: new Date(row.granted_at),
    revoked_at: row.revoked_at === null ? null : new Date(row.revoked_at),
    revoked_by:
      row.revoked_by_actor_id === null
        ? null
        : { actor_id: row.revoked_by_actor_id, actor_role: row.revoked_by_actor_role as OperatorRole },
    revocation_reason: row.revocation_reason,
    renewed_from: row.renewed_from,
    superseded_by: row.superseded_by,
  };
}
