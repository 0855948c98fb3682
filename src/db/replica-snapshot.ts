import { performance } from 'node:perf_hooks';
import type { Logger } from 'pino';
import type { NotificationListener } from './database.js';

/** What one in-memory copy reads and how it keeps what it read; the copy's owner gives it. */
export interface ReplicaSnapshotSource<Read> {
  /** The copy's name in logs and errors (`grant snapshot`). */
  name: string;
  /** The channel a trigger notifies each new version on. */
  channel: string;
  /** Reads what a copy at `version` lacks (-1: it holds nothing yet). */
  read(version: number): Promise<Read>;
  /** Keeps a read taken at `version`; answers the copy's version now, or undefined to read everything again. */
  keep(read: Read, version: number): number | undefined;
  /** The database's version. */
  readVersion(): Promise<number>;
  /** Before each periodic check. */
  beforeCheck?(): void;
}

export interface ReplicaSnapshotOptions {
  listener: NotificationListener;
  logger: Logger;
  /** How often the version is compared with the database when no notification arrives. */
  pollIntervalMs: number;
  /** A read unanswered for this long is given up; the owner judges a copy older than this stale. */
  maxStalenessMs: number;
  /** Monotonic milliseconds; injectable for tests. */
  clock?: () => number;
}

/**
 * Keeps a copy current: read again on the channel's notifications and every listener reconnect, confirmed by a version
 * check every `pollIntervalMs`. The mechanism of docs/design/replica-snapshots.md; its owner judges staleness.
 */
export class ReplicaSnapshot<Read> {
  private current = -1;
  private confirmedAt = Number.NEGATIVE_INFINITY;
  private reloading: Promise<void> | undefined;
  private reloadAgain = false;
  private checking = false;
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  private failing = false;
  private readonly clock: () => number;

  constructor(
    private readonly source: ReplicaSnapshotSource<Read>,
    private readonly options: ReplicaSnapshotOptions,
  ) {
    this.clock = options.clock ?? (() => performance.now());
  }

  /** Subscribes, loads, and starts the periodic check. A database that is down now is not fatal. */
  async start(): Promise<void> {
    const { listener } = this.options;
    listener.on('connected', this.onListenerConnected);
    await listener.subscribe(this.source.channel, this.onNotification);
    await this.refresh().catch(() => undefined);
    this.timer = setInterval(() => void this.check(), this.options.pollIntervalMs);
    this.timer.unref();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearInterval(this.timer);
    this.options.listener.off('connected', this.onListenerConnected);
    await this.reloading?.catch(() => undefined);
  }

  /** The version the copy holds (-1 before the first read). */
  version(): number {
    return this.current;
  }

  /** Milliseconds since the copy was last confirmed current (Infinity before the first load). */
  ageMs(): number {
    return Math.max(0, this.clock() - this.confirmedAt);
  }

  /**
   * Catches up with the database now; resolves once a read that began after this call finished.
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
      const at = this.current;
      const read = await this.bounded(this.source.read(at));
      const version = this.source.keep(read, at);
      if (version === undefined) {
        this.current = -1;
        this.reloadAgain = true;
        continue;
      }
      this.current = version;
      this.confirm(began);
    } while (this.reloadAgain && !this.stopped);
  }

  private async check(): Promise<void> {
    if (this.stopped || this.checking || this.reloading) return;
    this.checking = true;
    try {
      this.source.beforeCheck?.();
      const began = this.clock();
      const version = await this.bounded(this.source.readVersion());
      if (version === this.current) this.confirm(began);
      else await this.refresh();
    } catch (error) {
      if (!this.failing) {
        this.failing = true;
        this.options.logger.warn({ err: error }, `${this.source.name} cannot reach the database`);
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
        () => reject(new Error(`${this.source.name} read unanswered after ${this.options.maxStalenessMs} ms`)),
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

  // Stamped with the time the read began: the state it saw is at least that recent.
  private confirm(began: number): void {
    if (began > this.confirmedAt) this.confirmedAt = began;
    if (this.failing) {
      this.failing = false;
      this.options.logger.info(`${this.source.name} confirmed again`);
    }
  }

  private readonly onNotification = (payload: string): void => {
    if (this.stopped) return;
    const announced = Number(payload);
    if (Number.isFinite(announced) && announced <= this.current) return;
    this.refresh().catch((error: unknown) => {
      this.options.logger.warn({ err: error }, `${this.source.name} catch-up after notification failed`);
    });
  };

  // Notifications sent while the listener was away are lost: catch up on every (re)connect.
  private readonly onListenerConnected = (): void => {
    if (this.stopped) return;
    this.refresh().catch(() => undefined);
  };
}
