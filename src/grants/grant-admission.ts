import { Counter, type Registry } from 'prom-client';
import type { Database } from '../db/database.js';
import { GroupCommit } from '../db/group-commit.js';
import type { Grant } from './grant.js';
import type { GrantDecision, GrantDenialCode, RunContext } from './grant-resolver.js';
import type { GrantPrefetch, GrantResolveQuery } from './grant-service.js';
import type { GrantSnapshot } from './grant-snapshot.js';
import { recordGrantUsesIf, type GrantUseIf } from './grant-snapshot-repository.js';

/**
 * What a decision from this replica's snapshot assumed: the grants of (tenant, agent, tool) as
 * they stood at `version`, judged at `decidedAt`. The grant-use write records the use only if
 * that still holds.
 */
export interface GrantAssumption {
  agentId: string;
  toolId: string;
  version: number;
  decidedAt: Date;
}

/** The grant stage's answer: exact (from the database) or assumed (from the snapshot). */
export type AdmissionGrantDecision =
  { ok: true; grant: Grant; assumed?: GrantAssumption | undefined } | { ok: false; code: GrantDenialCode };

/** Where the exact answer comes from: the database, as `GrantService` reads it. */
export interface ExactGrants {
  resolve(query: GrantResolveQuery, prefetched?: GrantPrefetch): Promise<GrantDecision>;
  prefetch(query: GrantResolveQuery): GrantPrefetch;
}

/**
 * Grant resolution for the admission pipeline: from this replica's snapshot when it holds a live
 * grant for the call, else from the database. A snapshot that finds nothing is not a denial (a
 * grant created a moment ago elsewhere may not have reached it): only the database refuses.
 */
export class GrantAdmission {
  /** Prefetches this class answered itself, without reading. */
  private readonly unread = new WeakSet<GrantPrefetch>();
  private readonly decisions: Counter<'source'>;

  constructor(
    private readonly snapshot: GrantSnapshot,
    private readonly exact: ExactGrants,
    private readonly now: () => Date,
    registry: Registry,
  ) {
    this.decisions = new Counter({
      name: 'toolgate_grant_decisions_total',
      help: "Grant stage decisions, by where they came from: this replica's snapshot, or the database (the snapshot had no live grant for the call, was stale, or a guard failed)",
      labelNames: ['source'],
      registers: [registry],
    });
  }

  async resolve(query: GrantResolveQuery, prefetched?: GrantPrefetch): Promise<AdmissionGrantDecision> {
    const now = this.now();
    const seen = this.snapshot.resolve(query, contextOf(query), now);
    if (seen.ok) {
      this.decisions.inc({ source: 'snapshot' });
      return {
        ok: true,
        grant: seen.grant,
        assumed: { agentId: query.agentId, toolId: query.toolId, version: seen.version, decidedAt: now },
      };
    }
    return this.resolveFresh(query, prefetched && !this.unread.has(prefetched) ? prefetched : undefined);
  }

  /** The exact answer, from the database (a dry run, or a call whose guard failed). */
  resolveFresh(query: GrantResolveQuery, prefetched?: GrantPrefetch): Promise<AdmissionGrantDecision> {
    this.decisions.inc({ source: 'database' });
    return this.exact.resolve(query, prefetched);
  }

  /** The snapshot's decision for a query now, when it holds a live grant for it; else undefined. */
  assume(query: GrantResolveQuery): { grant: Grant; assumed: GrantAssumption } | undefined {
    const now = this.now();
    const seen = this.snapshot.resolve(query, contextOf(query), now);
    if (!seen.ok) return undefined;
    this.decisions.inc({ source: 'snapshot' });
    return {
      grant: seen.grant,
      assumed: { agentId: query.agentId, toolId: query.toolId, version: seen.version, decidedAt: now },
    };
  }

  /** Whether the snapshot, current, holds no live grant for the call (only the database refuses: see `presumeMissing` of the port). */
  presumeMissing(query: GrantResolveQuery): boolean {
    const seen = this.snapshot.resolve(query, contextOf(query), this.now());
    return !seen.ok && seen.reason === 'miss';
  }

  /** Reads ahead only for a call the snapshot cannot answer now. */
  prefetch(query: GrantResolveQuery): GrantPrefetch {
    if (this.snapshot.resolve(query, contextOf(query), this.now()).ok) {
      const unread: GrantPrefetch = { query, candidates: Promise.resolve(undefined) };
      this.unread.add(unread);
      return unread;
    }
    return this.exact.prefetch(query);
  }
}

function contextOf(query: GrantResolveQuery): RunContext {
  // The tenant is the caller's, from its token: a tenant in the context never widens it.
  return { ...query.context, tenant_id: query.tenantId };
}

/**
 * Records that runs rely on grants (revoking or expiring one then stops them), group-committed:
 * uses recorded at the same moment share one statement. A use decided from the snapshot is
 * recorded only if its assumption still holds; false means decide again from the database.
 */
export class GrantUses {
  private readonly batches: GroupCommit<GrantUseIf, boolean>;
  private readonly guardFailures: Counter;

  constructor(database: Pick<Database, 'hotDeferred'>, registry: Registry) {
    // Made durable by the call's intent record, committed synchronously after them.
    const db = database.hotDeferred;
    this.batches = new GroupCommit((uses) => recordGrantUsesIf(db, uses));
    this.guardFailures = new Counter({
      name: 'toolgate_grant_guard_failures_total',
      help: "Calls admitted from this replica's grant snapshot whose grants had changed by the time their use was written (decided again from the database)",
      registers: [registry],
    });
  }

  async record(use: {
    tenantId: string;
    runId: string;
    grantId: string;
    assumed?: GrantAssumption | undefined;
  }): Promise<boolean> {
    const { assumed } = use;
    const recorded = await this.batches.submit({
      tenant_id: use.tenantId,
      run_id: use.runId,
      grant_id: use.grantId,
      assumed: assumed && {
        agent_id: assumed.agentId,
        tool_id: assumed.toolId,
        since: assumed.version,
        decided_at: assumed.decidedAt,
      },
    });
    if (!recorded && assumed) this.guardFailures.inc();
    return recorded;
  }
}
