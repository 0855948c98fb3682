import { Ajv2020, type ErrorObject, type ValidateFunction } from 'ajv/dist/2020.js';
import addFormatsModule from 'ajv-formats';
import type { FastifySchemaCompiler } from 'fastify';
import type { z } from 'zod';
import { ApiError } from './errors.js';

/**
 * Parses a part of a request with a zod schema, for what openapi.yaml's cannot do (normalise a
 * value, check what a schema cannot express); failures are `400 invalid_request` naming each field.
 */
export function parseInput<T extends z.ZodType>(schema: T, value: unknown, where: string): z.infer<T> {
  const parsed = schema.safeParse(value ?? {});
  if (parsed.success) return parsed.data;
  const issues = parsed.error.issues.map((issue) => ({
    field: [where, ...issue.path.map(String)].join('.'),
    message: issue.message,
  }));
  throw invalidInput(issues, where.split('.')[0] as InputPart);
}

const addFormats = addFormatsModule as unknown as (ajv: Ajv2020) => Ajv2020;

type Json = Record<string, unknown>;

/** Where in a request a value was found: the first segment of every field a refusal names. */
export type InputPart = 'body' | 'query' | 'params';

/** A refused field: `body.plan.0.tool_id`, and why. */
export interface InputIssue {
  field: string;
  message: string;
}

/** The `400 invalid_request` of input that is not what the route takes, naming each field. */
export function invalidInput(issues: InputIssue[], where: InputPart): ApiError {
  const first = issues[0];
  return new ApiError('invalid_request', first ? `${first.field}: ${first.message}` : `invalid ${where}`, { issues });
}

const PARTS: Record<string, InputPart> = { body: 'body', querystring: 'query', params: 'params' };

const compiled = new WeakMap<Json, { ajv: Ajv2020; validators: Map<string, ValidateFunction> }>();

/**
 * Fastify's validator compiler for routes whose schemas point into `document` (registered under
 * `$id`). Each schema is compiled once per process, however many apps and routes share it.
 * Defaults the document gives are filled in; an absent body is an empty object, so that its
 * required fields are named.
 */
export function validatorCompiler(document: Json, $id: string): FastifySchemaCompiler<unknown> {
  let done = compiled.get(document);
  if (!done) {
    const ajv = new Ajv2020({ strict: false, allErrors: true, useDefaults: true, coerceTypes: false });
    addFormats(ajv);
    ajv.addSchema({ $id, components: document.components, paths: document.paths });
    done = { ajv, validators: new Map() };
    compiled.set(document, done);
  }
  const { ajv, validators } = done;
  return ({ schema, httpPart }) => {
    const where = PARTS[httpPart ?? ''];
    if (!where) throw new Error(`openapi.yaml declares no ${String(httpPart)} schema`);
    const key = JSON.stringify(schema);
    let validate = validators.get(key);
    if (!validate) {
      validate = ajv.compile(schema as Json);
      validators.set(key, validate);
    }
    const check = validate;
    const fromText = where === 'body' ? undefined : textReaders(schema as Json);
    return (data: unknown) => {
      const value = (data ?? {}) as Json;
      if (fromText)
        for (const [name, read] of fromText) if (typeof value[name] === 'string') value[name] = read(value[name]);
      if (!check(value)) return { error: invalidInput(issuesOf(check.errors ?? [], where), where) };
      return data === value ? true : { value };
    };
  };
}

const DECIMAL_INTEGER = /^-?(0|[1-9][0-9]*)$/;
const JSON_NUMBER = /^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$/;

/**
 * How the query or path parameters declared as numbers or booleans are read from their text: an
 * integer in decimal digits (no `1e3`, `0x10` or spaces), a number as JSON writes one, `true` or
 * `false`. Other text is left as it came, for the schema to refuse by its type.
 */
function textReaders(schema: Json): Array<[string, (text: string) => unknown]> {
  const properties = (schema.properties ?? {}) as Record<string, Json>;
  return Object.entries(properties).flatMap(([name, property]): Array<[string, (text: string) => unknown]> => {
    const types = [property.type].flat();
    if (types.includes('integer') && !types.includes('number'))
      return [[name, (text) => (DECIMAL_INTEGER.test(text) ? Number(text) : text)]];
    if (types.includes('number')) return [[name, (text) => (JSON_NUMBER.test(text) ? Number(text) : text)]];
    if (types.includes('boolean'))
      return [[name, (text) => (text === 'true' ? true : text === 'false' ? false : text)]];
    return [];
  });
}

/** Ajv's errors as fields and reasons: the wrappers of a failed `oneOf` left out when its branches speak. */
export function issuesOf(errors: ErrorObject[], where: InputPart): InputIssue[] {
  const specific = errors.filter((error) => !WRAPPERS.has(error.keyword));
  const shown = (specific.length > 0 ? specific : errors).filter(
    // A nullable value that is wrong: that it is not null says nothing more.
    (error, _index, all) =>
      !(error.keyword === 'type' && error.params.type === 'null' && all.some((other) => other !== error)),
  );
  const issues = new Map<string, InputIssue>();
  for (const error of shown) {
    const issue = issueOf(error, where);
    issues.set(`${issue.field}\0${issue.message}`, issue);
  }
  return [...issues.values()];
}

const WRAPPERS = new Set(['oneOf', 'anyOf', 'propertyNames', 'if']);

function issueOf(error: ErrorObject, where: InputPart): InputIssue {
  const path = [
    where,
    ...error.instancePath
      .split('/')
      .slice(1)
      .map((part) => part.replace(/~1/g, '/').replace(/~0/g, '~')),
  ];
  const params = error.params as Record<string, unknown>;
  const propertyName = (error as ErrorObject & { propertyName?: string }).propertyName;
  switch (error.keyword) {
    case 'required':
      return { field: [...path, String(params.missingProperty)].join('.'), message: 'is required' };
    case 'additionalProperties':
      return { field: [...path, String(params.additionalProperty)].join('.'), message: 'is not a field this takes' };
    case 'maximum':
    case 'minimum':
    case 'exclusiveMaximum':
    case 'exclusiveMinimum':
      return { field: path.join('.'), message: `must be ${String(params.comparison)}${String(params.limit)}` };
    case 'enum':
      return {
        field: path.join('.'),
        message: `must be one of ${(params.allowedValues as unknown[]).map((value) => JSON.stringify(value)).join(', ')}`,
      };
    default:
      return propertyName === undefined
        ? { field: path.join('.'), message: error.message ?? 'is not valid' }
        : { field: [...path, propertyName].join('.'), message: `key ${error.message ?? 'is not valid'}` };
  }
}

/** A refusal of one field (`body.plan`), shaped as the schema's are: for what a schema cannot say. */
export function invalidField(field: string, message: string): ApiError {
  return invalidInput([{ field, message }], field.split('.')[0] as InputPart);
}

/** A request part as the route sees it: the fields openapi.yaml gives a default always there. */
export type Defaulted<T, K extends keyof NonNullable<T>> = NonNullable<T> & Required<Pick<NonNullable<T>, K>>;

/** Refuses `field` unless `ok`: a check openapi.yaml's schema cannot state, made once it passed. */
export function requireThat(ok: boolean, field: string, message: string): void {
  if (!ok) throw invalidField(field, message);
}
