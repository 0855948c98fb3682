import type { IncomingHttpHeaders } from 'node:http';
import type { EgressPolicy } from './egress-policy.js';
import { denied, type EgressDenied } from './egress-result.js';

/** RFC 9110 §7.6.1 connection-specific fields, plus the proxy ones: they describe one hop only. */
const HOP_BY_HOP = [
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
];

/** Framing the gateway does itself; a caller's value is dropped, not forwarded. */
const GATEWAY_OWNED = ['content-length', 'accept-encoding', 'expect', 'http2-settings'];

/**
 * Refused outright because sending them is a way around the guard: `host` picks a virtual host the
 * allowlist never saw, and the proxy credentials address infrastructure, not the destination.
 */
const REFUSED = ['host', 'proxy-authorization'];

/** Credentials; only with `allow_credential_headers`, and never across origins on a redirect. */
export const CREDENTIAL_HEADERS = ['authorization', 'cookie'];

/** Cookies are state the gateway must not hand an agent, nor keep for it. */
const RESPONSE_DROPPED = ['set-cookie', 'set-cookie2'];

const TOKEN = /^[!#$%&'*+.^_`|~0-9a-z-]+$/;
const FIELD_VALUE = /^[\t\u0020-\u007e\u0080-\u00ff]*$/;

export type RequestHeaders = { ok: true; headers: Record<string, string> } | EgressDenied;

/**
 * Checks and filters a caller's request headers: names lower-cased; hop-by-hop and gateway-owned
 * fields dropped; `host`, proxy credentials and (unless the policy allows them) `authorization`
 * and `cookie` refused; malformed names or values (CR/LF injection) refused as invalid input.
 */
export function checkRequestHeaders(headers: Record<string, string>, policy: EgressPolicy): RequestHeaders {
  const kept: Record<string, string> = {};
  for (const [rawName, value] of Object.entries(headers)) {
    const name = rawName.toLowerCase();
    if (!TOKEN.test(name) || typeof value !== 'string' || !FIELD_VALUE.test(value)) {
      return denied('input_invalid', { header: name });
    }
    if (REFUSED.includes(name) || (CREDENTIAL_HEADERS.includes(name) && !policy.allow_credential_headers)) {
      return denied('header_not_allowed', { header: name });
    }
    if (HOP_BY_HOP.includes(name) || GATEWAY_OWNED.includes(name)) continue;
    kept[name] = value;
  }
  return { ok: true, headers: kept };
}

/**
 * The response headers an agent gets: without cookies, hop-by-hop fields (and any the response's
 * own `Connection` names), and, when the body was decoded, the encoding and length of the wire
 * form. Repeated fields are joined with `, `.
 */
export function filterResponseHeaders(headers: IncomingHttpHeaders, decoded: boolean): Record<string, string> {
  const connection = String(headers.connection ?? '')
    .split(',')
    .map((name) => name.trim().toLowerCase());
  const dropped = new Set([...HOP_BY_HOP, ...RESPONSE_DROPPED, ...connection]);
  if (decoded) for (const name of ['content-encoding', 'content-length']) dropped.add(name);

  const kept: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined || dropped.has(name.toLowerCase())) continue;
    kept[name.toLowerCase()] = Array.isArray(value) ? value.join(', ') : value;
  }
  return kept;
}
