import type { Kysely } from 'kysely';
import type { Logger } from 'pino';
import type { DB } from '../db/schema.js';
import type { ToolCatalog } from '../registry/tool-catalog.js';
import { isDeprecatedAt } from '../registry/tool-contract.js';
import { grantStamps, listenerKey, policyStamps } from './granted-tools.js';
import type { Listener } from './listener-bus.js';

/** Who a change concerns: everyone (the registry), one tenant (its policy) or one agent (its grants). */
export type ChangeAudience = { everyone: true } | { tenantId: string; agentId?: string };

export interface ToolListChangesOptions {
  catalog: Pick<ToolCatalog, 'revision' | 'all'>;
  db: Kysely<DB>;
  now: () => Date;
  /** How often to look; the registry copy itself is kept fresh about as often. */
  intervalMs: number;
  /** Who listens on this replica: nothing is read from the database for no one. */
  listeners: () => Listener[];
  onChange: (audience: ChangeAudience) => void;
  logger: Pick<Logger, 'warn'>;
}

/**
 * Calls `onChange` when the tools an agent is offered may have changed, naming whom it concerns: a registration or a
 * deprecation taking effect (everyone), a tenant policy (that tenant), an agent's grants given, revoked or lapsed (that
 * agent). Every replica watches, so a listen stream anywhere hears of a change made anywhere, and only its own.
 */
export class ToolListChanges {
  private timer: NodeJS.Timeout | undefined;
  /** The registry revision and deprecations seen last: followed always, it costs no query. */
  private seenRegistry: string | undefined;
  /** Policies by tenant and grants by agent seen last, for those who listen (or are about to). */
  private readonly seenPolicies = new Baselines();
  private readonly seenGrants = new Baselines();
  private checking = false;
  private failing = false;

  constructor(private readonly options: ToolListChangesOptions) {}

  start(): void {
    this.seenRegistry = this.registryStamp();
    this.timer = setInterval(() => void this.check(), this.options.intervalMs);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
  }

  /** Compares what agents are offered with what was seen last, and tells the listeners each difference concerns. */
  async check(): Promise<void> {
    if (this.checking) return;
    this.checking = true;
    try {
      const registry = this.registryStamp();
      if (registry !== this.seenRegistry) this.options.onChange({ everyone: true });
      this.seenRegistry = registry;
      const listeners = this.options.listeners();
      const tenants = [...new Set(listeners.map((who) => who.tenantId))];
      const [policies, grants] = await Promise.all([
        policyStamps(this.options.db, tenants),
        grantStamps(this.options.db, listeners, this.options.now()),
      ]);
      for (const [tenantId, stamp] of policies)
        if (this.seenPolicies.changed(tenantId, stamp)) this.options.onChange({ tenantId });
      for (const who of listeners)
        if (this.seenGrants.changed(listenerKey(who), grants.get(listenerKey(who)) ?? '')) this.options.onChange(who);
      this.seenPolicies.forgetAllBut(new Set(policies.keys()));
      this.seenGrants.forgetAllBut(new Set(grants.keys()));
      this.failing = false;
    } catch (error) {
      if (!this.failing) this.options.logger.warn({ err: error }, 'checking MCP tool lists for changes failed');
      this.failing = true;
    } finally {
      this.checking = false;
    }
  }

  /**
   * Takes what a listener is offered now as its starting point, before its stream is acknowledged: a change after the
   * acknowledgement is then told, however soon it comes.
   */
  async watch(who: Listener): Promise<void> {
    const [policies, grants] = await Promise.all([
      policyStamps(this.options.db, [who.tenantId]),
      grantStamps(this.options.db, [who], this.options.now()),
    ]);
    this.seenPolicies.start(who.tenantId, policies.get(who.tenantId) ?? '');
    this.seenGrants.start(listenerKey(who), grants.get(listenerKey(who)) ?? '');
  }

  private registryStamp(): string {
    const at = this.options.now();
    const deprecated = this.options.catalog.all().filter((tool) => isDeprecatedAt(tool, at)).length;
    return `${this.options.catalog.revision}/${deprecated}`;
  }
}

/** Stamps seen last, by key; one no longer listened for is forgotten at the second look without it. */
class Baselines {
  private readonly stamps = new Map<string, string>();
  private readonly missing = new Set<string>();

  /** Records `stamp`; true when it differs from one seen before (never for a first look). */
  changed(key: string, stamp: string): boolean {
    const seen = this.stamps.get(key);
    this.stamps.set(key, stamp);
    this.missing.delete(key);
    return seen !== undefined && seen !== stamp;
  }

  /** A starting point, unless there is one already (a later look knows better). */
  start(key: string, stamp: string): void {
    if (!this.stamps.has(key)) this.stamps.set(key, stamp);
  }

  forgetAllBut(kept: ReadonlySet<string>): void {
    for (const key of this.stamps.keys()) {
      if (kept.has(key)) continue;
      if (this.missing.has(key)) {
        this.stamps.delete(key);
        this.missing.delete(key);
      } else this.missing.add(key);
    }
  }
}
