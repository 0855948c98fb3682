import { OPTIONAL_FIELDS } from '../../src/audit/audit-event.js';

/** Every optional field of an audit record, null: the start of a record a test writes as an older gateway did. */
export const NO_OPTIONAL_FIELDS = Object.fromEntries(OPTIONAL_FIELDS.map((field) => [field, null])) as Record<
  (typeof OPTIONAL_FIELDS)[number],
  null
>;
