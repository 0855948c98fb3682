import { createHash } from 'node:crypto';
import stringify from 'safe-stable-stringify';
import { claimKey, completeKey, findKey, releaseKey, takeOverKey, type KeyOwner } from './idempotency-repository.js';
import type { Database } from '../db/database.js';

/** How long a key is kept at least; the retention sweep deletes it after. */
export const IDEMPOTENCY_KEY_TTL_MS = 24 * 3600_000;
/** A claim this old whose request never answered is taken to be abandoned (its replica died). */
const ABANDONED_AFTER_MS = 60_000;
/** How long a retry waits for the first request with its key to answer. */
const WAIT_FOR_FIRST_MS = 25_000;
const POLL_MS = 50;

/** What a request carrying an `Idempotency-Key` is to do. */
export type KeyVerdict =
  { kind: 'claimed' } | { kind: 'replay'; statusCode: number; body: string } | { kind: 'reused' } | { kind: 'busy' };

/** A request as its key compares it: the same key with another fingerprint is another request. */
export function requestFingerprint(method: string, url: string, body: unknown): string {
  return createHash('sha256')
    .update(stringify([method.toUpperCase(), url, body ?? null]) ?? '')
    .digest('hex');
}

/**
 * Idempotency keys (the IETF `Idempotency-Key` draft) for creating routes, kept in PostgreSQL so
 * that every replica answers a retry the same way: the first request claims the key, its 2xx
 * answer is kept and replayed; a refusal or failure gives the key up, so a retry runs again.
 */
export class IdempotencyKeys {
  constructor(private readonly deps: { database: Database; now: () => Date; sleep?: (ms: number) => Promise<void> }) {}

  async begin(owner: KeyOwner, key: string, fingerprint: string): Promise<KeyVerdict> {
    const { now } = this.deps;
    const db = this.deps.database.control;
    const sleep = this.deps.sleep ?? ((ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms)));
    const giveUpAt = Date.now() + WAIT_FOR_FIRST_MS;
    for (;;) {
      if (await claimKey(db, owner, key, fingerprint, now())) return { kind: 'claimed' };
      const stored = await findKey(db, owner, key);
      if (!stored) continue; // given up between the two statements: claim it again
      if (stored.fingerprint !== fingerprint) return { kind: 'reused' };
      if (stored.status_code !== null)
        return { kind: 'replay', statusCode: stored.status_code, body: stored.response ?? '' };
      const claimedAt = new Date(stored.created_at);
      if (
        now().getTime() - claimedAt.getTime() > ABANDONED_AFTER_MS &&
        (await takeOverKey(db, owner, key, claimedAt, now()))
      ) {
        return { kind: 'claimed' };
      }
      if (Date.now() > giveUpAt) return { kind: 'busy' };
      await sleep(POLL_MS);
    }
  }

  /** Keeps a 2xx answer for replay; any other answer gives the key up. */
  async finish(owner: KeyOwner, key: string, answer: { statusCode: number; body: string }): Promise<void> {
    if (answer.statusCode >= 200 && answer.statusCode < 300)
      await completeKey(this.deps.database.control, owner, key, answer, this.deps.now());
    else await releaseKey(this.deps.database.control, owner, key);
  }
}
