import { isDeepStrictEqual } from 'node:util';
import { hostPatternCovers } from './capability-modifiers.js';
import type { CapabilityModifiers } from './grant.js';

/**
 * Where `child` widens `parent`, as a path (`capability_modifiers.max_cost_units`), else undefined: numbers may not
 * grow, lists must be subsets (host patterns by coverage), the rest equal; a limit the parent sets must stay set.
 */
export function wideningIn(child: unknown, parent: unknown, path: string): string | undefined {
  if (parent === undefined) return undefined;
  if (child === undefined || child === null) return parent === null ? undefined : path;
  if (typeof parent === 'number') return typeof child === 'number' && child <= parent ? undefined : path;
  if (typeof parent === 'string' || typeof parent === 'boolean' || parent === null)
    return child === parent ? undefined : path;
  if (Array.isArray(parent)) {
    if (!Array.isArray(child)) return path;
    const hostPatterns = path.endsWith('.egress_domains');
    const index = child.findIndex((item) =>
      hostPatterns && typeof item === 'string'
        ? !parent.some((outer) => typeof outer === 'string' && hostPatternCovers(outer, item))
        : !parent.some((outer) => isDeepStrictEqual(outer, item)),
    );
    return index === -1 ? undefined : `${path}.${index}`;
  }
  if (typeof parent === 'object') {
    if (typeof child !== 'object' || Array.isArray(child)) return path;
    for (const [key, value] of Object.entries(parent as Record<string, unknown>)) {
      const found = wideningIn((child as Record<string, unknown>)[key], value, `${path}.${key}`);
      if (found) return found;
    }
    return undefined;
  }
  return path;
}

/**
 * The modifiers a sub-run's call runs under: its own grant's and its envelope's, whichever is
 * narrower for each: its authority is the intersection of the two.
 */
export function narrowestModifiers(grant: CapabilityModifiers, envelope: CapabilityModifiers): CapabilityModifiers {
  const merged: CapabilityModifiers = { ...envelope, ...grant };
  if (grant.max_cost_units !== undefined && envelope.max_cost_units !== undefined) {
    merged.max_cost_units = Math.min(grant.max_cost_units, envelope.max_cost_units);
  }
  if (grant.egress_domains !== undefined && envelope.egress_domains !== undefined) {
    merged.egress_domains = intersectHostPatterns(grant.egress_domains, envelope.egress_domains);
  }
  return merged;
}

/** The host patterns both lists admit. Patterns either nest or are disjoint, so this is exact. */
export function intersectHostPatterns(a: readonly string[], b: readonly string[]): string[] {
  const both = new Set<string>();
  for (const p of a) if (b.some((q) => hostPatternCovers(q, p))) both.add(p);
  for (const q of b) if (a.some((p) => hostPatternCovers(p, q))) both.add(q);
  return [...both];
}
