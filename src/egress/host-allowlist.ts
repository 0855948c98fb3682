import net from 'node:net';

const LABEL = /^(?!-)[a-z0-9_-]{1,63}(?<!-)$/;

/**
 * Finishes a host name as the WHATWG URL parser left it (lower case, IDNA to punycode, IPv4 in
 * dotted decimal, IPv6 in brackets): drops the brackets and one trailing dot, and checks the
 * labels. Returns `undefined` for anything that is not a usable host, such as `a..b` or `*.x`.
 */
export function finishHost(hostname: string): string | undefined {
  if (hostname.startsWith('[') && hostname.endsWith(']')) return hostname.slice(1, -1);
  const name = hostname.endsWith('.') ? hostname.slice(0, -1) : hostname;
  if (net.isIPv4(name)) return name;
  if (name.length === 0 || name.length > 253) return undefined;
  return name.split('.').every((label) => LABEL.test(label)) ? name : undefined;
}

/** Normalises a host as written in a policy, the same way a URL's host is. */
function normaliseHost(text: string): string | undefined {
  const bare = text.startsWith('[') && text.endsWith(']') ? text.slice(1, -1) : text;
  const ipv6 = net.isIPv6(bare);
  // A policy entry is a host, nothing more: the URL parser would silently drop a port, path or user.
  if (!ipv6 && /[\s/\\?#@:%[\]]/.test(bare)) return undefined;
  try {
    return finishHost(new URL(ipv6 ? `http://[${bare}]/` : `http://${bare}/`).hostname);
  } catch {
    return undefined;
  }
}

/** One normalised entry of `allowed_hosts` or `egress_domains`. */
type HostPattern = { kind: 'any' } | { kind: 'exact'; host: string } | { kind: 'subdomains'; of: string };

function parsePattern(text: string): HostPattern | undefined {
  const trimmed = text.trim();
  if (trimmed === '*') return { kind: 'any' };
  if (trimmed.startsWith('*.')) {
    const of = normaliseHost(trimmed.slice(2));
    return of && !net.isIP(of) ? { kind: 'subdomains', of } : undefined;
  }
  const host = normaliseHost(trimmed);
  return host ? { kind: 'exact', host } : undefined;
}

/**
 * Names that `"*"` ("any public host") never covers: single-label names (the resolver's search
 * domains turn them into internal names) and special-use domains that only exist inside a site.
 * An operator may still list one of them explicitly; its addresses are checked either way.
 */
function isSiteLocalName(host: string): boolean {
  if (net.isIP(host)) return false;
  return (
    !host.includes('.') ||
    host === 'localhost' ||
    ['.localhost', '.local', '.internal', '.home.arpa'].some((suffix) => host.endsWith(suffix))
  );
}

/**
 * Whether a finished host matches a list of patterns: exact hosts, `*.example.com` (subdomains
 * of example.com, not example.com itself) or `*` (any public host). Entries that do not normalise
 * to a host match nothing, so a mistyped allowlist fails closed.
 */
export function matchesHostPatterns(host: string, patterns: readonly string[]): boolean {
  return patterns.some((text) => {
    const pattern = parsePattern(text);
    switch (pattern?.kind) {
      case 'any':
        return !isSiteLocalName(host);
      case 'exact':
        return pattern.host === host;
      case 'subdomains':
        return !net.isIP(host) && host.endsWith(`.${pattern.of}`);
      default:
        return false;
    }
  });
}
