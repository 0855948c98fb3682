import net from 'node:net';
import { CLOUD_METADATA_HOSTS } from './cloud-metadata.js';
import { DEFAULT_METHODS, DEFAULT_SCHEMES, type EgressNarrowing, type EgressPolicy } from './egress-policy.js';
import { denied, type EgressDenied } from './egress-result.js';
import { finishHost, matchesHostPatterns } from './host-allowlist.js';

/** The only schemes the executor speaks, whatever a policy lists. */
const SUPPORTED_SCHEMES = ['http', 'https'];
/** CONNECT and TRACE are not tool calls; anything unknown is refused rather than passed through. */
const SUPPORTED_METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'];

/** Characters parsers silently drop or read differently (URL-confusion SSRF): refused, never repaired. */
// eslint-disable-next-line no-control-regex -- control characters are the ambiguity refused here
const AMBIGUOUS = /[\u0000-\u0020\u007f\\]/;
/** `scheme://host…` or, against a base, `//host…`: the authority spelled out and not empty. */
const AUTHORITY = /^(?:[a-z][a-z0-9+.-]*:)?\/\/([^/?#]+)/i;
/** A reference that names its own scheme or host, rather than a path on the base's. */
const NAMES_ORIGIN = /^(?:[a-z][a-z0-9+.-]*:|\/\/)/i;

/** A URL that passed the guard, with the host as it will be resolved and sent. */
export interface UrlTarget {
  /** Trailing dot dropped from the host, fragment dropped. */
  url: URL;
  /** Lower case, punycode; IPv6 without brackets. */
  host: string;
  ipLiteral: boolean;
  /** Upper case. */
  method: string;
}

export type UrlVerdict = { ok: true; target: UrlTarget } | EgressDenied;

const lower = (values: readonly string[]) => values.map((value) => value.toLowerCase().replace(/:$/, ''));

/**
 * Checks a URL and method against the tool's egress policy and the grant's narrowing, in the egress
 * guard's order (addresses are `resolveAndCheck`'s). `base` resolves a redirect's `Location`.
 */
export function checkUrl(
  raw: string,
  method: string,
  policy: EgressPolicy,
  narrowing: EgressNarrowing = {},
  base?: URL,
): UrlVerdict {
  if (AMBIGUOUS.test(raw)) return denied('url_ambiguous');
  let url: URL;
  try {
    url = new URL(raw, base);
  } catch {
    return denied('url_unparseable');
  }
  const origin = url.origin;

  const scheme = url.protocol.slice(0, -1);
  const schemes = lower(policy.schemes ?? DEFAULT_SCHEMES);
  if (!SUPPORTED_SCHEMES.includes(scheme) || !schemes.includes(scheme)) {
    return denied('scheme_not_allowed', { origin, scheme, allowed: schemes });
  }
  // `http:host`, `http:/host` and `http:///host` parse as `http://host`: a repair, so refused.
  if ((!base || NAMES_ORIGIN.test(raw)) && !AUTHORITY.test(raw)) return denied('url_ambiguous', { origin });

  const verb = method.toUpperCase();
  const methods = (policy.methods ?? DEFAULT_METHODS).map((value) => value.toUpperCase());
  if (!SUPPORTED_METHODS.includes(verb) || !methods.includes(verb)) {
    return denied('method_not_allowed', { origin, method: verb, allowed: methods });
  }

  // `http://@host` parses to an empty user; the raw authority still shows the intent.
  const authority = raw.match(AUTHORITY)?.[1] ?? '';
  if (url.username !== '' || url.password !== '' || authority.includes('@')) {
    return denied('credentials_in_url', { origin });
  }

  const host = finishHost(url.hostname);
  if (host === undefined) return denied('host_invalid', { origin });
  if (CLOUD_METADATA_HOSTS.includes(host)) {
    return denied('host_not_allowed', { origin, host, classification: 'cloud_metadata' });
  }
  if (!matchesHostPatterns(host, policy.allowed_hosts)) return denied('host_not_allowed', { origin, host });
  if (narrowing.egress_domains && !matchesHostPatterns(host, narrowing.egress_domains)) {
    return denied('host_not_in_grant', { origin, host });
  }

  const ipLiteral = net.isIP(host) !== 0;
  if (!ipLiteral) url.hostname = host;
  url.hash = '';
  return { ok: true, target: { url, host, ipLiteral, method: verb } };
}
