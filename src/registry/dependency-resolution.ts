import { isDeprecatedAt, type ToolContract, type ToolDependency } from './tool-contract.js';
import { pickVersion, type VersionCandidate } from './version-resolution.js';

/** Why a dependency cannot be met. */
export type DependencyReason = 'unknown_tool' | 'semver_range_no_match';

/** A registered version as the dependency walk sees it. */
export interface DependencyNode extends VersionCandidate {
  tool_id: string;
  dependencies: readonly ToolDependency[];
}

export interface VersionRef {
  tool_id: string;
  version: string;
}

export interface UnsatisfiedDependency {
  tool_id: string;
  range: string;
  reason: DependencyReason;
  required_by: VersionRef;
}

export type DependencyResolution =
  | { ok: true; resolved: Array<VersionRef & { range: string; required_by: VersionRef }> }
  | { ok: false; unsatisfied: UnsatisfiedDependency };

/** A registered version as the walk sees it at `now`. */
export function dependencyNodeOf(tool: ToolContract, now: Date): DependencyNode {
  return {
    tool_id: tool.id,
    version: tool.version,
    deprecated: isDeprecatedAt(tool, now),
    dependencies: tool.dependencies,
  };
}

/** The versions registered under a tool id (any order); empty when the id is unknown. */
export type VersionLookup = (toolId: string) => readonly DependencyNode[];

/** Resolves one dependency the way a call would: newest non-deprecated match, exact pins allowed. */
export function resolveDependency(
  dependency: ToolDependency,
  lookup: VersionLookup,
): { ok: true; node: DependencyNode } | { ok: false; reason: DependencyReason } {
  const versions = lookup(dependency.tool_id);
  if (versions.length === 0) return { ok: false, reason: 'unknown_tool' };
  const node = pickVersion(versions, dependency.range);
  return node ? { ok: true, node } : { ok: false, reason: 'semver_range_no_match' };
}

/**
 * Walks the dependency graph from a version, depth first in declaration order, and returns
 * every version it pulls in, or the first dependency that cannot be met with its typed reason.
 * Each version is visited once, so cycles terminate.
 */
export function resolveDependencies(root: DependencyNode, lookup: VersionLookup): DependencyResolution {
  const resolved: Array<VersionRef & { range: string; required_by: VersionRef }> = [];
  const visited = new Set<string>([`${root.tool_id}@${root.version}`]);
  const stack: DependencyNode[] = [root];
  while (stack.length > 0) {
    const node = stack.pop()!;
    const next: DependencyNode[] = [];
    for (const dependency of node.dependencies) {
      const requiredBy = { tool_id: node.tool_id, version: node.version };
      const result = resolveDependency(dependency, lookup);
      if (!result.ok) {
        return {
          ok: false,
          unsatisfied: {
            tool_id: dependency.tool_id,
            range: dependency.range,
            reason: result.reason,
            required_by: requiredBy,
          },
        };
      }
      const key = `${result.node.tool_id}@${result.node.version}`;
      if (visited.has(key)) continue;
      visited.add(key);
      resolved.push({
        tool_id: result.node.tool_id,
        version: result.node.version,
        range: dependency.range,
        required_by: requiredBy,
      });
      next.push(result.node);
    }
    // Reversed so that the first declared dependency is walked first.
    stack.push(...next.reverse());
  }
  return { ok: true, resolved };
}
