import { expect } from 'vitest';
import type { AppClient } from './harness.js';
import { tokens } from './tokens.js';

/** Builders for the objects a run needs, made through the API as an operator would. */

export const echoSchemas = {
  input_schema: {
    type: 'object',
    properties: { q: { type: 'string' } },
    required: ['q'],
    additionalProperties: false,
  },
  output_schema: {
    type: 'object',
    properties: { echo: {} },
    required: ['echo'],
  },
};

/** The input and output of `external_call` tools (SPEC §9). */
export const egressSchemas = {
  input_schema: {
    type: 'object',
    properties: { url: { type: 'string' }, method: { type: 'string' }, headers: { type: 'object' }, body: {} },
    required: ['url'],
  },
  output_schema: {
    type: 'object',
    properties: { status: { type: 'integer' }, headers: { type: 'object' }, body: {} },
    required: ['status', 'headers', 'body'],
  },
};

export interface ToolOptions {
  id: string;
  version?: string;
  category?: string;
  risk_level?: string;
  allowed_agents?: string[];
  backendUrl?: string | null;
  timeout_ms?: number;
  max_response_bytes?: number;
  cost_units?: number;
  rate_limit?: { capacity: number; refill_per_second: number } | null;
  required_context?: string[];
  required_scopes?: Array<{ scope: string; required: boolean; rationale: string }>;
  target?: { family?: string; provider?: string; region?: string };
  egress?: unknown;
  input_schema?: unknown;
  output_schema?: unknown;
  requires_approval?: boolean;
}

export function toolBody(options: ToolOptions): Record<string, unknown> {
  return {
    id: options.id,
    version: options.version ?? '1.0.0',
    display_name: options.id,
    description: `test tool ${options.id}`,
    category: options.category ?? 'read_only',
    risk_level: options.risk_level ?? 'low',
    ...echoSchemas,
    ...(options.input_schema !== undefined ? { input_schema: options.input_schema } : {}),
    ...(options.output_schema !== undefined ? { output_schema: options.output_schema } : {}),
    allowed_agents: options.allowed_agents ?? [],
    required_context: options.required_context ?? [],
    required_scopes: options.required_scopes ?? [],
    requires_approval: options.requires_approval ?? false,
    side_effects: [],
    reads_from: [],
    writes_to: [],
    dependencies: [],
    backend:
      options.backendUrl === null || options.backendUrl === undefined
        ? null
        : {
            url: options.backendUrl,
            method: 'POST',
            timeout_ms: options.timeout_ms ?? 2000,
            max_response_bytes: options.max_response_bytes ?? 1024 * 1024,
            headers: {},
          },
    target: options.target ?? { family: 'test', provider: 'loopback', region: 'local' },
    cost_units: options.cost_units ?? 1,
    rate_limit: options.rate_limit ?? null,
    ...(options.egress !== undefined ? { egress: options.egress } : {}),
  };
}

export async function registerTool(client: AppClient, options: ToolOptions): Promise<void> {
  const res = await client.post('/tools', { token: tokens.platform(), body: toolBody(options) });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
}

export async function grantTool(
  client: AppClient,
  grant: {
    tenant: string;
    agent: string;
    tool: string;
    scope?: string;
    scope_ref?: string;
    expires_at?: string;
    capability_modifiers?: Record<string, unknown>;
  },
): Promise<{ id: string }> {
  const res = await client.post('/grants', {
    token: tokens.tenantOperator(grant.tenant),
    body: {
      agent_id: grant.agent,
      tool_id: grant.tool,
      scope: grant.scope ?? 'per-tenant',
      scope_ref: grant.scope_ref ?? grant.tenant,
      capability_modifiers: grant.capability_modifiers ?? {},
      expires_at: grant.expires_at ?? new Date(Date.now() + 3600_000).toISOString(),
      rationale: 'needed by the test',
    },
  });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return res.body as { id: string };
}

export async function createBudget(
  client: AppClient,
  budget: {
    tenant: string;
    scope?: 'tenant' | 'agent' | 'run';
    agent_id?: string;
    run_id?: string;
    period?: string;
    limit_units: number;
    warn_ratio?: number;
    grace_units?: number;
  },
): Promise<{ id: string }> {
  const res = await client.post('/budgets', {
    token: tokens.tenantOperator(budget.tenant),
    body: {
      scope: budget.scope ?? 'tenant',
      ...(budget.agent_id ? { agent_id: budget.agent_id } : {}),
      ...(budget.run_id ? { run_id: budget.run_id } : {}),
      period: budget.period ?? 'total',
      limit_units: budget.limit_units,
      warn_ratio: budget.warn_ratio ?? 0.8,
      grace_units: budget.grace_units ?? 0,
    },
  });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return res.body as { id: string };
}

let runCounter = 0;
/** A run id unique within this process. */
export function newRunId(prefix = 'run'): string {
  runCounter += 1;
  return `${prefix}-${process.pid}-${runCounter}-${Math.random().toString(36).slice(2, 8)}`;
}
