import { randomBytes } from 'node:crypto';
import type { Transaction } from 'kysely';
import type { AuditLog } from '../audit/audit-log.js';
import { writeAuditEvents } from '../audit/audit-repository.js';
import stringify from 'safe-stable-stringify';
import { GroupCommit } from '../db/group-commit.js';
import { CodedError } from '../errors/coded-error.js';
import type { DB } from '../db/schema.js';
import { checkModifiersWithinTool } from './capability-modifiers.js';
import {
  GRANT_SCOPE_CONTEXT_KEY,
  type CapabilityModifiers,
  type Grant,
  type GrantScope,
  type OperatorActor,
} from './grant.js';
import {
  findGrant,
  findGrantCandidates,
  findLiveGrantsOf,
  insertGrant,
  lockGrantSubject,
  type GrantCandidateQuery,
  listGrants,
  lockGrant,
  revokeGrant,
  type GrantQuery,
} from './grant-repository.js';
import { resolveGrant, type GrantDecision, type RunContext } from './grant-resolver.js';
import { AGENT_FORBIDDEN_CATEGORIES, type ToolFacts, type ToolFactsLookup } from './tool-facts.js';
import type { Database } from '../db/database.js';

/**
 * What else happens in the transaction that ends grants: the runs that relied on them stop
 * (docs/api.md#approvals-hand-offs-and-run-controls, cascades). The runs room provides it; grants know nothing of runs.
 */
export type GrantsEndedHook = (
  trx: Transaction<DB>,
  ended: Grant[],
  cause: { code: 'grant_revoked' | 'grant_expired'; actor: string; traceId?: string | null | undefined },
  at: Date,
) => Promise<void>;

/** What the grants service is built from, by the composition root. */
export interface GrantServiceDeps {
  database: Database;
  audit: AuditLog;
  tools: ToolFactsLookup;
  now: () => Date;
  onGrantsEnded?: GrantsEndedHook | undefined;
}

/** What a grant is resolved for: (tenant, agent, tool) in a run's context. */
export interface GrantResolveQuery {
  tenantId: string;
  agentId: string;
  toolId: string;
  context: Partial<RunContext>;
}

/** The candidates of one query, being read ahead of its `resolve`. */
export interface GrantPrefetch {
  readonly query: GrantResolveQuery;
  readonly candidates: Promise<unknown>;
}

/** Whether two queries read the same candidates: the same subject and the same scope references. */
function sameQuery(a: GrantResolveQuery, b: GrantResolveQuery): boolean {
  return (
    a.tenantId === b.tenantId &&
    a.agentId === b.agentId &&
    a.toolId === b.toolId &&
    Object.values(GRANT_SCOPE_CONTEXT_KEY).every((key) =>
      key === 'tenant_id' ? true : a.context[key] === b.context[key],
    )
  );
}

/** A new grant as asked for; the tenant is already the one the operator may act in. */
export interface CreateGrantRequest {
  actor: OperatorActor;
  tenantId: string;
  agentId: string;
  toolId: string;
  scope: GrantScope;
  scopeRef: string;
  capabilityModifiers: CapabilityModifiers;
  expiresAt: Date;
  rationale: string;
  traceId?: string | undefined;
}

/** A renewal: fresh rationale and expiry for the grant `id`. */
export interface RenewGrantRequest {
  actor: OperatorActor;
  id: string;
  rationale: string;
  expiresAt: Date;
  /** Defaults to the old grant's; checked against the tool as it is now either way. */
  capabilityModifiers?: CapabilityModifiers | undefined;
  traceId?: string | undefined;
}

/** Why a grant change was refused; expected outcomes, not faults. */
export type GrantRefusal = {
  ok: false;
  code:
    | 'invalid_request'
    | 'not_found'
    | 'tool_not_registered'
    | 'tool_category_blocked'
    | 'grant_revoked'
    | 'grant_conflict';
  message: string;
  details?: Record<string, unknown>;
};

/**
 * Grants: the hot-path resolution the admission pipeline calls at every step, and the
 * operator's changes — grant, revoke, renew — each committed together with its audit event.
 */
export class GrantService {
  /** Resolutions asked for while a read is in flight go together in the next one. */
  private readonly candidateReads: GroupCommit<GrantCandidateQuery, Grant[]>;

