import { describe, expect, it } from 'vitest';
import { agentMayUse } from '../../src/registry/tool-access.js';
import { TOOL_CATEGORIES } from '../../src/registry/tool-contract.js';

describe('which agents the registry lets use a tool', () => {
  const analyst = { agentId: 'scf.analyst', family: 'standard' };

  it('admits an agent named on the allowlist, by id or by family', () => {
    expect(agentMayUse({ category: 'read_only', allowed_agents: ['scf.analyst'] }, analyst)).toBe(true);
    expect(agentMayUse({ category: 'draft_write', allowed_agents: ['family:standard'] }, analyst)).toBe(true);
    expect(agentMayUse({ category: 'external_call', allowed_agents: ['scf.analyst'] }, analyst)).toBe(true);
  });

  it('denies by default: an empty allowlist, another agent, another family, no family', () => {
    expect(agentMayUse({ category: 'read_only', allowed_agents: [] }, analyst)).toBe(false);
    expect(agentMayUse({ category: 'read_only', allowed_agents: ['gap.analyst'] }, analyst)).toBe(false);
    expect(agentMayUse({ category: 'read_only', allowed_agents: ['family:veritas'] }, analyst)).toBe(false);
    expect(
      agentMayUse(
        { category: 'read_only', allowed_agents: ['family:standard'] },
        { agentId: 'scf.analyst', family: undefined },
      ),
    ).toBe(false);
  });

  it('never admits anyone to final_write or admin tools, whatever the allowlist says', () => {
    for (const category of ['final_write', 'admin'] as const) {
      expect(agentMayUse({ category, allowed_agents: ['scf.analyst', 'family:standard'] }, analyst)).toBe(false);
    }
    expect(
      TOOL_CATEGORIES.filter((category) => agentMayUse({ category, allowed_agents: ['scf.analyst'] }, analyst)),
    ).toEqual(['read_only', 'draft_write', 'external_call']);
  });

  it('does not let an agent whose id looks like a family entry match it by id', () => {
    expect(
      agentMayUse(
        { category: 'read_only', allowed_agents: ['family:standard'] },
        { agentId: 'family:standard', family: undefined },
      ),
    ).toBe(false);
  });
});
