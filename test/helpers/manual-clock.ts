import { pino } from 'pino';
import { buildApp } from '../../src/app.js';
import { loadVerificationKeys } from '../../src/auth/jwt-keys.js';
import type { Database } from '../../src/db/database.js';
import { AppClient, testConfig } from './harness.js';

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
export async function startClient(database: Database, clock: ManualClock, env: Record<string, string> = {}): Promise<AppClient> {
  const config = testConfig(env);
  const app = await buildApp({
    config,
    database,
    keys: await loadVerificationKeys(config),
    logger: pino({ level: 'silent' }),
    now: clock.now,
  });
  await app.ready();
  return new AppClient(app);
}
