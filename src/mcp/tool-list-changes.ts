import { sql, type Kysely } from 'kysely';
import type { Logger } from 'pino';
import type { DB } from '../db/schema.js';
import type { ToolCatalog } from '../registry/tool-catalog.js';
import { isDeprecatedAt } from '../registry/tool-contract.js';

export interface ToolListChangesOptions {
  catalog: Pick<ToolCatalog, 'revision' | 'all'>;
  db: Kysely<DB>;
  now: () => Date;
  /** How often to look; the registry copy itself is kept fresh about as often. */
  intervalMs: number;
  /** Whether anyone listens: nothing is read from the database otherwise. */
  listening: () => boolean;
  onChange: () => void;
  logger: Pick<Logger, 'warn'>;
}

/**
 * Calls `onChange` when the tools an agent is offered may have changed (a registration, a deprecation taking effect, a
 * tenant policy). Every replica watches, so a listen stream anywhere hears of a change made anywhere.
 */
export class ToolListChanges {
  private timer: NodeJS.Timeout | undefined;
  /** The registry revision and deprecations seen last: followed always, it costs no query. */
  private seenRegistry: string | undefined;
  /** The tenant policies seen last: read only while someone listens. */
  private seenPolicies: string | undefined;
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

  /** Compares what agents are offered with what was seen last, and tells the listeners of a difference. */
  async check(): Promise<void> {
    if (this.checking) return;
    this.checking = true;
    try {
      const registry = this.registryStamp();
      let changed = registry !== this.seenRegistry;
      this.seenRegistry = registry;
      if (this.options.listening()) {
        const policies = await this.policiesStamp();
        changed ||= this.seenPolicies !== undefined && policies !== this.seenPolicies;
        this.seenPolicies = policies;
      } else {
        // Policy changes while no one listens concern no one: the next listener starts from then.
        this.seenPolicies = undefined;
      }
      if (changed) this.options.onChange();
      this.failing = false;
    } catch (error) {
      if (!this.failing) this.options.logger.warn({ err: error }, 'checking MCP tool lists for changes failed');
      this.failing = true;
    } finally {
      this.checking = false;
    }
  }

  private registryStamp(): string {
    const at = this.options.now();
    const deprecated = this.options.catalog.all().filter((tool) => isDeprecatedAt(tool, at)).length;
    return `${this.options.catalog.revision}/${deprecated}`;
  }

  private async policiesStamp(): Promise<string> {
    const row = await this.options.db
      .selectFrom('tenant_policies')
      .select([sql<string>`count(*)::text`.as('count'), sql<string | null>`max(updated_at)::text`.as('latest')])
      .executeTakeFirstOrThrow();
    return `${row.count}/${row.latest ?? ''}`;
  }
}
