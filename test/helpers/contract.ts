import { readFileSync } from 'node:fs';
import { Ajv2020 } from 'ajv/dist/2020.js';
import addFormatsModule from 'ajv-formats';
import { parse } from 'yaml';
import { openapiPath } from '../../src/http/routes/docs.js';

type Json = Record<string, unknown>;
const addFormats = addFormatsModule as unknown as (ajv: Ajv2020) => Ajv2020;

export const openapi = parse(readFileSync(openapiPath, 'utf8')) as Json & { paths: Record<string, Json> };

const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);
ajv.addSchema({ ...openapi, $id: 'openapi' });

const templates = Object.keys(openapi.paths).map((template) => ({
  template,
  pattern: new RegExp(`^${template.replace(/[.*+?^$()|[\]\\]/g, '\\$&').replace(/\{[^/]+?\}/g, '[^/]+')}$`),
  literal: !template.includes('{'),
}));

function pointer(...parts: string[]): string {
  return parts.map((part) => part.replace(/~/g, '~0').replace(/\//g, '~1')).join('/');
}

function resolve(node: Json): Json {
  const ref = node.$ref;
  if (typeof ref !== 'string') return node;
  let target: unknown = openapi;
  for (const part of ref.replace(/^#\//, '').split('/'))
    target = (target as Json)[part.replace(/~1/g, '/').replace(/~0/g, '~')];
  return resolve(target as Json);
}

/** The openapi path template a concrete path belongs to (literal templates win over parameterised ones). */
export function templateFor(path: string): string | undefined {
  const matches = templates.filter((t) => t.pattern.test(path));
  return (matches.find((t) => t.literal) ?? matches[0])?.template;
}

/**
 * Checks one response against openapi.yaml: the route, method and status must be documented,
 * and a JSON body must validate against the documented schema. Returns the problems found.
 */
export function contractViolations(
  method: string,
  url: string,
  status: number,
  contentType: string | undefined,
  body: string,
): string[] {
  const path = new URL(url, 'http://x').pathname;
  const template = templateFor(path);
  if (!template) return [`${method} ${path}: path not in openapi.yaml`];
  const operation = openapi.paths[template]?.[method.toLowerCase()] as Json | undefined;
  if (!operation) return [`${method} ${template}: method not in openapi.yaml`];
  const responses = operation.responses as Record<string, Json>;
  const responseKey = String(status) in responses ? String(status) : 'default' in responses ? 'default' : undefined;
  if (!responseKey) return [`${method} ${template}: status ${status} not documented`];
  const response = resolve(responses[responseKey]!);
  const content = response.content as Record<string, Json> | undefined;
  if (!content) return body.length === 0 ? [] : [`${method} ${template} ${status}: body present but none documented`];
  const mediaType = (contentType ?? '').split(';')[0]!.trim();
  if (!(mediaType in content)) return [`${method} ${template} ${status}: content type ${mediaType} not documented`];
  if (mediaType !== 'application/json') return [];
  const ref = `openapi#/${pointer('paths', template, method.toLowerCase(), 'responses', responseKey)}`;
  const schemaRef =
    responses[responseKey]!.$ref !== undefined
      ? `openapi#/${(responses[responseKey]!.$ref as string).replace(/^#\//, '')}/content/application~1json/schema`
      : `${ref}/content/application~1json/schema`;
  const validate = ajv.getSchema(schemaRef);
  if (!validate) return [`${method} ${template} ${status}: cannot compile schema ${schemaRef}`];
  let parsed: unknown;
  try {
    parsed = JSON.parse(body);
  } catch {
    return [`${method} ${template} ${status}: body is not JSON`];
  }
  if (validate(parsed)) return [];
  return (validate.errors ?? []).map(
    (e) => `${method} ${template} ${status}: ${e.instancePath || '/'} ${e.message ?? ''} ${JSON.stringify(e.params)}`,
  );
}
