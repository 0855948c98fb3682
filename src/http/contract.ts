import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import fastJsonStringify from 'fast-json-stringify';
import type { FastifyInstance, FastifySerializerCompiler, RouteOptions } from 'fastify';
import fp from 'fastify-plugin';
import { parse } from 'yaml';
import { validatorCompiler } from './validation.js';

type Json = Record<string, unknown>;

export const openapiPath = fileURLToPath(new URL('../../openapi.yaml', import.meta.url));

/** The id under which openapi.yaml's schemas are shared with the serializer. */
export const CONTRACT_ID = 'openapi.yaml';

const METHODS = new Set(['get', 'put', 'post', 'delete', 'patch', 'options', 'head', 'trace']);

let loading: Promise<Json> | undefined;

/**
 * `openapi.yaml`, read and parsed once per process: the one source of the HTTP contract. Frozen,
 * as every app and `/openapi.json` share it.
 */
export function loadOpenApiDocument(): Promise<Json> {
  loading ??= readFile(openapiPath, 'utf8').then((text) => deepFreeze(parse(text) as Json));
  return loading;
}

/**
 * The document's schemas as the serializer reads them: `components/schemas` where its `$ref`s
 * point, and the JSON answers under `responses/{name}` and `operations/{operationId}/{status}`
 * (the serializer's resolver does not unescape `~1`, so no key on a reference holds a `/`).
 * JSON Schema lets an object carry properties it does not list unless `additionalProperties:
 * false` says otherwise, while fast-json-stringify drops them: each object schema silent on it is
 * made explicit, and defaults (which it writes for a missing property) are left out.
 */
export function serializerSchemas(document: Json): Json {
  const components = document.components as Record<string, Record<string, Json>>;
  const operations: Record<string, Record<string, unknown>> = {};
  for (const item of Object.values(document.paths as Record<string, Json>)) {
    for (const [method, operation] of Object.entries(item)) {
      if (!METHODS.has(method)) continue;
      const { operationId, responses } = operation as { operationId: string; responses: Record<string, Json> };
      const inline = Object.entries(responses).filter(([, response]) => response.$ref === undefined);
      operations[operationId] = jsonSchemasOf(inline);
    }
  }
  const responses = jsonSchemasOf(Object.entries(components.responses ?? {}));
  return openObjects({
    $id: CONTRACT_ID,
    components: { schemas: components.schemas },
    responses,
    operations,
  }) as Json;
}

function jsonSchemaOf(response: Json): unknown {
  return (response.content as Record<string, Json> | undefined)?.['application/json']?.schema;
}

function jsonSchemasOf(responses: Array<[string, Json]>): Record<string, unknown> {
  return Object.fromEntries(
    responses.flatMap(([key, response]) => {
      const schema = jsonSchemaOf(response);
      return schema === undefined ? [] : [[key, schema]];
    }),
  );
}

/** Keywords whose values are data, not schemas: left as written. */
const DATA_KEYWORDS = new Set(['const', 'enum', 'example', 'examples']);

function openObjects(node: unknown): unknown {
  if (Array.isArray(node)) return node.map(openObjects);
  if (!isObject(node)) return node;
  const copy: Json = {};
  for (const [key, value] of Object.entries(node)) {
    // A default is what a request may leave out; fast-json-stringify would write it into answers.
    if (key === 'default') continue;
    // A properties map is not itself a schema: only its values are.
    copy[key] = DATA_KEYWORDS.has(key)
      ? value
      : (key === 'properties' || key === 'patternProperties') && isObject(value)
        ? Object.fromEntries(Object.entries(value).map(([name, schema]) => [name, openObjects(schema)]))
        : openObjects(value);
  }
  if (isObjectSchema(copy) && copy.additionalProperties === undefined) copy.additionalProperties = true;
  return copy;
}

function isObjectSchema(node: Json): boolean {
  const type = node.type;
  if (type === 'object' || (Array.isArray(type) && type.includes('object'))) return true;
  return type === undefined && isObject(node.properties);
}

