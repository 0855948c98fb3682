import { Ajv2020, type ValidateFunction } from 'ajv/dist/2020.js';
import addFormatsModule from 'ajv-formats';
import type { JsonSchema } from './tool-contract.js';

const addFormats = addFormatsModule as unknown as (ajv: Ajv2020) => Ajv2020;

/** A tool's compiled input and output validators. */
export interface ToolValidators {
  input: ValidateFunction;
  output: ValidateFunction;
}

/**
 * An ajv instance for tool schemas (JSON Schema 2020-12). Unknown keywords are tolerated, as the
 * standard says; `addUsedSchema: false` keeps each schema's `$id` out of the shared registry, so two
 * tools may reuse an `$id` without colliding. Nothing is ever fetched: an unresolved remote `$ref`
 * fails compilation.
 */
export function createSchemaCompiler(): Ajv2020 {
  const ajv = new Ajv2020({ strict: false, allErrors: true, addUsedSchema: false, validateSchema: true });
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

/** Why a schema is not valid JSON Schema 2020-12, or undefined when it is. */
export function schemaProblem(schema: JsonSchema): string | undefined {
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
