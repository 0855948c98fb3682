import type { Logger } from 'pino';
import type { Database } from '../db/database.js';
import { resolveBackendHeaders } from './backend-headers.js';
import { dependencyNodeOf, resolveDependencies, type DependencyResolution } from './dependency-resolution.js';
import { surfaceDeprecations, type DeprecationNotice } from './deprecation-report.js';
import { agentMayUse, type AgentIdentity } from './tool-access.js';
import { AGENT_FORBIDDEN_CATEGORIES, isDeprecatedAt, versionKey, type ToolContract } from './tool-contract.js';
import { REGISTRY_CHANNEL, loadChangesSince, type StoredToolVersion } from './tool-repository.js';
import { compileSchema, createSchemaCompiler, refusingValidator, type ToolValidators } from './tool-schemas.js';
import { newestFirst, pickVersion } from './version-resolution.js';

export type CatalogResolution =
  { ok: true; tool: ToolContract } | { ok: false; code: 'tool_not_registered' | 'tool_version_not_found' };

/** The registry as it stands: every version counts. */
export interface ResolveAsAnyone {
  as: 'anyone';
}

/** What an agent's views show: only the versions it may use exist (`tool_not_registered` when none). */
export interface ResolveAsViewer {
  as: 'viewer';
  agent: AgentIdentity;
  externalCallEnabled: boolean;
}

/**
 * What an agent's call runs: the viewer's version when one matches, else anyone's, for admission to
 * refuse with its own reason. `agent` null: a call by no agent in particular (no allowlist applies).
 * `externalCallEnabled` is asked only when it changes the answer. Why: docs/design/tool-resolution.md.
 */
export interface ResolveAsCaller {
  as: 'caller';
  agent: AgentIdentity | null;
  externalCallEnabled: () => Promise<boolean>;
}

/** Whose lookup `ToolCatalog.resolve` answers. */
export type ResolveAs = ResolveAsAnyone | ResolveAsViewer | ResolveAsCaller;

export interface ToolCatalogOptions {
  database: Pick<Database, 'control' | 'listener'>;
  /** The `TOOLGATE_SECRET_*` snapshot backend headers may name. */
  secrets: Readonly<Record<string, string>>;
  now: () => Date;
  logger: Pick<Logger, 'warn'>;
  /** How often the revision is checked besides notifications; keeps the catalog under a second stale. */
  refreshIntervalMs: number;
}

/**
 * This replica's copy of the registry: lookups are synchronous and never query the database. How it stays current:
 * docs/design/replica-snapshots.md#the-registry.
 */
export class ToolCatalog {
  private byId = new Map<string, readonly ToolContract[]>();
  private sortedIds: readonly string[] = [];
  private readonly compiled = new Map<string, ToolValidators>();
  private readonly ajv = createSchemaCompiler();
  private heldRevision = 0;
  private syncedAt: number | undefined;
  private timer: NodeJS.Timeout | undefined;
  private started = false;
  private closed = false;
  private running: Promise<void> | undefined;
  private queued: Promise<void> | undefined;
  private failing = false;

  constructor(private readonly options: ToolCatalogOptions) {}

  /** The registry revision this copy reflects. */
  get revision(): number {
    return this.heldRevision;
  }

  /** Milliseconds since this copy last confirmed it matches the database (Infinity before the first load). */
  ageMs(): number {
    return this.syncedAt === undefined ? Infinity : performance.now() - this.syncedAt;
  }

  /**
   * Loads the registry, then follows it. A gateway may start while its database is away (it
   * fails closed and recovers by itself): the first load is then retried on every check, and
   * until it succeeds the catalog is empty and not ready.
   */
  async start(): Promise<void> {
    if (this.started) return;
    this.started = true;
    const { listener } = this.options.database;
    listener.on('connected', this.onConnected);
    await listener.subscribe(REGISTRY_CHANNEL, this.onNotification);
    await this.refreshQuietly();
    this.timer = setInterval(() => void this.refreshQuietly(), this.options.refreshIntervalMs);
    this.timer.unref();
  }

  async close(): Promise<void> {
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
    this.options.database.listener.off('connected', this.onConnected);
    await this.queued?.catch(() => undefined);
    await this.running?.catch(() => undefined);
  }

