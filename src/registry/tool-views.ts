import type { OperatorRole } from '../auth/principal.js';
import type { HeaderValue, ToolBackend, ToolContract } from './tool-contract.js';

/** What an agent sees of a tool: what it needs to call it, and nothing of backends, secrets or allowlists. */
export interface AgentToolView {
  id: string;
  version: string;
  display_name: string;
  description: string;
  category: ToolContract['category'];
  risk_level: ToolContract['risk_level'];
  input_schema: ToolContract['input_schema'];
  output_schema: ToolContract['output_schema'];
  required_context: string[];
  required_scopes: ToolContract['required_scopes'];
  requires_approval: boolean;
  side_effects: string[];
  reads_from: string[];
  writes_to: string[];
  dependencies: ToolContract['dependencies'];
  deprecation: ToolContract['deprecation'];
  cost_units: number;
  rate_limit: ToolContract['rate_limit'];
  egress: ToolContract['egress'];
}

/** An agent's view, built field by field so that a new contract field is hidden until added here. */
export function agentViewOf(tool: ToolContract): AgentToolView {
  return {
    id: tool.id,
    version: tool.version,
    display_name: tool.display_name,
    description: tool.description,
    category: tool.category,
    risk_level: tool.risk_level,
    input_schema: tool.input_schema,
    output_schema: tool.output_schema,
    required_context: tool.required_context,
    required_scopes: tool.required_scopes,
    requires_approval: tool.requires_approval,
    side_effects: tool.side_effects,
    reads_from: tool.reads_from,
    writes_to: tool.writes_to,
    dependencies: tool.dependencies,
    deprecation: tool.deprecation,
    cost_units: tool.cost_units,
    rate_limit: tool.rate_limit,
    egress: tool.egress,
  };
}

/** What an operator sees of a tool: the backend only for platform-operators, and no header value ever. */
export type OperatorToolView = Omit<ToolContract, 'backend'> & {
  backend?: ToolBackend | null;
  backend_configured: boolean;
};

/** A literal header value is shown as this once registered; a `from_env` reference is shown as is. */
export const REDACTED_HEADER_VALUE = '***';

function redactedBackend(backend: ToolBackend | null): ToolBackend | null {
  if (!backend) return null;
  const headers: Record<string, HeaderValue> = {};
  for (const [name, value] of Object.entries(backend.headers))
    headers[name] = typeof value === 'string' ? REDACTED_HEADER_VALUE : { from_env: value.from_env };
  return { ...backend, headers };
}

/**
 * An operator's view: the whole contract. A tenant-operator learns whether a backend is configured, not where it is;
 * a platform-operator sees it with literal header values masked, since they often hold credentials.
 */
export function operatorViewOf(tool: ToolContract, role: OperatorRole): OperatorToolView {
  return {
    id: tool.id,
    version: tool.version,
    display_name: tool.display_name,
    description: tool.description,
    category: tool.category,
    risk_level: tool.risk_level,
    input_schema: tool.input_schema,
    output_schema: tool.output_schema,
    allowed_agents: tool.allowed_agents,
    required_context: tool.required_context,
    required_scopes: tool.required_scopes,
    requires_approval: tool.requires_approval,
    side_effects: tool.side_effects,
    reads_from: tool.reads_from,
    writes_to: tool.writes_to,
    dependencies: tool.dependencies,
    deprecation: tool.deprecation,
    ...(role === 'platform-operator' ? { backend: redactedBackend(tool.backend) } : {}),
    backend_configured: tool.backend !== null,
    target: tool.target,
    cost_units: tool.cost_units,
    rate_limit: tool.rate_limit,
    egress: tool.egress,
    registered_at: tool.registered_at,
    registered_by: tool.registered_by,
  };
}
