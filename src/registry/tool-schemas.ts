import { Ajv2020, type ErrorObject } from 'ajv/dist/2020.js';
import addFormatsModule from 'ajv-formats';
import { RE2JS } from 're2js';
import stringify from 'safe-stable-stringify';
import type { JsonSchema } from './tool-contract.js';

const addFormats = addFormatsModule as unknown as (ajv: Ajv2020) => Ajv2020;

/** A compiled schema: answers whether a value matches, and leaves the reasons in `errors`. */
export interface SchemaValidator {
  (data: unknown): boolean;
  errors?: Array<Pick<ErrorObject, 'instancePath' | 'message'>> | null;
}

/** A tool's compiled input and output validators. */
export interface ToolValidators {
  input: SchemaValidator;
  output: SchemaValidator;
}

/**
 * The most CPU time one value may take to validate: a schema can still branch exponentially in a value's depth (`anyOf`
 * through a recursive `$ref`). CPU, not wall, time: a busy machine must not refuse a legitimate value.
 */
export const VALIDATION_BUDGET_MS = 200;

/** Limits on a tool schema's shape: compiling costs time per subschema and recurses per level. */
export const MAX_SCHEMA_NODES = 1_000;
export const MAX_SCHEMA_DEPTH = 64;

/**
 * Rewrites ECMAScript escapes RE2 spells differently (`\uXXXX`, `\u{X…}`) into RE2's `\x{…}`.
 * Escapes are read in pairs, so an escaped backslash followed by `u` is left alone.
 */
function toRe2Syntax(pattern: string): string {
  return pattern.replace(
    /\\(?:u([0-9A-Fa-f]{4})|u\{([0-9A-Fa-f]{1,6})\}|[\s\S])/g,
    (escape, hex4?: string, hexN?: string) =>
      hex4 !== undefined || hexN !== undefined ? `\\x{${hex4 ?? hexN}}` : escape,
  );
}

/**
 * Patterns run on RE2 (re2js), linear in the input, where a backtracking engine could be held by `^(a+)+$` on a short
 * input. RE2 has no lookaround or backreferences: a schema using them is refused at registration, the pattern named.
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
 * An ajv instance for tool schemas (2020-12): unknown keywords tolerated, `$id`s kept out of the shared registry (tools
 * may reuse one), nothing ever fetched (an unresolved remote `$ref` fails to compile), patterns on RE2.
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
  // ajv compares items pairwise (quadratic in the array's length); a canonical text per item is linear.
  ajv.removeKeyword('uniqueItems');
  ajv.addKeyword({
    keyword: 'uniqueItems',
    type: 'array',
    schemaType: 'boolean',
    validate: hasUniqueItems,
    errors: true,
  });
  ajv.addKeyword({ keyword: BUDGET_KEYWORD, schemaType: 'boolean', validate: withinBudget, errors: false });
  return ajv;
}

function hasUniqueItems(unique: boolean, data: unknown[]): boolean {
  if (!unique) return true;
  const seen = new Set<string>();
  for (const item of data) {
    withinBudget();
    // JSON Schema equality: numbers by value, objects whatever their key order.
    const text = stringify(item) ?? 'undefined';
    if (seen.has(text)) {
      (hasUniqueItems as { errors?: unknown }).errors = [
        { keyword: 'uniqueItems', message: 'must NOT have duplicate items', params: {} },
      ];
      return false;
    }
    seen.add(text);
  }
  return true;
}

/** The keyword placed in every subschema: it counts evaluations and checks the clock now and then. */
const BUDGET_KEYWORD = 'x-toolgate-budget';
const STEPS_PER_CLOCK_CHECK = 256;
let steps = 0;
/**
 * The process's CPU time (µs) past which the validation in progress is cut off; undefined until its first
 * clock check (reading the clock costs a system call, which most validations never need).
 */
let deadline: number | undefined;

