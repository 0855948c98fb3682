import type { AddressPolicy } from './address-policy.js';
import { checkRequestHeaders } from './egress-headers.js';
import type { EgressNarrowing, EgressPolicy } from './egress-policy.js';
import { denied, type EgressDenied, type EgressFailed } from './egress-result.js';
import { resolveAndCheck, type ResolvedAddress, type Resolver } from './resolver.js';
import { checkUrl, type UrlTarget } from './url-guard.js';

/** One request as the executor sends it; a redirect produces the next one. */
export interface OutgoingRequest {
  /** Raw, as the caller or the `Location` header wrote it; resolved against `base` when relative. */
  url: string;
  base?: URL;
  method: string;
  headers: Record<string, string>;
  body?: string;
}

/** A hop the guard admitted: where to send it, and the only addresses the socket may use. */
export interface GuardedHop {
  target: UrlTarget;
  addresses: ResolvedAddress[];
}

/** What the guard needs besides the request: built once per executor. */
export interface GuardContext {
  resolver: Resolver;
  addressPolicy: AddressPolicy;
}

const isRecord = (value: unknown): value is Record<string, unknown> =>
  typeof value === 'object' && value !== null && !Array.isArray(value);

/**
 * Turns a tool input into the first request: shape checked (the tool's own input schema may be
 * loose), headers filtered, body serialised (a string as is, anything else as JSON). GET and
 * HEAD carry no body. The URL itself is checked per hop by `guardHop`.
 */
export function prepareRequest(
  input: unknown,
  policy: EgressPolicy,
): { ok: true; request: OutgoingRequest } | EgressDenied {
  if (!isRecord(input) || typeof input.url !== 'string') return denied('input_invalid', { field: 'url' });
  if (!(input.method === undefined || typeof input.method === 'string')) {
    return denied('input_invalid', { field: 'method' });
  }
  if (!(input.headers === undefined || isRecord(input.headers))) {
    return denied('input_invalid', { field: 'headers' });
  }
  const method = (input.method ?? 'GET').toUpperCase();

  const checked = checkRequestHeaders((input.headers ?? {}) as Record<string, string>, policy);
  if (!checked.ok) return checked;
  const headers = checked.headers;

  let body: string | undefined;
  if (input.body !== undefined) {
    if (method === 'GET' || method === 'HEAD') return denied('body_not_allowed', { method });
    if (typeof input.body === 'string') {
      body = input.body;
    } else {
      body = JSON.stringify(input.body);
      headers['content-type'] ??= 'application/json';
    }
  }
  return { ok: true, request: { url: input.url, method, headers, body } };
}

/**
 * The guard for one hop, from scratch: the URL against the policy and the grant, then every
 * address the host resolves to against the address policy.
 */
export async function guardHop(
  request: OutgoingRequest,
  policy: EgressPolicy,
  narrowing: EgressNarrowing,
  context: GuardContext,
): Promise<{ ok: true; hop: GuardedHop } | EgressDenied | EgressFailed> {
  const checked = checkUrl(request.url, request.method, policy, narrowing, request.base);
  if (!checked.ok) return checked;
  const { target } = checked;
  const { resolver, addressPolicy } = context;
  const resolved = await resolveAndCheck(target.host, target.ipLiteral, resolver, addressPolicy);
  if (!resolved.ok) return { ...resolved, details: { origin: target.url.origin, ...resolved.details } };
  return { ok: true, hop: { target, addresses: resolved.addresses } };
}