  constructor(private readonly deps: GrantServiceDeps) {
    this.candidateReads = new GroupCommit((queries) => findGrantCandidates(deps.database.hot, queries));
  }

  /**
   * The grant for one call, or why none, read from PostgreSQL (the stage asks when the replica's copy cannot answer). A
   * revocation after the read is caught when the call records its use of the grant.
   */
  async resolve(query: GrantResolveQuery, prefetched?: GrantPrefetch): Promise<GrantDecision> {
    // The tenant is the caller's, from its token: a tenant in the context never widens it.
    const context: RunContext = { ...query.context, tenant_id: query.tenantId };
    const ahead =
      prefetched && sameQuery(prefetched.query, query) ? (prefetched.candidates as Promise<Grant[]>) : undefined;
    const candidates = await (ahead ?? this.candidateReads.submit({ ...query, context }));
    return resolveGrant(candidates, context, this.deps.now());
  }

  /**
   * Starts the read `resolve` will need for `query`, so that it overlaps other work (the run's
   * claim). The resolution itself waits for `resolve`, at the grant stage, judged at that moment.
   */
  prefetch(query: GrantResolveQuery): GrantPrefetch {
    const candidates = this.candidateReads.submit({
      ...query,
      context: { ...query.context, tenant_id: query.tenantId },
    });
    // A prefetch nobody resolves (the claim found the run taken) must not be an unhandled rejection.
    candidates.catch(() => undefined);
    return { query, candidates };
  }

  /**
   * Grants a tool, or answers the live grant that already says exactly this (`created: false`), so
   * that a script run twice leaves one grant to revoke. A request that differs from a live grant
   * only in expiry or rationale is a `grant_conflict` naming it: renewing is how those change.
   */
  async create(request: CreateGrantRequest): Promise<{ ok: true; created: boolean; grant: Grant } | GrantRefusal> {
    const now = this.deps.now();
    if (request.scope === 'per-tenant' && request.scopeRef !== request.tenantId) {
      return invalid('body.scope_ref', 'a per-tenant grant is scoped to its own tenant id');
    }
    const checked = await this.checkTerms(request, now);
    if (!checked.ok) return checked;
    return this.deps.database.control.transaction().execute(async (trx) => {
      await lockGrantSubject(trx, request);
      const alike = (await findLiveGrantsOf(trx, request, now)).find((live) =>
        sameModifiers(live.capability_modifiers, request.capabilityModifiers),
      );
      if (alike) {
        if (alike.expires_at.getTime() === request.expiresAt.getTime() && alike.rationale === request.rationale) {
          return { ok: true, created: false, grant: alike } as const;
        }
        return {
          ok: false,
          code: 'grant_conflict',
          message: `grant ${alike.id} already gives this; renew it to change its expiry or rationale`,
          details: { grant_id: alike.id, expires_at: alike.expires_at.toISOString() },
        } as const;
      }
      const created = await insertGrant(trx, {
        id: newGrantId(),
        tenant_id: request.tenantId,
        agent_id: request.agentId,
        tool_id: request.toolId,
        scope: request.scope,
        scope_ref: request.scopeRef,
        capability_modifiers: request.capabilityModifiers,
        expires_at: request.expiresAt,
        granted_by: request.actor,
        rationale: request.rationale,
        granted_at: now,
        renewed_from: null,
      });
      await writeAuditEvents(trx, [
        {
          occurredAt: now,
          event: {
            ...grantEvent('grant.created', created, request.actor, checked.tool, request.traceId),
            status: 'granted',
          },
        },
      ]);
      return { ok: true, created: true, grant: created } as const;
    });
  }

