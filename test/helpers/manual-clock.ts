import type { Database } from '../../src/db/database.js';
import { AppClient } from './harness.js';

/** A clock tests move by hand: what `buildApp({ now })` and the services read as the time. */
export class ManualClock {
  private current: Date;

  constructor(start: string | Date) {
    this.current = new Date(start);
  }

  readonly now = (): Date => new Date(this.current);

  set(at: string | Date): void {
    this.current = new Date(at);
  }

  advance(ms: number): void {
    this.current = new Date(this.current.getTime() + ms);
  }
}

/** An app on the given database whose services read time from `clock`. */
export function startClient(
  database: Database,
  clock: ManualClock,
  env: Record<string, string> = {},
): Promise<AppClient> {
  return AppClient.start(database, env, { now: clock.now });
}