  /**
   * Brings this copy up to the database's revision. Resolves after a load that started after the
   * call, so a caller that just wrote to the registry reads its own write. Concurrent callers
   * share one load.
   */
  refresh(): Promise<void> {
    if (this.queued) return this.queued;
    const previous = this.running ?? Promise.resolve();
    const next = previous
      .catch(() => undefined)
      .then(() => {
        this.queued = undefined;
        const current = this.load();
        this.running = current;
        current
          .finally(() => {
            if (this.running === current) this.running = undefined;
          })
          .catch(() => undefined);
        return current;
      });
    this.queued = next;
    return next;
  }

  /**
   * The version a lookup gets: a range picks the newest matching non-deprecated version, an exact
   * version may name a deprecated one, no range the newest non-deprecated one. `as` says whose
   * lookup it is (`anyone` when omitted); see {@link ResolveAs}.
   */
  resolve(toolId: string, range?: string, who?: ResolveAsAnyone | ResolveAsViewer): CatalogResolution;
  resolve(toolId: string, range: string | undefined, who: ResolveAsCaller): Promise<CatalogResolution>;
  resolve(
    toolId: string,
    range: string | undefined,
    who: ResolveAs = { as: 'anyone' },
  ): CatalogResolution | Promise<CatalogResolution> {
    switch (who.as) {
      case 'anyone':
        return this.pick(this.versions(toolId), range);
      case 'viewer':
        return this.pick(this.usable(who.agent, toolId, who.externalCallEnabled), range);
      case 'caller':
        return this.callerVersion(who.agent, toolId, range, who.externalCallEnabled);
    }
  }

  /** Every registered version of a tool, newest first; empty when the tool is unknown. */
  versions(toolId: string): readonly ToolContract[] {
    return this.byId.get(toolId) ?? [];
  }

  /** Every registered version of every tool, by id, newest version first. */
  all(): ToolContract[] {
    return this.sortedIds.flatMap((id) => this.byId.get(id) ?? []);
  }

  /** The registered tool ids, sorted. */
  toolIds(): readonly string[] {
    return this.sortedIds;
  }

  /**
   * What an agent is offered: per tool, the newest non-deprecated version it may use. External
   * call tools only when the tenant enabled them.
   */
  offeredTo(agent: AgentIdentity, options: { externalCallEnabled: boolean }): ToolContract[] {
    const offered: ToolContract[] = [];
    for (const id of this.sortedIds) {
      const resolved = this.resolve(id, undefined, { as: 'viewer', agent, ...options });
      if (resolved.ok) offered.push(resolved.tool);
    }
    return offered;
  }

  private pick(candidates: readonly ToolContract[], range: string | undefined): CatalogResolution {
    if (candidates.length === 0) return { ok: false, code: 'tool_not_registered' };
    const now = this.options.now();
    const picked = pickVersion(
      candidates.map((tool) => ({ version: tool.version, deprecated: isDeprecatedAt(tool, now), tool })),
      range,
    );
    return picked ? { ok: true, tool: picked.tool } : { ok: false, code: 'tool_version_not_found' };
  }

  /** The versions an agent may use; no agent: those any call in the tenant may (no allowlist applies). */
  private usable(agent: AgentIdentity | null, toolId: string, externalCallEnabled: boolean): ToolContract[] {
    return this.versions(toolId).filter(
      (tool) =>
        (agent === null ? !AGENT_FORBIDDEN_CATEGORIES.has(tool.category) : agentMayUse(tool, agent)) &&
        (tool.category !== 'external_call' || (externalCallEnabled && tool.egress !== null)),
    );
  }

  /** The `caller` lookup: see {@link ResolveAsCaller}. */
  private async callerVersion(
    agent: AgentIdentity | null,
    toolId: string,
    range: string | undefined,
    externalCallEnabled: () => Promise<boolean>,
  ): Promise<CatalogResolution> {
    const anyone = this.pick(this.versions(toolId), range);
    if (!anyone.ok) return anyone;
    // The usual, cheap case: the newest match overall is one the agent may use.
    const mayUse =
      agent === null ? !AGENT_FORBIDDEN_CATEGORIES.has(anyone.tool.category) : agentMayUse(anyone.tool, agent);
    if (anyone.tool.category !== 'external_call' && mayUse) return anyone;
    const pick = (enabled: boolean): ToolContract => {
      const usable = this.pick(this.usable(agent, toolId, enabled), range);
      return usable.ok ? usable.tool : anyone.tool;
    };
    const ifEnabled = pick(true);
    const ifDisabled = pick(false);
    if (ifEnabled === ifDisabled) return { ok: true, tool: ifEnabled };
    return { ok: true, tool: (await externalCallEnabled()) ? ifEnabled : ifDisabled };
  }

