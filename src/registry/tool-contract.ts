import { SECRET_ENV_PATTERN } from '../config/config.js';
import type { EgressPolicy } from '../egress/egress-policy.js';

/** Only `TOOLGATE_SECRET_*` variables may feed backend headers, so a registrant cannot read `DATABASE_URL`. */
export { SECRET_ENV_PATTERN };

/** The five tool categories. Agents only ever use the first two (and external calls where enabled). */
export const TOOL_CATEGORIES = ['read_only', 'draft_write', 'final_write', 'admin', 'external_call'] as const;
export type ToolCategory = (typeof TOOL_CATEGORIES)[number];

export const RISK_LEVELS = ['low', 'medium', 'high', 'critical'] as const;
export type RiskLevel = (typeof RISK_LEVELS)[number];

/** Categories no agent may ever be offered or named on, whatever an operator grants. */
export const AGENT_FORBIDDEN_CATEGORIES: ReadonlySet<ToolCategory> = new Set(['final_write', 'admin']);

/** `final_write` and `admin` tools must be at least this risky. */
export const MINIMUM_RISK_FOR_FORBIDDEN_CATEGORIES: ReadonlySet<RiskLevel> = new Set(['high', 'critical']);

/** Tool ids: dotted lower-case names such as `web.fetch` (bounded with every other field in `src/validation/`). */
export { TOOL_ID_PATTERN } from '../validation/fields.js';

/** A backend header value: a literal, or the name of a `TOOLGATE_SECRET_*` variable read at start-up. */
export type HeaderValue = string | { from_env: string };

/** How the gateway calls a tool's backend (the dispatch stage). */
export interface ToolBackend {
  url: string;
  method: string;
  timeout_ms: number;
  max_response_bytes: number;
  headers: Record<string, HeaderValue>;
}

/** Server-side metadata kill switches match on; never taken from a request. */
export interface ToolTarget {
  family: string | null;
  provider: string | null;
  region: string | null;
}

export interface RequiredScope {
  scope: string;
  required: boolean;
  rationale: string;
}

export interface ToolDependency {
  tool_id: string;
  range: string;
}

export interface ToolDeprecation {
  /** When the version stops being picked by ranges; a future date schedules the deprecation. */
  deprecated_at: string;
  replacement_tool_id: string | null;
}

export interface ToolRateLimit {
  capacity: number;
  refill_per_second: number;
}

/**
 * A registered tool version, exactly as the API speaks it. Everything but
 * `deprecation` is immutable once registered.
 */
export interface ToolContract {
  id: string;
  version: string;
  display_name: string;
  description: string;
  category: ToolCategory;
  risk_level: RiskLevel;
  input_schema: JsonSchema;
  output_schema: JsonSchema;
  allowed_agents: string[];
  required_context: string[];
  required_scopes: RequiredScope[];
  requires_approval: boolean;
  side_effects: string[];
  reads_from: string[];
  writes_to: string[];
  dependencies: ToolDependency[];
  deprecation: ToolDeprecation | null;
  backend: ToolBackend | null;
  target: ToolTarget;
  cost_units: number;
  rate_limit: ToolRateLimit | null;
  egress: EgressPolicy | null;
  registered_at: string;
  registered_by: string;
}

/** A JSON Schema (2020-12) document: an object, or `true`/`false`. */
export type JsonSchema = Record<string, unknown> | boolean;

/** The immutable part of a contract: what a registration carries and what idempotency compares. */
export type ToolContent = Omit<ToolContract, 'deprecation' | 'registered_at' | 'registered_by'>;

/** Whether a version's deprecation is in effect at `now` (a scheduled one is not yet). */
export function isDeprecatedAt(tool: Pick<ToolContract, 'deprecation'>, now: Date): boolean {
  return tool.deprecation !== null && Date.parse(tool.deprecation.deprecated_at) <= now.getTime();
}

/** The key of one version in maps and caches. */
export function versionKey(toolId: string, version: string): string {
  return `${toolId}@${version}`;
}