/** Fastify's `schema.response` of a route: each JSON answer openapi.yaml documents for it, by reference. */
export type ResponseSchemas = Record<string, { content: { 'application/json': { schema: { $ref: string } } } }>;

/**
 * The response schemas openapi.yaml gives `method` on `url` (a Fastify path, `:param`), or
 * undefined when it documents no JSON answer there.
 */
export function responseSchemasOf(document: Json, method: string, url: string): ResponseSchemas | undefined {
  const template = url.replace(/:([A-Za-z_]+)/g, '{$1}');
  const operation = (document.paths as Record<string, Json>)[template]?.[method.toLowerCase()] as Json | undefined;
  if (!operation || !METHODS.has(method.toLowerCase())) return undefined;
  const declared: ResponseSchemas = {};
  for (const [status, response] of Object.entries(operation.responses as Record<string, Json>)) {
    const named = typeof response.$ref === 'string' ? response.$ref.replace('#/components/responses/', '') : undefined;
    const body = jsonSchemaOf(named === undefined ? response : resolve(document, response));
    if (body === undefined) continue;
    const at = named === undefined ? `operations/${String(operation.operationId)}/${status}` : `responses/${named}`;
    declared[status] = { content: { 'application/json': { schema: { $ref: `${CONTRACT_ID}#/${at}` } } } };
  }
  return Object.keys(declared).length > 0 ? declared : undefined;
}

/** Fastify's request schemas of a route: what its operation in openapi.yaml takes. */
export interface RequestSchemas {
  body?: Json;
  querystring?: Json;
  params?: Json;
}

/**
 * The request schemas openapi.yaml gives `method` on `url`: the JSON request body by reference,
 * and the query and path parameters as a closed object of the documented parameters' schemas
 * (references made to point into the document). Undefined when it documents no input there.
 */
