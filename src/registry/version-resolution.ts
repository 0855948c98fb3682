import semver from 'semver';

/** One registered version as resolution sees it. */
export interface VersionCandidate {
  version: string;
  /** Deprecated and in effect now (a scheduled deprecation does not count yet). */
  deprecated: boolean;
}

/** The exact version a range names (`1.2.0`, `=1.2.0`, `v1.2.0`), or undefined for a real range. */
export function exactVersionOf(range: string): string | undefined {
  const trimmed = range.trim();
  return semver.valid(trimmed.startsWith('=') ? trimmed.slice(1).trim() : trimmed) ?? undefined;
}

/**
 * The version to run: no range, the newest non-deprecated release (a pre-release only if no release is left); an exact
 * version, even deprecated; a range, its newest non-deprecated match. Else undefined.
 */
export function pickVersion<T extends VersionCandidate>(candidates: readonly T[], range?: string): T | undefined {
  if (range !== undefined) {
    const exact = exactVersionOf(range);
    if (exact !== undefined) return candidates.find((c) => c.version === exact);
    if (semver.validRange(range) === null) return undefined;
  }
  const usable = candidates.filter((c) => !c.deprecated);
  const byVersion = new Map(usable.map((c) => [c.version, c]));
  const versions = usable.map((c) => c.version);
  const best =
    range === undefined
      ? (semver.maxSatisfying(versions, '*') ?? semver.rsort([...versions])[0])
      : semver.maxSatisfying(versions, range);
  return best === null || best === undefined ? undefined : byVersion.get(best);
}

/** Newest first, by semver precedence. */
export function newestFirst<T extends { version: string }>(items: readonly T[]): T[] {
  return [...items].sort((a, b) => semver.rcompare(a.version, b.version));
}
