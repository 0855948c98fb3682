import type { Kysely, Transaction } from 'kysely';
import type { DB } from './schema.js';

declare const chainHeld: unique symbol;

/**
 * A transaction that holds the audit chain head. Runs, approvals, hand-offs and a budget change
 * lock only under it, so they always come after it: docs/design/lock-order.md.
 */
export type ChainHeld = Transaction<DB> & { readonly [chainHeld]: true };

/** A transaction that does not hold the chain head yet: where a grant or kill switch (the cause) is locked. */
export type BeforeChain = Transaction<DB> & { readonly [chainHeld]?: never };

/** Takes the audit chain head (again, harmlessly, if held): after the cause's lock, before any run's. */
export async function holdAuditChain(trx: Transaction<DB>): Promise<ChainHeld> {
  await trx.selectFrom('audit_chain_head').select('seq').where('id', '=', 1).forUpdate().execute();
  return trx as ChainHeld;
}

/** A transaction that changes runs, approvals, hand-offs or budgets, holding the chain head from its start. */
export function changeInLockOrder<T>(db: Kysely<DB>, change: (trx: ChainHeld) => Promise<T>): Promise<T> {
  return db.transaction().execute(async (trx) => change(await holdAuditChain(trx)));
}