export function requestSchemasOf(document: Json, method: string, url: string): RequestSchemas | undefined {
  const template = url.replace(/:([A-Za-z_]+)/g, '{$1}');
  const item = (document.paths as Record<string, Json>)[template];
  const verb = method.toLowerCase();
  const operation = item?.[verb] as Json | undefined;
  if (!item || !operation || !METHODS.has(verb)) return undefined;
  const declared: RequestSchemas = {};
  const requestBody = operation.requestBody as Json | undefined;
  if (requestBody && jsonSchemaOf(resolve(document, requestBody)) !== undefined) {
    const at =
      typeof requestBody.$ref === 'string'
        ? requestBody.$ref.replace(/^#\//, '')
        : `paths/${escapePointer(template)}/${verb}/requestBody`;
    declared.body = { $ref: `${CONTRACT_ID}#/${at}/content/application~1json/schema` };
  }
  // An operation's parameter overrides its path's of the same name and place.
  const parameters = new Map<string, Json>();
  for (const parameter of [...((item.parameters as Json[]) ?? []), ...((operation.parameters as Json[]) ?? [])]) {
    const resolved = resolve(document, parameter);
    parameters.set(`${String(resolved.in)} ${String(resolved.name)}`, resolved);
  }
  for (const [part, place] of [
    ['querystring', 'query'],
    ['params', 'path'],
  ] as const) {
    const listed = [...parameters.values()].filter((parameter) => parameter.in === place);
    if (listed.length === 0) continue;
    declared[part] = {
      type: 'object',
      additionalProperties: false,
      required: listed.filter((parameter) => parameter.required === true).map((parameter) => String(parameter.name)),
      properties: Object.fromEntries(listed.map((parameter) => [String(parameter.name), inDocument(parameter.schema)])),
    };
  }
  return Object.keys(declared).length > 0 ? declared : undefined;
}

/** A schema copied out of the document, its local references pointing back into it. */
export function inDocument(node: unknown): unknown {
  if (Array.isArray(node)) return node.map(inDocument);
  if (!isObject(node)) return node;
  return Object.fromEntries(
    Object.entries(node).map(([key, value]) => [
      key,
      key === '$ref' && typeof value === 'string' && value.startsWith('#/')
        ? `${CONTRACT_ID}${value}`
        : DATA_KEYWORDS.has(key)
          ? value
          : inDocument(value),
    ]),
  );
}

function escapePointer(part: string): string {
  return part.replace(/~/g, '~0').replace(/\//g, '~1');
}

declare module 'fastify' {
  interface FastifyInstance {
    /** The response schemas each route took from openapi.yaml, by `METHOD /path`: the contract test reads them. */
    responseSchemas: Map<string, ResponseSchemas>;
    /** The request schemas each route took from openapi.yaml, by `METHOD /path`: the contract test reads them. */
    requestSchemas: Map<string, RequestSchemas>;
  }
  interface FastifyContextConfig {
    /** A route that checks its own input in its own protocol's terms (MCP's JSON-RPC), not openapi.yaml's. */
    ownInput?: boolean;
  }
}

/**
 * Every route registered after this plugin takes its input as openapi.yaml documents it (checked
 * by Ajv, a refusal `400 invalid_request`) and answers through fast-json-stringify with the schemas
 * documented for it; a status it does not document is answered with `JSON.stringify`.
 */
export const contractPlugin = fp(
  async (app: FastifyInstance) => {
    const document = await loadOpenApiDocument();
    app.setSerializerCompiler(compilerFor(document));
    app.setValidatorCompiler(validatorCompiler(document, CONTRACT_ID));
    app.decorate('responseSchemas', new Map<string, ResponseSchemas>());
    app.decorate('requestSchemas', new Map<string, RequestSchemas>());
    app.addHook('onRoute', (route: RouteOptions) => {
      for (const method of [route.method].flat()) {
        const response = responseSchemasOf(document, method, route.url);
        if (response && route.schema?.response === undefined) {
          route.schema = { ...route.schema, response };
          app.responseSchemas.set(`${method} ${route.url}`, response);
        }
        const request = route.config?.ownInput ? undefined : requestSchemasOf(document, method, route.url);
        if (request && route.schema?.body === undefined && route.schema?.querystring === undefined) {
          route.schema = { ...route.schema, ...request };
          app.requestSchemas.set(`${method} ${route.url}`, request);
        }
      }
    });
  },
  { name: 'toolgate-contract' },
);

interface Compiled {
  externals: Record<string, Json>;
  serializers: Map<string, (data: unknown) => string>;
}

const compiled = new WeakMap<Json, Compiled>();

/**
 * One serializer per schema reference, shared by every route and app of the process: dozens of
 * routes answer with the same `Error` or `Run`, and compiling each once keeps start-up short.
 */
function compilerFor(document: Json): FastifySerializerCompiler<unknown> {
  let done = compiled.get(document);
  if (!done) {
    done = { externals: { [CONTRACT_ID]: serializerSchemas(document) }, serializers: new Map() };
    compiled.set(document, done);
  }
  const { externals, serializers } = done;
  return ({ schema }) => {
    const key = JSON.stringify(schema);
    let serializer = serializers.get(key);
    if (!serializer) {
      serializer = fastJsonStringify(schema as never, { schema: externals as never });
      serializers.set(key, serializer);
    }
    return serializer;
  };
}

function resolve(document: Json, node: Json): Json {
  if (typeof node.$ref !== 'string') return node;
  let target: unknown = document;
  for (const part of node.$ref.replace(/^#\//, '').split('/'))
    target = (target as Json)[part.replace(/~1/g, '/').replace(/~0/g, '~')];
  return resolve(document, target as Json);
}

function isObject(value: unknown): value is Json {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function deepFreeze<T>(value: T): T {
  if (typeof value === 'object' && value !== null) {
    for (const inner of Object.values(value)) deepFreeze(inner);
    Object.freeze(value);
  }
  return value;
}
