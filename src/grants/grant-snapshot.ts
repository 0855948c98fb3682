import type { Kysely } from 'kysely';
import type { Logger } from 'pino';
import { Gauge, type Registry } from 'prom-client';
import type { NotificationListener } from '../db/database.js';
import { ReplicaSnapshot } from '../db/replica-snapshot.js';
import type { DB } from '../db/schema.js';
import { GRANT_SCOPE_CONTEXT_KEY, GRANT_SCOPES, type GrantScope } from './grant.js';
import { resolveGrant, type RunContext } from './grant-resolver.js';
import { GRANT_CHANNEL, readGrantChanges, readGrantVersion, type VersionedGrant } from './grant-snapshot-repository.js';

/**
 * What this replica's copy says of one call: the grant that applies and the version it was
 * decided at, or nothing to go by — no live grant in the copy (`miss`: not a denial, the
 * database decides) or a copy not confirmed within its bound (`stale`).
 */
export type SnapshotResolution =
  { ok: true; grant: VersionedGrant; version: number } | { ok: false; reason: 'miss' | 'stale' };

/** What a snapshot is built from, by the composition root. */
export interface GrantSnapshotOptions {
  db: Kysely<DB>;
  listener: NotificationListener;
  registry: Registry;
  logger: Logger;
  /** How often the version is compared with the database when no notification arrives. */
  pollIntervalMs: number;
  /** Older than this, the snapshot answers `stale` and decides nothing. */
  maxStalenessMs: number;
  /** The app's clock: which grants have expired. */
  now: () => Date;
  /** Monotonic milliseconds, for the snapshot's age; injectable for tests. */
  clock?: () => number;
}

/**
 * This replica's copy of the live grants, so the grant stage decides without a read. Never the last word: a stale copy
 * costs round trips, never exactness (docs/design/replica-snapshots.md#grants).
 */
export class GrantSnapshot {
  /** Live grants by (tenant, agent, tool, scope, scope_ref): what a run context can match. */
  private readonly byScope = new Map<string, VersionedGrant[]>();
  private held = 0;
  private readonly copy: ReplicaSnapshot<GrantChanges>;

  constructor(private readonly options: GrantSnapshotOptions) {
    this.copy = new ReplicaSnapshot(
      {
        name: 'grant snapshot',
        channel: GRANT_CHANNEL,
        // Versions follow commit order, so the changes after ours are all there is to read.
        read: (version) => readGrantChanges(options.db, version < 0 ? { now: options.now() } : { since: version }),
        keep: (read, version) => this.keep(read, version),
        readVersion: () => readGrantVersion(options.db),
        beforeCheck: () => this.prune(options.now()),
      },
      options,
    );
    const age: Gauge = new Gauge({
      name: 'toolgate_grant_snapshot_age_seconds',
      help: 'Seconds since this replica last confirmed its grant snapshot against the database (+Inf before the first)',
      registers: [options.registry],
      collect: () => age.set(this.ageMs() / 1000),
    });
    const size: Gauge = new Gauge({
      name: 'toolgate_grant_snapshot_grants',
      help: "Grants neither revoked nor expired in this replica's snapshot",
      registers: [options.registry],
      collect: () => size.set(this.held),
    });
  }

  /** Subscribes, loads, and starts the periodic check. A database that is down now is not fatal. */
  start(): Promise<void> {
    return this.copy.start();
  }

  stop(): Promise<void> {
    return this.copy.stop();
  }

  /** The grant this copy would resolve for (tenant, agent, tool) in `context` at `now`. */
  resolve(
    subject: { tenantId: string; agentId: string; toolId: string },
    context: RunContext,
    now: Date,
  ): SnapshotResolution {
    if (this.ageMs() > this.options.maxStalenessMs) return { ok: false, reason: 'stale' };
    const grants = GRANT_SCOPES.flatMap((scope) => {
      const ref = context[GRANT_SCOPE_CONTEXT_KEY[scope]];
      return ref === undefined
        ? []
        : (this.byScope.get(scopeKey(subject.tenantId, subject.agentId, subject.toolId, scope, ref)) ?? []);
    });
    const decided = resolveGrant(grants, context, now);
    return decided.ok
      ? { ok: true, grant: decided.grant, version: this.copy.version() }
      : { ok: false, reason: 'miss' };
  }

  /** Milliseconds since the snapshot was last confirmed current (Infinity before the first load). */
  ageMs(): number {
    return this.copy.ageMs();
  }

  /** The version this replica has caught up with, the grants it holds, and its age. */
  state(): { version: number; grants: number; age_ms: number } {
    return { version: this.copy.version(), grants: this.held, age_ms: this.ageMs() };
  }

  /**
   * Catches up with the database now; resolves once a read that began after this call finished.
   * Rejects when the database cannot be read.
   */
  refresh(): Promise<void> {
    return this.copy.refresh();
  }

  /** Keeps a read taken at `version`: all the grants when the copy held none, else the changes since. */
  private keep(read: GrantChanges, version: number): number | undefined {
    // The database went back (restored from a backup): start again from what it holds.
    if (read.version < version) return undefined;
    if (version < 0) this.replaceAll(read.grants);
    else for (const grant of read.grants) this.apply(grant);
    return Math.max(version, read.version);
  }

  private replaceAll(grants: readonly VersionedGrant[]): void {
    this.byScope.clear();
    this.held = 0;
    for (const grant of grants) this.apply(grant);
  }

  /** One grant as it now stands: added or replaced when live, dropped when revoked. */
  private apply(grant: VersionedGrant): void {
    const key = scopeKey(grant.tenant_id, grant.agent_id, grant.tool_id, grant.scope, grant.scope_ref);
    const before = this.byScope.get(key) ?? [];
    const others = before.filter((held) => held.id !== grant.id);
    const kept = grant.revoked_at === null ? [...others, grant] : others;
    this.held += kept.length - before.length;
    if (kept.length > 0) this.byScope.set(key, kept);
    else this.byScope.delete(key);
  }

  /** Drops grants expired by `now`: a grant absent here is decided from the database, never refused. */
  private prune(now: Date): void {
    for (const [key, grants] of this.byScope) {
      const kept = grants.filter((grant) => grant.expires_at.getTime() > now.getTime());
      if (kept.length === grants.length) continue;
      this.held -= grants.length - kept.length;
      if (kept.length > 0) this.byScope.set(key, kept);
      else this.byScope.delete(key);
    }
  }
}

/** A read: the version, and every live grant or the grants changed since the copy's version. */
type GrantChanges = { version: number; grants: VersionedGrant[] };

function scopeKey(tenantId: string, agentId: string, toolId: string, scope: GrantScope, ref: string): string {
  return JSON.stringify([tenantId, agentId, toolId, scope, ref]);
}
