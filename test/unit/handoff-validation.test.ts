import { describe, expect, it } from 'vitest';
import type { HandoffRequest } from '../../src/runs/handoff.js';
import { checkHandoff, type ParentAuthority } from '../../src/handoffs/handoff-validation.js';

const parent: ParentAuthority = {
  trace: ['root.agent', 'parent.agent'],
  tools: new Map([
    ['search', { max_cost_units: 5 }],
    ['summarize', { max_cost_units: 5 }],
  ]),
  maxFanout: 3,
  handoffsMade: 0,
  approvalRequirement: 'none',
  remainingUnits: 50,
};

const request: HandoffRequest = {
  sub_agent_id: 'sub.agent',
  sub_run_id: 'sub-1',
  budget_units: 10,
  delegable_tool_ids: ['search'],
  max_fanout: 1,
  capability_modifiers: { max_cost_units: 2 },
  approval_requirement: 'none',
};

const reasonOf = (r: Partial<HandoffRequest>, p: Partial<ParentAuthority> = {}, maxDepth = 5) => {
  const check = checkHandoff({ ...request, ...r }, { ...parent, ...p }, maxDepth);
  return check.ok ? 'ok' : check.reason;
};

describe('hand-off validation', () => {
  it('accepts a hand-off that narrows everything and fits the budget', () => {
    expect(reasonOf({})).toBe('ok');
    expect(reasonOf({ budget_units: 50 })).toBe('ok');
  });

  it('refuses a sub-agent already in the trace, the parent itself included', () => {
    expect(reasonOf({ sub_agent_id: 'root.agent' })).toBe('cycle_detected');
    expect(reasonOf({ sub_agent_id: 'parent.agent' })).toBe('cycle_detected');
  });

  it('refuses once the trace has reached the depth cap', () => {
    expect(reasonOf({}, { trace: ['a', 'b', 'c', 'd'] })).toBe('ok');
    expect(reasonOf({}, { trace: ['a', 'b', 'c', 'd', 'e'] })).toBe('depth_cap_exceeded');
  });

  it.each<[string, Partial<HandoffRequest>, Partial<ParentAuthority>]>([
    ['a tool the parent cannot use', { delegable_tool_ids: ['search', 'publish'] }, {}],
    ['a fan-out above the parent’s', { max_fanout: 4 }, {}],
    ['a hand-off beyond the parent’s fan-out', {}, { handoffsMade: 3 }],
    ['a wider modifier', { capability_modifiers: { max_cost_units: 9 } }, {}],
    ['a dropped modifier', { capability_modifiers: {} }, {}],
    [
      'a modifier wider than the parent’s for one of the tools handed on',
      { delegable_tool_ids: ['search', 'fetch'], capability_modifiers: { max_cost_units: 2 } },
      {
        tools: new Map([
          ['search', { max_cost_units: 5 }],
          ['fetch', { max_cost_units: 1 }],
        ]),
      },
    ],
    [
      'a modifier dropped that only one tool’s grant sets',
      { delegable_tool_ids: ['search', 'fetch'], capability_modifiers: {} },
      {
        tools: new Map([
          ['search', {}],
          ['fetch', { egress_domains: ['a.example'] }],
        ]),
      },
    ],
    ['a weaker approval requirement', { approval_requirement: 'none' }, { approvalRequirement: 'operator' }],
  ])('refuses %s as authority widening', (_name, r, p) => {
    expect(reasonOf(r, p)).toBe('authority_widening_rejected');
  });

  it('names the tool whose modifiers the envelope would widen', () => {
    const check = checkHandoff(
      { ...request, delegable_tool_ids: ['search', 'fetch'], capability_modifiers: { max_cost_units: 2 } },
      {
        ...parent,
        tools: new Map([
          ['search', { max_cost_units: 5 }],
          ['fetch', { max_cost_units: 1 }],
        ]),
      },
      5,
    );
    expect(check).toMatchObject({
      ok: false,
      reason: 'authority_widening_rejected',
      details: { field: 'capability_modifiers.max_cost_units', tool_id: 'fetch' },
    });
  });

  it('accepts any modifiers for tools the parent holds unlimited', () => {
    expect(reasonOf({ capability_modifiers: {} }, { tools: new Map([['search', {}]]) })).toBe('ok');
  });

  it('refuses a budget that is not positive, then one above what the parent has left', () => {
    expect(reasonOf({ budget_units: 0 })).toBe('budget_non_positive');
    expect(reasonOf({ budget_units: -1 })).toBe('budget_non_positive');
    expect(reasonOf({ budget_units: 50.5 })).toBe('budget_exceeds_parent');
    expect(reasonOf({}, { remainingUnits: null })).toBe('budget_exceeds_parent');
  });

  it('reports the first reason in SPEC order when several apply', () => {
    const everything: Partial<HandoffRequest> = {
      sub_agent_id: 'root.agent',
      delegable_tool_ids: ['publish'],
      budget_units: -5,
    };
    expect(reasonOf(everything, { trace: ['root.agent', 'b', 'c', 'd', 'e'] })).toBe('cycle_detected');
    expect(reasonOf({ ...everything, sub_agent_id: 'x' }, { trace: ['a', 'b', 'c', 'd', 'e'] })).toBe(
      'depth_cap_exceeded',
    );
    expect(reasonOf({ ...everything, sub_agent_id: 'x' })).toBe('authority_widening_rejected');
    expect(reasonOf({ budget_units: -5 }, { remainingUnits: null })).toBe('budget_non_positive');
  });
});