  /**
   * Ends a grant at once. Revoking a grant that is already revoked changes and records nothing
   * and returns it as it is.
   */
  async revoke(request: {
    actor: OperatorActor;
    id: string;
    reason: string;
    traceId?: string | undefined;
  }): Promise<{ ok: true; changed: boolean; grant: Grant } | GrantRefusal> {
    if (request.reason.trim().length === 0) return invalid('body.reason', 'must not be blank');
    const at = this.deps.now();
    const revoked = await this.deps.database.control.transaction().execute(async (trx) => {
      const changed = await revokeGrant(trx, { id: request.id, by: request.actor, reason: request.reason, at });
      if (!changed) return undefined;
      await writeAuditEvents(trx, [
        {
          occurredAt: at,
          event: {
            ...grantEvent('grant.revoked', changed, request.actor, undefined, request.traceId),
            status: 'revoked',
            reason_code: 'grant_revoked',
            details: { ...grantDetails(changed), reason: request.reason, cascade_depth: 0 },
          },
        },
      ]);
      await this.deps.onGrantsEnded?.(
        trx,
        [changed],
        { code: 'grant_revoked', actor: `operator:${request.actor.actor_id}`, traceId: request.traceId },
        at,
      );
      return changed;
    });
    if (revoked) return { ok: true, changed: true, grant: revoked };
    const existing = await findGrant(this.deps.database.control, request.id);
    if (!existing) return { ok: false, code: 'not_found', message: `grant ${request.id} not found` };
    return { ok: true, changed: false, grant: existing };
  }

  /**
   * Renewal mints a **new** grant with a fresh rationale and expiry, and ends the old one (it
   * then resolves as revoked, `superseded_by` the new one). A revoked grant cannot be renewed:
   * authority that was pulled is granted again, deliberately, with `POST /grants`.
   */
  async renew(request: RenewGrantRequest): Promise<{ ok: true; grant: Grant; previous: Grant } | GrantRefusal> {
    const now = this.deps.now();
    const old = await findGrant(this.deps.database.control, request.id);
    if (!old) return { ok: false, code: 'not_found', message: `grant ${request.id} not found` };
    if (old.revoked_at !== null) return revokedRefusal(old);
    const modifiers = request.capabilityModifiers ?? old.capability_modifiers;
    const checked = await this.checkTerms(
      {
        toolId: old.tool_id,
        expiresAt: request.expiresAt,
        rationale: request.rationale,
        capabilityModifiers: modifiers,
        actor: request.actor,
        tenantId: old.tenant_id,
        agentId: old.agent_id,
        traceId: request.traceId,
      },
      now,
    );
    if (!checked.ok) return checked;
    return this.deps.database.control.transaction().execute(async (trx) => {
      // Locked, then checked again: of two concurrent renewals only one mints a grant.
      const current = await lockGrant(trx, request.id);
      if (!current) return { ok: false, code: 'not_found', message: `grant ${request.id} not found` } as const;
      if (current.revoked_at !== null) return revokedRefusal(current);
      const grant = await insertGrant(trx, {
        id: newGrantId(),
        tenant_id: current.tenant_id,
        agent_id: current.agent_id,
        tool_id: current.tool_id,
        scope: current.scope,
        scope_ref: current.scope_ref,
        capability_modifiers: modifiers,
        expires_at: request.expiresAt,
        granted_by: request.actor,
        rationale: request.rationale,
        granted_at: now,
        renewed_from: current.id,
      });
      const previous = await revokeGrant(trx, {
        id: current.id,
        by: request.actor,
        reason: `renewed as ${grant.id}`,
        at: now,
        supersededBy: grant.id,
      });
      if (!previous) throw new Error(`grant ${current.id} changed under its row lock`);
      await writeAuditEvents(trx, [
        {
          occurredAt: now,
          event: {
            ...grantEvent('grant.renewed', grant, request.actor, checked.tool, request.traceId),
            status: 'granted',
            details: {
              ...grantDetails(grant),
              renewed_from: previous.id,
              previous_expires_at: previous.expires_at.toISOString(),
            },
          },
        },
      ]);
      return { ok: true, grant, previous } as const;
    });
  }

  get(id: string): Promise<Grant | undefined> {
    return findGrant(this.deps.database.control, id);
  }

  list(query: Omit<GrantQuery, 'now'>): ReturnType<typeof listGrants> {
    return listGrants(this.deps.database.control, { ...query, now: this.deps.now() });
  }

