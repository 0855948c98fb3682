import { describe, expect, it } from 'vitest';
import { intersectHostPatterns, narrowestModifiers, wideningIn } from '../../src/grants/authority-envelope.js';

describe('an authority envelope only narrows (wideningIn)', () => {
  const at = 'capability_modifiers';

  it('accepts equal or smaller numbers, refuses larger ones', () => {
    expect(wideningIn({ max_cost_units: 3 }, { max_cost_units: 5 }, at)).toBeUndefined();
    expect(wideningIn({ max_cost_units: 5 }, { max_cost_units: 5 }, at)).toBeUndefined();
    expect(wideningIn({ max_cost_units: 6 }, { max_cost_units: 5 }, at)).toBe('capability_modifiers.max_cost_units');
  });

  it('accepts subsets of lists, refuses an element the parent does not have', () => {
    expect(wideningIn({ scopes: ['a'] }, { scopes: ['a', 'b'] }, at)).toBeUndefined();
    expect(wideningIn({ scopes: ['a', 'c'] }, { scopes: ['a', 'b'] }, at)).toBe('capability_modifiers.scopes.1');
  });

  it('reads egress_domains as host patterns: a subdomain narrows a wildcard', () => {
    expect(
      wideningIn({ egress_domains: ['api.un.org', '*.x.un.org'] }, { egress_domains: ['*.un.org'] }, at),
    ).toBeUndefined();
    expect(wideningIn({ egress_domains: ['*'] }, { egress_domains: ['*.un.org'] }, at)).toBe(
      'capability_modifiers.egress_domains.0',
    );
  });

  it('wants strings and booleans equal', () => {
    expect(wideningIn({ tone: 'calm' }, { tone: 'calm' }, at)).toBeUndefined();
    expect(wideningIn({ tone: 'bold' }, { tone: 'calm' }, at)).toBe('capability_modifiers.tone');
    expect(wideningIn({ publish: true }, { publish: false }, at)).toBe('capability_modifiers.publish');
  });

  it('compares objects key by key, recursively', () => {
    expect(
      wideningIn({ limits: { calls: 2, memory: ['a'] } }, { limits: { calls: 3, memory: ['a', 'b'] } }, at),
    ).toBeUndefined();
    expect(wideningIn({ limits: { calls: 4 } }, { limits: { calls: 3 } }, at)).toBe(
      'capability_modifiers.limits.calls',
    );
  });

  it('treats a key the parent does not set as unbounded, and dropping one the parent sets as widening', () => {
    expect(wideningIn({ max_cost_units: 1000 }, {}, at)).toBeUndefined();
    expect(wideningIn({}, { max_cost_units: 2 }, at)).toBe('capability_modifiers.max_cost_units');
  });

  it('refuses a value of another type', () => {
    expect(wideningIn({ max_cost_units: '1' }, { max_cost_units: 2 }, at)).toBe('capability_modifiers.max_cost_units');
    expect(wideningIn({ scopes: 'a' }, { scopes: ['a'] }, at)).toBe('capability_modifiers.scopes');
  });
});

describe('a sub-run call runs under the narrower of its grant and its envelope', () => {
  it('takes the smaller cost cap and the hosts both admit', () => {
    expect(
      narrowestModifiers(
        { max_cost_units: 5, egress_domains: ['*.un.org', 'example.com'] },
        { max_cost_units: 2, egress_domains: ['api.un.org'] },
      ),
    ).toEqual({
      max_cost_units: 2,
      egress_domains: ['api.un.org'],
    });
  });

  it('keeps a modifier only one side sets', () => {
    expect(narrowestModifiers({}, { max_cost_units: 2 })).toEqual({ max_cost_units: 2 });
    expect(narrowestModifiers({ egress_domains: ['a.com'] }, {})).toEqual({ egress_domains: ['a.com'] });
  });

  it('admits no host when the two lists are disjoint', () => {
    expect(intersectHostPatterns(['*.un.org'], ['example.com'])).toEqual([]);
  });
});
