/**
 * True when an error means the database could not be reached or dropped the connection,
 * as opposed to a query that the database refused. Such faults fail closed as
 * `503 gateway_unavailable`.
 */
export function isDatabaseUnavailable(error: unknown): boolean {
  if (!(error instanceof Error)) return false;
  const code = (error as { code?: unknown }).code;
  if (typeof code === 'string') {
    // Node socket errors and PostgreSQL classes 08 (connection), 57P (operator intervention), 53 (resources).
    if (['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND', 'EHOSTUNREACH', 'EAI_AGAIN'].includes(code))
      return true;
    // 57014: a statement cancelled by statement_timeout (an overloaded or wedged server).
    if (/^(08|57P|53)/.test(code) || code === '57014') return true;
  }
  return /Connection terminated|timeout exceeded when trying to connect|Client has encountered a connection error|Connection ended unexpectedly|Query read timeout|PGlite is closed/i.test(
    error.message,
  );
}

/**
 * A PostgreSQL class 22 error, the data, not the database, was at fault (a NUL byte, an impossible
 * number…), or class 54, a value past one of its limits (an index row larger than a btree page
 * takes): retrying the same values fails the same way.
 */
export function isDataException(error: unknown): boolean {
  const code = (error as { code?: unknown } | null | undefined)?.code;
  return typeof code === 'string' && /^(22|54)[0-9A-Z]{3}$/.test(code);
}

/**
 * An error PostgreSQL raised over the values one statement carried, not over its connection: a data
 * exception or a limit (`isDataException`), an integrity constraint (class 23: a check, a unique key)
 * or a cardinality violation (21000: two rows of one statement on the same key). A batch that met one
 * may succeed without some of its members; connection and resource faults (08, 53, 57) are never one.
 */
export function isRecordFault(error: unknown): boolean {
  const code = (error as { code?: unknown } | null | undefined)?.code;
  return isDataException(error) || (typeof code === 'string' && /^(21|23)[0-9A-Z]{3}$/.test(code));
}
