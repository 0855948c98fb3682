import semver from 'semver';
import { z } from 'zod';
import { isHostPattern } from '../egress/host-allowlist.js';
import {
  AGENT_FORBIDDEN_CATEGORIES,
  MINIMUM_RISK_FOR_FORBIDDEN_CATEGORIES,
  RISK_LEVELS,
  SECRET_ENV_PATTERN,
  TOOL_CATEGORIES,
  type HeaderValue,
  type JsonSchema,
  type ToolContent,
  type ToolDeprecation,
} from './tool-contract.js';
import { contextKey, toolId } from '../validation/fields.js';
import { instant, units } from '../validation/values.js';
import { schemaProblem } from './tool-schemas.js';

export const BACKEND_METHODS = ['GET', 'POST', 'PUT', 'PATCH', 'DELETE'] as const;
const EGRESS_METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'] as const;
const MAX_TIMEOUT_MS = 300_000;
const MAX_RESPONSE_BYTES = 64 * 1024 * 1024;

// Headers the gateway sets itself on every backend call: a registrant may not override them.
const RESERVED_HEADERS = new Set([
  'host',
  'content-length',
  'content-type',
  'accept',
  'connection',
  'transfer-encoding',
  'te',
  'upgrade',
  'traceparent',
  'tracestate',
]);
const HEADER_NAME = /^[A-Za-z0-9!#$%&'*+.^_`|~-]+$/;

const text = (max: number) => z.string().trim().min(1, 'must not be blank').max(max);
const label = z.string().trim().min(1, 'must not be blank').max(200);
const agentRef = z
  .string()
  .max(200)
  .regex(/^[A-Za-z0-9][A-Za-z0-9._:@-]*$/, 'must be an agent id or family:<name>');
const jsonSchema = z.union([z.record(z.string(), z.unknown()), z.boolean()], {
  error: 'must be a JSON Schema (an object or a boolean)',
});

const unique =
  <T>(key: (item: T) => string, what: string) =>
  (items: T[], ctx: z.RefinementCtx) => {
    const seen = new Set<string>();
    items.forEach((item, index) => {
      const k = key(item);
      if (seen.has(k)) ctx.addIssue({ code: 'custom', path: [index], message: `duplicate ${what} ${k}` });
      seen.add(k);
    });
  };

const headerValue: z.ZodType<HeaderValue> = z.union([
  z
    .string()
    .max(8192)
    .regex(/^[^\r\n\0]*$/, 'must not contain line breaks'),
  z.strictObject({
    from_env: z.string().regex(SECRET_ENV_PATTERN, 'must name a TOOLGATE_SECRET_* environment variable'),
  }),
]);

const backendSchema = z.strictObject({
  url: z
    .string()
    .max(2048)
    .refine(
      (value) => URL.canParse(value) && ['http:', 'https:'].includes(new URL(value).protocol),
      'must be an http(s) URL',
    )
    .refine(
      (value) => !URL.canParse(value) || (new URL(value).username === '' && new URL(value).password === ''),
      'must not carry credentials; use headers',
    ),
  method: z.enum(BACKEND_METHODS).default('POST'),
  timeout_ms: z.number().int().min(1).max(MAX_TIMEOUT_MS).default(10_000),
  max_response_bytes: z
    .number()
    .int()
    .min(1)
    .max(MAX_RESPONSE_BYTES)
    .default(1024 * 1024),
  headers: z
    .record(z.string(), headerValue)
    .default({})
    .superRefine((headers, ctx) => {
      const seen = new Set<string>();
      for (const name of Object.keys(headers)) {
        const lower = name.toLowerCase();
        if (!HEADER_NAME.test(name))
          ctx.addIssue({ code: 'custom', path: [name], message: 'is not a valid header name' });
        else if (RESERVED_HEADERS.has(lower) || lower.startsWith('x-toolgate-')) {
          ctx.addIssue({ code: 'custom', path: [name], message: 'is set by the gateway and cannot be overridden' });
        } else if (seen.has(lower)) ctx.addIssue({ code: 'custom', path: [name], message: 'is given twice' });
        seen.add(lower);
      }
    }),
});

const egressSchema = z.strictObject({
  allowed_hosts: z
    .array(z.string().max(253).refine(isHostPattern, 'must be a host, *.example.com or *'))
    .min(1, 'an external_call tool needs at least one allowed host'),
  schemes: z
    .array(z.enum(['http', 'https']))
    .min(1)
    .optional(),
  methods: z.array(z.enum(EGRESS_METHODS)).min(1).optional(),
  follow_redirects: z.boolean().optional(),
  max_redirects: z.number().int().min(0).max(10).optional(),
  max_response_bytes: z.number().int().min(1).max(MAX_RESPONSE_BYTES).optional(),
  timeout_ms: z.number().int().min(1).max(MAX_TIMEOUT_MS).optional(),
  allow_credential_headers: z.boolean().optional(),
});

const nullableLabel = z.string().trim().min(1).max(200).nullable().default(null);

/**
 * The body of `POST /tools`. Parsing normalises it (defaults filled in) into the content that is stored and compared
 * for idempotency; every rule that needs no other tool is checked here, so a failure names its field
 * (docs/api.md#the-tool-registry-tools).
 */
export const toolRegistrationSchema = z
  .strictObject({
    // `deprecations` is taken by GET /tools/deprecations.
    id: toolId.refine((value) => value !== 'deprecations', 'is reserved'),
    version: z
      .string()
      .max(100)
      .refine(
        (value) => semver.valid(value) === value,
        'must be a semantic version such as 1.2.0 (no prefix, no build metadata)',
      ),
    display_name: label,
    description: text(4000),
    category: z.enum(TOOL_CATEGORIES),
    risk_level: z.enum(RISK_LEVELS),
    input_schema: jsonSchema,
    output_schema: jsonSchema,
    allowed_agents: z
      .array(agentRef)
      .max(1000)
      .default([])
      .superRefine(unique((a) => a, 'agent')),
    required_context: z
      .array(contextKey)
      .max(100)
      .default([])
      .superRefine(unique((k) => k, 'context key')),
    required_scopes: z
      .array(
        z.strictObject({
          scope: z.string().min(1).max(200).regex(/^\S+$/, 'must not contain spaces'),
          required: z.boolean(),
          rationale: text(1000),
        }),
      )
      .max(100)
      .default([])
      .superRefine(unique((s) => s.scope, 'scope')),
    requires_approval: z.boolean().default(false),
    side_effects: z.array(text(1000)).max(100).default([]),
    reads_from: z.array(label).max(100).default([]),
    writes_to: z.array(label).max(100).default([]),
    dependencies: z
      .array(
        z.strictObject({
          tool_id: toolId,
          range: z
            .string()
            .max(200)
            .refine((value) => semver.validRange(value) !== null, 'must be a semver range such as ^1.2.0'),
        }),
      )
      .max(100)
      .default([])
      .superRefine(unique((d) => d.tool_id, 'dependency on')),
    deprecation: z
      .strictObject({
        deprecated_at: instant.transform((value) => new Date(value).toISOString()),
        replacement_tool_id: toolId.nullable().default(null),
      })
      .nullable()
      .default(null),
    backend: backendSchema.nullable().default(null),
    target: z
      .strictObject({ family: nullableLabel, provider: nullableLabel, region: nullableLabel })
      .default({ family: null, provider: null, region: null }),
    cost_units: units,
    rate_limit: z
      .strictObject({
        capacity: z.number().int().min(1).max(1_000_000_000),
        // At least one token in about 11.6 days: Retry-After stays a sensible whole number of seconds.
        refill_per_second: z.number().min(0.000001).max(1_000_000_000),
      })
      .nullable()
      .default(null),
    egress: egressSchema.nullable().default(null),
  })
  .superRefine((tool, ctx) => {
    const problem = (path: string, message: string) => ctx.addIssue({ code: 'custom', path: [path], message });
    if (AGENT_FORBIDDEN_CATEGORIES.has(tool.category)) {
      if (tool.allowed_agents.length > 0)
        problem('allowed_agents', `must be empty: no agent may use a ${tool.category} tool`);
      if (!MINIMUM_RISK_FOR_FORBIDDEN_CATEGORIES.has(tool.risk_level)) {
        problem('risk_level', `a ${tool.category} tool must be high or critical`);
      }
    }
    if (tool.category === 'external_call') {
      if (tool.egress === null) problem('egress', 'an external_call tool needs an egress allowlist');
      if (tool.backend !== null)
        problem('backend', 'an external_call tool has no backend: the gateway makes its calls');
    } else if (tool.egress !== null) {
      problem('egress', 'only external_call tools have an egress allowlist');
    }
    for (const field of ['input_schema', 'output_schema'] as const) {
      const why = schemaProblem(tool[field] as JsonSchema);
      if (why) problem(field, `not a valid JSON Schema (2020-12): ${why}`);
    }
  });

export type ToolRegistration = z.infer<typeof toolRegistrationSchema>;

/** Splits a parsed registration into its immutable content and its (mutable) deprecation. */
export function contentOf(registration: ToolRegistration): {
  content: ToolContent;
  deprecation: ToolDeprecation | null;
} {
  const { deprecation, ...content } = registration;
  return { content: content as ToolContent, deprecation };
}

/**
 * Checks that every secret a backend names is set on this gateway: a typo is caught at
 * registration rather than at the first call. Returns the failing field, or undefined.
 */
export function missingSecret(
  content: ToolContent,
  secrets: Readonly<Record<string, string>>,
): { field: string; name: string } | undefined {
  for (const [header, value] of Object.entries(content.backend?.headers ?? {})) {
    if (typeof value === 'object' && !(value.from_env in secrets)) {
      return { field: `body.backend.headers.${header}`, name: value.from_env };
    }
  }
  return undefined;
}
