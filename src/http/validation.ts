import { z } from 'zod';
import { ApiError } from './errors.js';

/** Parses request input with a zod schema; failures are `400 invalid_request` naming each field. */
export function parseInput<T extends z.ZodType>(schema: T, value: unknown, where: 'body' | 'query' | 'params'): z.infer<T> {
  const parsed = schema.safeParse(value ?? {});
  if (parsed.success) return parsed.data;
  const issues = parsed.error.issues.map((issue) => ({
    field: [where, ...issue.path.map(String)].join('.'),
    message: issue.message,
  }));
  const first = issues[0];
  throw new ApiError('invalid_request', first ? `${first.field}: ${first.message}` : `invalid ${where}`, { issues });
}

/**
 * An id from a request (tenant, agent, run, tool, event type…): what every id the gateway stores
 * looks like. Anything else — a NUL byte, a space — is invalid input, refused before it reaches
 * the database.
 */
export const identifier = z.string().min(1).max(200).regex(/^[A-Za-z0-9][A-Za-z0-9._:@-]*$/, 'letters, digits and . _ : @ - only, starting with a letter or digit');
