import type { Logger } from 'pino';
import { waitAtMost } from './wait-at-most.js';

/** What a background task is built from. */
export interface BackgroundTaskOptions {
  /** What the logs call it: "<name> failed; retrying", "<name> works again". */
  name: string;
  /** One round of the work. */
  run: () => Promise<unknown>;
  /** How long after a round ends the next starts; `failing` when the last round threw. */
  intervalMs: (failing: boolean) => number;
  logger: Logger;
}

/**
 * Work a replica repeats against its database in the background — sweeps, lease renewals: one
 * round at a time, each an interval after the last ended. A round that throws is logged once
 * (until a round succeeds again) and retried; the timers never keep the process alive.
 */
export class BackgroundTask {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<unknown> | undefined;
  private stopped = true;
  /** Whether the last round threw. */
  failing = false;

  constructor(private readonly options: BackgroundTaskOptions) {}

  start(): void {
    this.stopped = false;
    this.schedule();
  }

  /**
   * Stops scheduling rounds, and waits for one in progress — at most `CLOSE_STEP_WAIT_MS`: a round
   * a silent database holds goes on unwaited for, until closing the database ends it.
   */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    await waitAtMost(this.running);
  }

  private schedule(): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => {
      this.running = this.options
        .run()
        .then(() => {
          if (this.failing) this.options.logger.info(`${this.options.name} works again`);
          this.failing = false;
        })
        .catch((error: unknown) => {
          // A round cut off by the close (its connection destroyed) is no failure to report.
          if (this.stopped) this.options.logger.debug({ err: error }, `${this.options.name} stopped mid-round`);
          else if (!this.failing) this.options.logger.warn({ err: error }, `${this.options.name} failed; retrying`);
          this.failing = true;
        })
        .finally(() => {
          this.running = undefined;
          this.schedule();
        });
    }, this.options.intervalMs(this.failing));
    this.timer.unref();
  }
}
