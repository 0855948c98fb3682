import { AGENT_FORBIDDEN_CATEGORIES, type ToolContract } from './tool-contract.js';

/** The agent asking, as its verified token names it. */
export interface AgentIdentity {
  agentId: string;
  family: string | undefined;
}

/**
 * Whether the registry lets an agent use a tool: never `final_write` or `admin`, else only when the allowlist names the
 * agent or `family:<its family>` (deny by default). Tenant policy, grants and kill switches are decided elsewhere.
 */
export function agentMayUse(tool: Pick<ToolContract, 'category' | 'allowed_agents'>, agent: AgentIdentity): boolean {
  return !AGENT_FORBIDDEN_CATEGORIES.has(tool.category) && allowlistNames(tool, agent);
}

/** Whether a tool's allowlist names the agent, by id or as `family:<its family>`. */
export function allowlistNames(tool: Pick<ToolContract, 'allowed_agents'>, agent: AgentIdentity): boolean {
  // An agent id that looks like a family entry never matches one by id.
  return (
    (!agent.agentId.startsWith('family:') && tool.allowed_agents.includes(agent.agentId)) ||
    (agent.family !== undefined && tool.allowed_agents.includes(`family:${agent.family}`))
  );
}
