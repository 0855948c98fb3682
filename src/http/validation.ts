import { type z } from 'zod';
import { ApiError } from './errors.js';

export { instant, positiveUnits, units } from '../validation/values.js';

/** Parses request input with a zod schema; failures are `400 invalid_request` naming each field. */
export function parseInput<T extends z.ZodType>(
  schema: T,
  value: unknown,
  where: 'body' | 'query' | 'params',
): z.infer<T> {
  const parsed = schema.safeParse(value ?? {});
  if (parsed.success) return parsed.data;
  const issues = parsed.error.issues.map((issue) => ({
    field: [where, ...issue.path.map(String)].join('.'),
    message: issue.message,
  }));
  const first = issues[0];
  throw new ApiError('invalid_request', first ? `${first.field}: ${first.message}` : `invalid ${where}`, { issues });
}

export { agentId, contextKey, identifier, runContext, toolId, versionRange } from '../validation/fields.js';
