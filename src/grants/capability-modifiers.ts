import { z } from 'zod';
import { positiveUnits } from '../validation/values.js';
import type { CapabilityModifiers } from './grant.js';
import type { ToolFacts } from './tool-facts.js';

const LABEL = '(?!-)[a-z0-9_-]{1,63}(?<!-)';
const HOST = `${LABEL}(?:\\.${LABEL})*`;
const HOST_PATTERN = new RegExp(`^(?:\\*|(?:\\*\\.)?${HOST})$`);

/**
 * The modifiers a grant may carry. Closed: a modifier the gateway cannot enforce is refused
 * rather than stored and silently ignored.
 */
export const capabilityModifiersSchema = z.strictObject({
  egress_domains: z
    .array(
      z
        .string()
        .max(253)
        .transform((host) => host.trim().toLowerCase())
        .refine((host) => HOST_PATTERN.test(host), 'must be a host, `*.example.com` or `*`'),
    )
    .max(100)
    .optional(),
  max_cost_units: positiveUnits.optional(),
});

export type ModifierCheck = { ok: true } | { ok: false; field: string; message: string };

/**
 * Modifiers only narrow what the tool contract allows. `egress_domains` needs a tool
 * with an egress allowlist and every entry must lie inside it; `max_cost_units` is a cap, which
 * can only narrow.
 */
export function checkModifiersWithinTool(
  modifiers: CapabilityModifiers,
  tool: Pick<ToolFacts, 'egress'>,
): ModifierCheck {
  if (modifiers.egress_domains !== undefined) {
    const allowed = tool.egress?.allowed_hosts;
    if (!allowed) {
      return {
        ok: false,
        field: 'body.capability_modifiers.egress_domains',
        message: 'the tool makes no external calls, so it has no egress to narrow',
      };
    }
    for (const [index, domain] of modifiers.egress_domains.entries()) {
      if (!allowed.some((outer) => hostPatternCovers(outer.trim().toLowerCase(), domain))) {
        return {
          ok: false,
          field: `body.capability_modifiers.egress_domains.${index}`,
          message: `${domain} is wider than the tool's allowed_hosts (${allowed.join(', ')})`,
        };
      }
    }
  }
  return { ok: true };
}

/**
 * Whether every host `inner` admits is admitted by `outer`. Patterns are exact hosts,
 * `*.example.com` (subdomains, not the apex) or `*` (any host).
 */
export function hostPatternCovers(outer: string, inner: string): boolean {
  if (outer === '*') return true;
  if (inner === '*') return false;
  if (!outer.startsWith('*.')) return inner === outer;
  const suffix = outer.slice(1); // ".example.com"
  const innerHost = inner.startsWith('*.') ? inner.slice(2) : inner;
  return innerHost.endsWith(suffix) || (inner.startsWith('*.') && innerHost === outer.slice(2));
}