function cpuMicros(): number {
  const { user, system } = process.cpuUsage();
  return user + system;
}

class ValidationBudgetExceeded extends Error {}

function withinBudget(): boolean {
  if (++steps >= STEPS_PER_CLOCK_CHECK) {
    steps = 0;
    const now = cpuMicros();
    // Started with its first check: the steps before it are bounded work.
    deadline ??= now + VALIDATION_BUDGET_MS * 1000;
    if (now > deadline) throw new ValidationBudgetExceeded();
  }
  return true;
}

/** Where a JSON Schema (2020-12, or the drafts before it) holds subschemas. */
const ONE_SCHEMA = [
  'additionalProperties',
  'unevaluatedProperties',
  'items',
  'additionalItems',
  'unevaluatedItems',
  'contains',
  'propertyNames',
  'if',
  'then',
  'else',
  'not',
  'contentSchema',
];
const SCHEMA_LISTS = ['allOf', 'anyOf', 'oneOf', 'prefixItems', 'items'];
const SCHEMA_MAPS = ['properties', 'patternProperties', '$defs', 'definitions', 'dependentSchemas', 'dependencies'];

/** A copy of `schema` with the budget keyword in every subschema (boolean schemas cost nothing). */
function budgeted(schema: unknown): unknown {
  if (typeof schema !== 'object' || schema === null || Array.isArray(schema)) return schema;
  const copy: Record<string, unknown> = { ...(schema as Record<string, unknown>), [BUDGET_KEYWORD]: true };
  for (const key of ONE_SCHEMA) if (key in copy && !Array.isArray(copy[key])) copy[key] = budgeted(copy[key]);
  for (const key of SCHEMA_LISTS) if (Array.isArray(copy[key])) copy[key] = (copy[key] as unknown[]).map(budgeted);
  for (const key of SCHEMA_MAPS) {
    const map = copy[key];
    if (typeof map === 'object' && map !== null && !Array.isArray(map)) {
      copy[key] = Object.fromEntries(Object.entries(map).map(([name, sub]) => [name, budgeted(sub)]));
    }
  }
  return copy;
}

/** Runs `validate` within `VALIDATION_BUDGET_MS`; a value that takes longer is refused. */
function bounded(validate: SchemaValidator): SchemaValidator {
  const run = ((data: unknown) => {
    steps = 0;
    deadline = undefined;
    try {
      const ok = validate(data);
      run.errors = validate.errors ?? null;
      return ok;
    } catch (error) {
      if (!(error instanceof ValidationBudgetExceeded)) throw error;
      run.errors = [
        {
          instancePath: '',
          message: `took more than ${VALIDATION_BUDGET_MS} ms of CPU to check against the schema; refused`,
        },
      ];
      return false;
    } finally {
      deadline = undefined;
    }
  }) as SchemaValidator;
  run.errors = null;
  return run;
}

export type SchemaCompilation = { ok: true; validate: SchemaValidator } | { ok: false; message: string };

/**
 * Compiles one schema, its validation bounded in time; a schema that is not valid JSON Schema
 * 2020-12 is a value, not a throw.
 */
export function compileSchema(ajv: Ajv2020, schema: JsonSchema): SchemaCompilation {
  try {
    return { ok: true, validate: bounded(ajv.compile(budgeted(schema) as JsonSchema)) };
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
  try {
    checker.compile(schema);
    return undefined;
  } catch (error) {
    return (error as Error).message;
  } finally {
    if (typeof schema === 'object') checker.removeSchema(schema);
  }
}

/**
 * A validator that refuses everything: used when a stored schema no longer compiles (a newer ajv,
 * say), so that a call fails closed instead of skipping validation.
 */
export function refusingValidator(reason: string): SchemaValidator {
  const validate = ((_data: unknown) => {
    validate.errors = [{ instancePath: '', message: reason }];
    return false;
  }) as SchemaValidator;
  validate.errors = null;
  return validate;
}
