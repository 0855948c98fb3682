import type { z } from 'zod';
import { jsonProblem } from '../db/json-limits.js';
import { ApiError } from './errors.js';

/** Opaque pagination cursors: base64url JSON, so clients cannot depend on their content. */
export function encodeCursor(position: unknown): string {
  return Buffer.from(JSON.stringify(position)).toString('base64url');
}

/**
 * The position a cursor this API issued holds. Anything else — not the exact encoding of JSON
 * the API would write, or holding text no id or timestamp has (a NUL character, a lone
 * surrogate) — is refused here, before it can reach a query.
 */
export function decodeCursor<T extends z.ZodType>(cursor: string, schema: T): z.infer<T> {
  try {
    const position: unknown = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8'));
    if (encodeCursor(position) === cursor && !jsonProblem(position, 'cursor')) {
      const parsed = schema.safeParse(position);
      if (parsed.success) return parsed.data;
    }
  } catch {
    // fall through to the typed error
  }
  throw new ApiError('invalid_request', 'query.cursor: not a cursor this API issued', { field: 'query.cursor' });
}
