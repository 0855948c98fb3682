import semver from 'semver';
import { isDeprecatedAt, type ToolContract } from './tool-contract.js';
import { pickVersion } from './version-resolution.js';

/** A tool version that still declares a dependency the deprecated version satisfies. */
export interface Dependent {
  tool_id: string;
  version: string;
  range: string;
  /** What the range resolves to today; null when nothing usable is left for it. */
  resolves_to: string | null;
}

/** One deprecated version as a registry reviewer sees it. */
export interface DeprecationNotice {
  tool_id: string;
  version: string;
  deprecated_at: string;
  replacement_tool_id: string | null;
  /** False while the deprecation is only scheduled. */
  in_effect: boolean;
  dependents: Dependent[];
}

/**
 * The deprecations whose date falls within the window (recent ones and scheduled ones), oldest
 * first, each with its replacement and the live tool versions whose dependency ranges still
 * cover it: the payload a reviewer checks before a release.
 */
export function surfaceDeprecations(
  tools: readonly ToolContract[],
  window: { from: Date; to: Date },
  now: Date,
): DeprecationNotice[] {
  const byId = new Map<string, ToolContract[]>();
  for (const tool of tools) byId.set(tool.id, [...(byId.get(tool.id) ?? []), tool]);
  const live = tools.filter((tool) => !isDeprecatedAt(tool, now));
  const notices: DeprecationNotice[] = [];
  for (const tool of tools) {
    if (tool.deprecation === null) continue;
    const at = Date.parse(tool.deprecation.deprecated_at);
    if (at < window.from.getTime() || at > window.to.getTime()) continue;
    const dependents: Dependent[] = [];
    for (const dependent of live) {
      for (const dependency of dependent.dependencies) {
        if (dependency.tool_id !== tool.id || !semver.satisfies(tool.version, dependency.range)) continue;
        const candidates = (byId.get(tool.id) ?? []).map((t) => ({
          version: t.version,
          deprecated: isDeprecatedAt(t, now),
        }));
        const resolved = pickVersion(candidates, dependency.range);
        dependents.push({
          tool_id: dependent.id,
          version: dependent.version,
          range: dependency.range,
          resolves_to: resolved?.version ?? null,
        });
      }
    }
    notices.push({
      tool_id: tool.id,
      version: tool.version,
      deprecated_at: tool.deprecation.deprecated_at,
      replacement_tool_id: tool.deprecation.replacement_tool_id,
      in_effect: at <= now.getTime(),
      dependents,
    });
  }
  return notices.sort(
    (x, y) => Date.parse(x.deprecated_at) - Date.parse(y.deprecated_at) || x.tool_id.localeCompare(y.tool_id),
  );
}