  /** The terms every new grant must meet, renewals included. */
  private async checkTerms(
    request: Pick<
      CreateGrantRequest,
      'toolId' | 'expiresAt' | 'rationale' | 'capabilityModifiers' | 'actor' | 'tenantId' | 'agentId' | 'traceId'
    >,
    now: Date,
  ): Promise<{ ok: true; tool: ToolFacts } | GrantRefusal> {
    if (request.rationale.trim().length === 0) return invalid('body.rationale', 'must not be blank');
    if (request.expiresAt.getTime() <= now.getTime()) return invalid('body.expires_at', 'must be in the future');
    const fresh = this.deps.tools.readiness?.() ?? { ok: true };
    if (!fresh.ok) {
      // A stale or empty copy of the registry must not answer "no such tool".
      throw new CodedError('gateway_unavailable', 'the tool registry cannot be confirmed current on this replica', {
        reason: fresh.reason ?? null,
      });
    }
    const versions = await this.deps.tools.versions(request.toolId);
    const newest = versions[0];
    if (!newest) {
      return {
        ok: false,
        code: 'tool_not_registered',
        message: `tool ${request.toolId} is not registered`,
        details: { tool_id: request.toolId },
      };
    }
    // A grant names a tool, not a version: it is refused only when no version it could cover is
    // one agents may use. The others stay out of reach at every call (an agent's calls resolve
    // among the versions it may use; one it names is refused by the category stage).
    const tool = versions.find((version) => !AGENT_FORBIDDEN_CATEGORIES.has(version.category));
    if (!tool) {
      // An operator's power never transfers to an agent: the attempt is on record.
      await this.deps.audit.append({
        event_type: 'security.category_blocked',
        actor: `operator:${request.actor.actor_id}`,
        tenant_id: request.tenantId,
        agent_id: request.agentId,
        tool_id: newest.id,
        tool_category: newest.category,
        trace_id: request.traceId ?? null,
        status: 'denied',
        reason_code: 'tool_category_blocked',
        details: { attempted: 'grant', actor_role: request.actor.actor_role },
      });
      return {
        ok: false,
        code: 'tool_category_blocked',
        message: `${newest.category} tools are never granted to agents`,
        details: { tool_id: newest.id, category: newest.category },
      };
    }
    // Bounded by the version the grantee's calls run, external calls taken as enabled and its family as unknown:
    // docs/design/tool-resolution.md#a-grants-modifiers.
    const runs = await this.deps.tools.resolve(request.toolId, undefined, {
      as: 'viewer',
      agent: { agentId: request.agentId, family: undefined },
      externalCallEnabled: true,
    });
    const bound = runs.ok ? runs.tool : tool;
    const modifiers = checkModifiersWithinTool(request.capabilityModifiers, bound);
    if (!modifiers.ok) return invalid(modifiers.field, modifiers.message);
    return { ok: true, tool: bound };
  }
}

function newGrantId(): string {
  return `grt_${randomBytes(10).toString('hex')}`;
}

function invalid(field: string, message: string): GrantRefusal {
  return {
    ok: false,
    code: 'invalid_request',
    message: `${field}: ${message}`,
    details: { issues: [{ field, message }] },
  };
}

function revokedRefusal(grant: Grant): GrantRefusal {
  return {
    ok: false,
    code: 'grant_revoked',
    message: `grant ${grant.id} was revoked and cannot be renewed; create a new grant`,
    details: { grant_id: grant.id, superseded_by: grant.superseded_by },
  };
}

function grantDetails(grant: Grant): Record<string, unknown> {
  return {
    grant_id: grant.id,
    scope: grant.scope,
    scope_ref: grant.scope_ref,
    expires_at: grant.expires_at.toISOString(),
    rationale: grant.rationale,
    capability_modifiers: grant.capability_modifiers,
  };
}

function grantEvent(
  type: string,
  grant: Grant,
  actor: OperatorActor,
  tool: ToolFacts | undefined,
  traceId: string | undefined,
) {
  return {
    event_type: type,
    actor: `operator:${actor.actor_id}`,
    tenant_id: grant.tenant_id,
    agent_id: grant.agent_id,
    tool_id: grant.tool_id,
    tool_category: tool?.category ?? null,
    trace_id: traceId ?? null,
    details: { ...grantDetails(grant), actor_role: actor.actor_role },
  };
}

/** Modifiers are the same grant's when they say the same, whatever their key order. */
function sameModifiers(a: CapabilityModifiers, b: CapabilityModifiers): boolean {
  return stringify(a) === stringify(b);
}
