import { z } from 'zod';

// The fields a caller names that end up in indexed or bounded columns (audit, runs, grants…), bounded the same way at
// every door: REST, MCP `tools/call`, hand-offs, the CLI. A value past them would fail the statement it joins, and a
// batch with it (docs/operations.md#input-bounds).

/** Tool ids are at most this long (SPEC §12.1); registration refuses longer ones too. */
export const MAX_TOOL_ID_LENGTH = 128;
/** Ids of runs, tenants, agents, sessions…: ASCII, so this many characters are as many bytes. */
export const MAX_IDENTIFIER_LENGTH = 200;
/** A version, or a range of versions, in a call. */
export const MAX_VERSION_LENGTH = 100;
/** A run's `context`: this many keys, each value this long as JSON. */
export const MAX_CONTEXT_KEYS = 64;
export const MAX_CONTEXT_VALUE_LENGTH = 1000;
export const MAX_CONTEXT_KEY_LENGTH = 100;

/**
 * An id from a request (tenant, agent, run, tool, event type…): what every id the gateway stores
 * looks like. Anything else — a NUL byte, a space — is invalid input, refused before it reaches
 * the database.
 */
export const identifier = z
  .string()
  .min(1)
  .max(MAX_IDENTIFIER_LENGTH)
  .regex(/^[A-Za-z0-9][A-Za-z0-9._:@-]*$/, 'letters, digits and . _ : @ - only, starting with a letter or digit');

/** Tool ids: dotted lower-case names such as `web.fetch` or `get_scf_control`. */
export const TOOL_ID_PATTERN = /^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$/;

/** A tool id: lowercase dotted words, such as `web.fetch`, as the registry takes them. */
export const toolId = z
  .string()
  .min(1)
  .max(MAX_TOOL_ID_LENGTH)
  .regex(TOOL_ID_PATTERN, 'must be a tool id such as web.fetch');

/** An agent id (a token's `sub`): no colon, so it is never mistaken for a `family:` entry. */
export const agentId = z
  .string()
  .min(1)
  .max(MAX_IDENTIFIER_LENGTH)
  .regex(/^[A-Za-z0-9][A-Za-z0-9._@-]*$/, 'must be an agent id such as veritas.fact-checker');

/** A version or a range a call asks for (`1.2.0`, `^1.2`, `>=1 <2`): printable ASCII. */
export const versionRange = z
  .string()
  .min(1)
  .max(MAX_VERSION_LENGTH)
  .regex(/^[\x20-\x7E]+$/, 'must be a version or a range such as ^1.2');

/** A context key, as a tool's `required_context` names one. */
export const contextKey = z
  .string()
  .max(MAX_CONTEXT_KEY_LENGTH)
  .regex(/^[A-Za-z_][A-Za-z0-9_.-]*$/, 'must be a context key such as tenant_id');

/** A run's `context`: a few keys as tools name them, each value short (its strings reach audit columns). */
export const runContext = z
  .record(contextKey, z.unknown())
  .refine((context) => Object.keys(context).length <= MAX_CONTEXT_KEYS, {
    message: `must have at most ${MAX_CONTEXT_KEYS} keys`,
    abort: true,
  })
  .superRefine((context, ctx) => {
    const problem = contextValueProblem(context);
    if (problem) ctx.addIssue({ code: 'custom', path: [problem.key], message: problem.message });
  });

/** The first value of a run's `context` longer than its bound as JSON: what a JSON Schema cannot measure. */
export function contextValueProblem(context: Record<string, unknown>): { key: string; message: string } | undefined {
  for (const [key, value] of Object.entries(context)) {
    const json = JSON.stringify(value);
    if (json === undefined || json.length > MAX_CONTEXT_VALUE_LENGTH)
      return { key, message: `must be a JSON value of at most ${MAX_CONTEXT_VALUE_LENGTH} characters` };
  }
  return undefined;
}
