import { Ajv2020, type ValidateFunction } from 'ajv/dist/2020.js';
import addFormatsModule from 'ajv-formats';
import { RE2JS } from 're2js';
import type { JsonSchema } from './tool-contract.js';

const addFormats = addFormatsModule as unknown as (ajv: Ajv2020) => Ajv2020;

/** A tool's compiled input and output validators. */
export interface ToolValidators {
  input: ValidateFunction;
  output: ValidateFunction;
}

/** Limits on a tool schema's shape: compiling costs ~0.3 ms per subschema and recurses per level. */
export const MAX_SCHEMA_NODES = 1_000;
export const MAX_SCHEMA_DEPTH = 64;

/**
 * Rewrites ECMAScript escapes RE2 spells differently (`\uXXXX`, `\u{X…}`) into RE2's `\x{…}`.
 * Escapes are read in pairs, so an escaped backslash followed by `u` is left alone.
 */
function toRe2Syntax(pattern: string): string {
  return pattern.replace(/\\(?:u([0-9A-Fa-f]{4})|u\{([0-9A-Fa-f]{1,6})\}|[\s\S])/g, (escape, hex4?: string, hexN?: string) =>
    hex4 !== undefined || hexN !== undefined ? `\\x{${hex4 ?? hexN}}` : escape,
  );
}

/**
 * The `pattern` / `patternProperties` engine: RE2 (re2js), which matches in time linear in the
 * input. With JavaScript's backtracking engine, a pattern such as `^(a+)+$` and thirty characters
 * of agent input would hold the event loop for seconds. RE2 has no lookaround and no
 * backreferences: a schema using them is refused at registration with the pattern named.
 */
const linearRegExp = Object.assign(
  (pattern: string): { test: (input: string) => boolean } => {
    try {
      return RE2JS.compile(toRe2Syntax(pattern));
    } catch (error) {
      throw new Error(
        `pattern ${JSON.stringify(pattern)} is not supported (${(error as Error).message}); patterns are matched by RE2, in linear time: no lookaround or backreferences`,
      );
    }
  },
  { code: 'RE2JS.compile' },
);

/**
 * An ajv instance for tool schemas (JSON Schema 2020-12). Unknown keywords are tolerated, as the
 * standard says; `addUsedSchema: false` keeps each schema's `$id` out of the shared registry, so two
 * tools may reuse an `$id` without colliding. Nothing is ever fetched: an unresolved remote `$ref`
 * fails compilation. Patterns run on RE2 (see `linearRegExp`).
 */
export function createSchemaCompiler(): Ajv2020 {
  const ajv = new Ajv2020({
    strict: false,
    allErrors: true,
    addUsedSchema: false,
    validateSchema: true,
    code: { regExp: linearRegExp },
  });
  addFormats(ajv);
  return ajv;
}

export type SchemaCompilation = { ok: true; validate: ValidateFunction } | { ok: false; message: string };

/** Compiles one schema; a schema that is not valid JSON Schema 2020-12 is a value, not a throw. */
export function compileSchema(ajv: Ajv2020, schema: JsonSchema): SchemaCompilation {
  try {
    return { ok: true, validate: ajv.compile(schema) };
  } catch (error) {
    return { ok: false, message: (error as Error).message };
  }
}

// One shared instance for registration checks; each checked schema is dropped from its cache
// afterwards, since ajv remembers every schema object it compiles.
const checker = createSchemaCompiler();

/** Why a schema is too large or deep to compile, or undefined; counts objects and arrays. */
function shapeProblem(schema: JsonSchema): string | undefined {
  let nodes = 0;
  const pending: Array<{ value: unknown; depth: number }> = [{ value: schema, depth: 1 }];
  while (pending.length > 0) {
    const { value, depth } = pending.pop()!;
    if (typeof value !== 'object' || value === null) continue;
    if (depth > MAX_SCHEMA_DEPTH) return `nested deeper than ${MAX_SCHEMA_DEPTH} levels of objects and arrays`;
    if (++nodes > MAX_SCHEMA_NODES) return `more than ${MAX_SCHEMA_NODES} objects and arrays`;
    for (const child of Object.values(value)) pending.push({ value: child, depth: depth + 1 });
  }
  return undefined;
}

/** Why a schema is not a valid JSON Schema 2020-12 this gateway accepts, or undefined when it is. */
export function schemaProblem(schema: JsonSchema): string | undefined {
  const tooBig = shapeProblem(schema);
  if (tooBig) return tooBig;
  const result = compileSchema(checker, schema);
  if (typeof schema === 'object') checker.removeSchema(schema);
  return result.ok ? undefined : result.message;
}

/**
 * A validator that refuses everything: used when a stored schema no longer compiles (a newer ajv,
 * say), so that a call fails closed instead of skipping validation.
 */
export function refusingValidator(reason: string): ValidateFunction {
  const validate = ((_data: unknown) => {
    validate.errors = [{ instancePath: '', schemaPath: '#', keyword: 'schema', params: {}, message: reason }];
    return false;
  }) as ValidateFunction;
  validate.errors = null;
  return validate;
}
