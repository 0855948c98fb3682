import type { Logger } from 'pino';
import { Gauge, type Registry } from 'prom-client';
import type { NotificationListener } from '../db/database.js';
import { ReplicaSnapshot } from '../db/replica-snapshot.js';
import { decideKillSwitches, type ExecutionTarget, type KillSwitchDecision } from './kill-switch-decision.js';
import type { KillSwitch } from './kill-switch.js';
import { KILL_SWITCH_CHANNEL, readArmedKillSwitches, readKillSwitchVersion } from './kill-switch-repository.js';
import type { Database } from '../db/database.js';

/** A kill-switch verdict, or a refusal because this replica cannot vouch for its switch state. */
export type SnapshotDecision = KillSwitchDecision | { ok: false; code: 'gateway_unavailable'; age_ms: number };

/** What a snapshot is built from, by the composition root. */
export interface KillSwitchSnapshotOptions {
  database: Database;
  listener: NotificationListener;
  registry: Registry;
  logger: Logger;
  /** How often the version is compared with the database when no notification arrives. */
  pollIntervalMs: number;
  /** Older than this, the snapshot is stale and `decide` fails closed. */
  maxStalenessMs: number;
  /** Monotonic milliseconds; injectable for tests. */
  clock?: () => number;
}

/**
 * This replica's copy of the armed kill switches, so the hot path decides without a query. Not confirmed for
 * `maxStalenessMs`, it fails closed: docs/design/replica-snapshots.md#kill-switches.
 */
export class KillSwitchSnapshot {
  private switches: readonly KillSwitch[] = [];
  private readonly copy: ReplicaSnapshot<{ version: number; switches: readonly KillSwitch[] }>;

  constructor(private readonly options: KillSwitchSnapshotOptions) {
    this.copy = new ReplicaSnapshot(
      {
        name: 'kill-switch snapshot',
        channel: KILL_SWITCH_CHANNEL,
        read: () => readArmedKillSwitches(options.database.control),
        // A slower read can finish after a newer one: never step back to an older version.
        keep: (read, version) => {
          if (read.version < version) return version;
          this.switches = read.switches;
          return read.version;
        },
        readVersion: () => readKillSwitchVersion(options.database.control),
      },
      options,
    );
    const gauge: Gauge = new Gauge({
      name: 'toolgate_kill_switch_snapshot_age_seconds',
      help: 'Seconds since this replica last confirmed its kill-switch snapshot against the database (+Inf before the first)',
      registers: [options.registry],
      collect: () => gauge.set(this.ageMs() / 1000),
    });
    const armed: Gauge = new Gauge({
      name: 'toolgate_kill_switches_armed',
      help: "Kill switches armed in this replica's snapshot",
      registers: [options.registry],
      collect: () => armed.set(this.switches.length),
    });
  }

  /** Subscribes, loads, and starts the periodic check. A database that is down now is not fatal. */
  start(): Promise<void> {
    return this.copy.start();
  }

  stop(): Promise<void> {
    return this.copy.stop();
  }

  /**
   * The safety verdict for one call: `kill_switch_active` when an armed switch matches (the
   * broadest blamed), `gateway_unavailable` when the snapshot is stale, else ok.
   */
  decide(call: ExecutionTarget): SnapshotDecision {
    const age = this.ageMs();
    if (age > this.options.maxStalenessMs) return { ok: false, code: 'gateway_unavailable', age_ms: age };
    return decideKillSwitches(this.switches, call);
  }

  /** For `/ready`. */
  readiness(): { ok: boolean; reason?: string } {
    const age = this.ageMs();
    if (age <= this.options.maxStalenessMs) return { ok: true };
    const seen = Number.isFinite(age) ? `last confirmed ${Math.round(age)} ms ago` : 'never loaded';
    return { ok: false, reason: `kill-switch snapshot is stale (${seen})` };
  }

  /** Milliseconds since the snapshot was last confirmed current (Infinity before the first load). */
  ageMs(): number {
    return this.copy.ageMs();
  }

  /** The armed switches as this replica sees them, and the version they came from. */
  state(): { version: number; switches: readonly KillSwitch[]; age_ms: number } {
    return { version: this.copy.version(), switches: this.switches, age_ms: this.ageMs() };
  }

  /**
   * Reloads from the database now; resolves once a load that began after this call finished.
   * Rejects when the database cannot be read.
   */
  refresh(): Promise<void> {
    return this.copy.refresh();
  }
}
