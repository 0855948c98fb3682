import type { z } from 'zod';
import { ApiError } from './errors.js';

/** Opaque pagination cursors: base64url JSON, so clients cannot depend on their content. */
export function encodeCursor(position: unknown): string {
  return Buffer.from(JSON.stringify(position)).toString('base64url');
}

export function decodeCursor<T extends z.ZodType>(cursor: string, schema: T): z.infer<T> {
  try {
    const parsed = schema.safeParse(JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8')));
    if (parsed.success) return parsed.data;
  } catch {
    // fall through to the typed error
  }
  throw new ApiError('invalid_request', 'query.cursor: not a cursor this API issued', { field: 'query.cursor' });
}
