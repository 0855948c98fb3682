import { describe, expect, it } from 'vitest';
import { resolveDependencies, type DependencyNode } from '../../src/registry/dependency-resolution.js';

const node = (
  tool_id: string,
  version: string,
  dependencies: Array<[string, string]> = [],
  deprecated = false,
): DependencyNode => ({
  tool_id,
  version,
  deprecated,
  dependencies: dependencies.map(([id, range]) => ({ tool_id: id, range })),
});

function lookupOf(nodes: DependencyNode[]) {
  return (toolId: string) => nodes.filter((n) => n.tool_id === toolId);
}

describe('dependency resolution', () => {
  it('resolves transitively, each version once, in declaration order', () => {
    const nodes = [
      node('a', '1.0.0', [
        ['b', '^1'],
        ['c', '^2'],
      ]),
      node('b', '1.0.0'),
      node('b', '1.4.0', [['c', '>=2.0.0']]),
      node('c', '2.0.0'),
      node('c', '2.3.0', [['d', '1.0.0']]),
      node('d', '1.0.0'),
    ];
    const result = resolveDependencies(nodes[0]!, lookupOf(nodes));
    expect(result).toEqual({
      ok: true,
      resolved: [
        { tool_id: 'b', version: '1.4.0', range: '^1', required_by: { tool_id: 'a', version: '1.0.0' } },
        { tool_id: 'c', version: '2.3.0', range: '^2', required_by: { tool_id: 'a', version: '1.0.0' } },
        { tool_id: 'd', version: '1.0.0', range: '1.0.0', required_by: { tool_id: 'c', version: '2.3.0' } },
      ],
    });
  });

  it('names an unknown tool with reason unknown_tool and where it was required', () => {
    const nodes = [node('a', '1.0.0', [['b', '^1']]), node('b', '1.0.0', [['ghost', '^1']])];
    expect(resolveDependencies(nodes[0]!, lookupOf(nodes))).toEqual({
      ok: false,
      unsatisfied: {
        tool_id: 'ghost',
        range: '^1',
        reason: 'unknown_tool',
        required_by: { tool_id: 'b', version: '1.0.0' },
      },
    });
  });

  it('names a range no usable version satisfies with reason semver_range_no_match', () => {
    const nodes = [node('a', '1.0.0', [['b', '^2']]), node('b', '1.0.0'), node('b', '2.0.0', [], true)];
    const result = resolveDependencies(nodes[0]!, lookupOf(nodes));
    expect(result.ok).toBe(false);
    if (!result.ok)
      expect(result.unsatisfied).toMatchObject({ tool_id: 'b', range: '^2', reason: 'semver_range_no_match' });
  });

  it('lets an exact pin reach a deprecated version', () => {
    const nodes = [node('a', '1.0.0', [['b', '2.0.0']]), node('b', '2.0.0', [], true)];
    expect(resolveDependencies(nodes[0]!, lookupOf(nodes))).toMatchObject({
      ok: true,
      resolved: [{ tool_id: 'b', version: '2.0.0' }],
    });
  });

  it('terminates on cycles', () => {
    const nodes = [node('a', '1.0.0', [['b', '^1']]), node('b', '1.0.0', [['a', '^1']])];
    expect(resolveDependencies(nodes[0]!, lookupOf(nodes))).toEqual({
      ok: true,
      resolved: [{ tool_id: 'b', version: '1.0.0', range: '^1', required_by: { tool_id: 'a', version: '1.0.0' } }],
    });
  });

  it('resolves a version without dependencies to the empty set', () => {
    expect(resolveDependencies(node('a', '1.0.0'), () => [])).toEqual({ ok: true, resolved: [] });
  });
});
