/**
 * What the control plane reads of a registered tool: enough to refuse grants for unknown or
 * agent-forbidden tools, to bound capability modifiers, and to find a tool's kill-switch target.
 * The registry's catalog (`services.catalog`) satisfies it as is.
 */
export interface ToolFacts {
  id: string;
  category: string;
  egress: { allowed_hosts: string[] } | null;
  target: { family?: string | null; provider?: string | null; region?: string | null } | null;
}

/** The registry's answer for a tool id: the newest version callers would get, or why none. */
export type ToolFactsResult = { ok: true; tool: ToolFacts } | { ok: false; code: string };

/** Where tool facts come from: `services.catalog` in the app. */
export interface ToolFactsLookup {
  /** Every registered version of a tool, newest first (deprecated ones too); empty when unknown. */
  versions(toolId: string): readonly ToolFacts[] | Promise<readonly ToolFacts[]>;
  /** The version an agent's views show: the newest it may use (allowlist, category, external call policy). */
  resolve(
    toolId: string,
    range: undefined,
    who: { as: 'viewer'; agent: { agentId: string; family: string | undefined }; externalCallEnabled: boolean },
  ): ToolFactsResult | Promise<ToolFactsResult>;
  /** Whether the answers are current (the catalog's copy confirmed recently); absent: always. */
  readiness?(): { ok: boolean; reason?: string | undefined };
}

/** Tool categories an agent may never hold, whatever an operator grants. */
export const AGENT_FORBIDDEN_CATEGORIES: ReadonlySet<string> = new Set(['final_write', 'admin']);
