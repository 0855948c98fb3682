import { OPTIONAL_FIELDS } from '../../src/audit/audit-event.js';

/** Every optional field of an audit record, null: the start of a record a test writes as an older gateway did. */
export const NO_OPTIONAL_FIELDS = Object.fromEntries(OPTIONAL_FIELDS.map((field) => [field, null])) as Record<
  (typeof OPTIONAL_FIELDS)[number],
  null
>;

/** A `GET /audit/verify` answer without its `tree` part: what the chain's own checks compare. */
export function chainOf<T extends Record<string, unknown>>(body: T): Omit<T, 'tree'> {
  const { tree: _tree, ...chain } = body;
  return chain;
}
