import { z } from 'zod';
import { TOOL_ID_PATTERN } from '../registry/tool-contract.js';
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

/**
 * An id from a request (tenant, agent, run, tool, event type…): what every id the gateway stores
 * looks like. Anything else — a NUL byte, a space — is invalid input, refused before it reaches
 * the database.
 */
export const identifier = z
  .string()
  .min(1)
  .max(200)
  .regex(/^[A-Za-z0-9][A-Za-z0-9._:@-]*$/, 'letters, digits and . _ : @ - only, starting with a letter or digit');

/** A tool id: lowercase dotted words, such as `web.fetch`. */
export const toolId = z.string().max(200).regex(TOOL_ID_PATTERN, 'must be a tool id such as web.fetch');

/** An agent id (a token's `sub`): no colon, so it is never mistaken for a `family:` entry. */
export const agentId = z
  .string()
  .min(1)
  .max(200)
  .regex(/^[A-Za-z0-9][A-Za-z0-9._@-]*$/, 'must be an agent id such as veritas.fact-checker');