  /** The versions a version pulls in through its dependencies, or the first one that cannot be met. */
  dependencies(tool: ToolContract): DependencyResolution {
    const now = this.options.now();
    return resolveDependencies(dependencyNodeOf(tool, now), (toolId) =>
      this.versions(toolId).map((t) => dependencyNodeOf(t, now)),
    );
  }

  /** Deprecations dated within the window, with their replacements and the versions still depending on them. */
  deprecations(window: { from: Date; to: Date }): DeprecationNotice[] {
    return surfaceDeprecations(this.all(), window, this.options.now());
  }

  /** Ready while this copy confirmed it matches the database within `maxAgeMs`. */
  readiness(maxAgeMs = 5_000): { ok: boolean; reason?: string } {
    return this.ageMs() <= maxAgeMs
      ? { ok: true }
      : { ok: false, reason: 'the tool catalog has not been refreshed recently' };
  }

  /** The compiled input and output validators of a version, compiled once per replica. */
  validators(tool: { id: string; version: string }): ToolValidators {
    const key = versionKey(tool.id, tool.version);
    const cached = this.compiled.get(key);
    if (cached) return cached;
    const known = this.byId.get(tool.id)?.find((t) => t.version === tool.version);
    if (!known) {
      const refuse = refusingValidator(`${key} is not in the catalog`);
      return { input: refuse, output: refuse };
    }
    return this.compile(known);
  }

  /** A backend's headers with secrets resolved, for dispatch only. Throws `MissingSecretError`. */
  backendHeaders(tool: { id: string; backend: { headers: Record<string, unknown> } | null }): Record<string, string> {
    return resolveBackendHeaders(tool.id, tool.backend, this.options.secrets);
  }

  private compile(tool: ToolContract): ToolValidators {
    const key = versionKey(tool.id, tool.version);
    const compileOrRefuse = (which: 'input_schema' | 'output_schema') => {
      const result = compileSchema(this.ajv, tool[which]);
      if (result.ok) return result.validate;
      this.options.logger.warn(
        { tool_id: tool.id, version: tool.version, reason: result.message },
        `stored ${which} does not compile`,
      );
      return refusingValidator(`the registered ${which} does not compile`);
    };
    const validators = { input: compileOrRefuse('input_schema'), output: compileOrRefuse('output_schema') };
    this.compiled.set(key, validators);
    return validators;
  }

  private async load(): Promise<void> {
    if (this.closed) return;
    const db = this.options.database.control;
    let { revision, changed } = await loadChangesSince(db, this.heldRevision);
    if (revision < this.heldRevision) {
      // The database went back in time (restored from a backup): start over.
      ({ revision, changed } = await loadChangesSince(db, -1));
      this.byId = new Map();
      this.compiled.clear();
    }
    if (changed.length > 0) this.apply(changed);
    this.heldRevision = revision;
    this.syncedAt = performance.now();
  }

  private apply(changed: StoredToolVersion[]): void {
    const touched = new Map<string, Map<string, ToolContract>>();
    for (const { tool } of changed) {
      let versions = touched.get(tool.id);
      if (!versions) {
        versions = new Map((this.byId.get(tool.id) ?? []).map((t) => [t.version, t]));
        touched.set(tool.id, versions);
      }
      versions.set(tool.version, tool);
    }
    // Replaced, not mutated: arrays handed out earlier stay as they were.
    for (const [id, versions] of touched) this.byId.set(id, newestFirst([...versions.values()]));
    for (const { tool } of changed) if (!this.compiled.has(versionKey(tool.id, tool.version))) this.compile(tool);
    this.sortedIds = [...this.byId.keys()].sort();
  }

  private readonly onNotification = (): void => {
    if (!this.closed) void this.refreshQuietly();
  };

  // Notifications sent while the listener was away are lost: catch up by revision.
  private readonly onConnected = (): void => {
    if (!this.closed) void this.refreshQuietly();
  };

  // Logged once per outage, not on every check.
  private refreshQuietly(): Promise<void> {
    return this.refresh().then(
      () => {
        if (this.failing) this.options.logger.warn({ revision: this.heldRevision }, 'tool catalog refreshed again');
        this.failing = false;
      },
      (error: unknown) => {
        if (!this.failing)
          this.options.logger.warn({ err: error }, 'tool catalog refresh failed; serving the last copy');
        this.failing = true;
      },
    );
  }
}
