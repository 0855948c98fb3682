import { performance } from 'node:perf_hooks';
import type { Logger } from 'pino';
import { Gauge, type Registry } from 'prom-client';
import type { NotificationListener } from '../db/database.js';
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
  private version = -1;
  private confirmedAt = Number.NEGATIVE_INFINITY;
  private reloading: Promise<void> | undefined;
  private reloadAgain = false;
  private checking = false;
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  private failing = false;
  private readonly clock: () => number;

  constructor(private readonly options: KillSwitchSnapshotOptions) {
    this.clock = options.clock ?? (() => performance.now());
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
  async start(): Promise<void> {
    const { listener } = this.options;
    listener.on('connected', this.onListenerConnected);
    await listener.subscribe(KILL_SWITCH_CHANNEL, this.onNotification);
    await this.refresh().catch(() => undefined);
    this.timer = setInterval(() => void this.check(), this.options.pollIntervalMs);
    this.timer.unref();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearInterval(this.timer);
    this.options.listener.off('connected', this.onListenerConnected);
    await this.reloading;
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
    return Math.max(0, this.clock() - this.confirmedAt);
  }

  /** The armed switches as this replica sees them, and the version they came from. */
  state(): { version: number; switches: readonly KillSwitch[]; age_ms: number } {
    return { version: this.version, switches: this.switches, age_ms: this.ageMs() };
  }

  /**
   * Reloads from the database now; resolves once a load that began after this call finished.
   * Rejects when the database cannot be read.
   */
  refresh(): Promise<void> {
    if (this.reloading) {
      this.reloadAgain = true;
      return this.reloading;
    }
    this.reloading = this.reloadUntilSettled().finally(() => {
      this.reloading = undefined;
    });
    return this.reloading;
  }

  private async reloadUntilSettled(): Promise<void> {
    do {
      this.reloadAgain = false;
      const began = this.clock();
      const { version, switches } = await this.bounded(readArmedKillSwitches(this.options.database.control));
      // A slower read can finish after a newer one: never step back to an older version.
      if (version >= this.version) {
        this.version = version;
        this.switches = switches;
      }
      this.confirm(began);
    } while (this.reloadAgain && !this.stopped);
  }

  private async check(): Promise<void> {
    if (this.stopped || this.checking || this.reloading) return;
    this.checking = true;
    try {
      const began = this.clock();
      const version = await this.bounded(readKillSwitchVersion(this.options.database.control));
      if (version === this.version) this.confirm(began);
      else await this.refresh();
    } catch (error) {
      if (!this.failing) {
        this.failing = true;
        this.options.logger.warn({ err: error }, 'kill-switch snapshot cannot reach the database');
      }
    } finally {
      this.checking = false;
    }
  }

  /**
   * Gives up on a read after the staleness bound: a partitioned connection can leave it pending for minutes, stalling
   * every later reload and check. A read answering after that is ignored.
   */
  private bounded<T>(read: Promise<T>): Promise<T> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`kill-switch read unanswered after ${this.options.maxStalenessMs} ms`)),
        this.options.maxStalenessMs,
      );
      timer.unref();
      read.then(
        (value) => {
          clearTimeout(timer);
          resolve(value);
        },
        (error: unknown) => {
          clearTimeout(timer);
          reject(error);
        },
      );
    });
  }

  private confirm(began: number): void {
    if (began > this.confirmedAt) this.confirmedAt = began;
    if (this.failing) {
      this.failing = false;
      this.options.logger.info('kill-switch snapshot confirmed again');
    }
  }

  private readonly onNotification = (payload: string): void => {
    if (this.stopped) return;
    const announced = Number(payload);
    if (Number.isFinite(announced) && announced <= this.version) return;
    this.refresh().catch((error: unknown) => {
      this.options.logger.warn({ err: error }, 'kill-switch reload after notification failed');
    });
  };

  // Notifications sent while the listener was away are lost: reload on every (re)connect.
  private readonly onListenerConnected = (): void => {
    if (this.stopped) return;
    this.refresh().catch(() => undefined);
  };
}
