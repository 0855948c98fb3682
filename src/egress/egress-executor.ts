import type { LookupFunction } from 'node:net';
import { Agent, request, type Dispatcher } from 'undici';
import { createAddressPolicy } from './address-policy.js';
import { CREDENTIAL_HEADERS, filterResponseHeaders } from './egress-headers.js';
import { guardHop, prepareRequest, type GuardContext, type GuardedHop, type OutgoingRequest } from './egress-guard.js';
import {
  DEFAULT_MAX_REDIRECTS,
  DEFAULT_MAX_RESPONSE_BYTES,
  DEFAULT_TIMEOUT_MS,
  MAX_REDIRECTS_CEILING,
  type EgressConfig,
  type EgressNarrowing,
  type EgressPolicy,
} from './egress-policy.js';
import { denied, failed, type EgressDenied, type EgressFailed, type EgressResult } from './egress-result.js';
import { ACCEPT_ENCODING, ResponseBodyError, decodeBody, readBody } from './response-body.js';
import { systemResolver, type ResolvedAddress } from './resolver.js';

/** The guard's verdict without sending anything: host and the addresses that passed. */
export type EgressCheck = { ok: true; host: string; addresses: string[] } | EgressDenied | EgressFailed;

/**
 * The built-in backend of `external_call` tools. `input` is the tool input as the agent
 * sent it, expected to be an `EgressInput`; anything else is refused as `input_invalid`.
 */
export interface EgressExecutor {
  /**
   * Runs the guard on the first hop only and sends nothing: for admission step 7 and dry runs.
   * `execute` checks again, since time (an approval, say) passes between the two.
   */
  check(input: unknown, policy: EgressPolicy, narrowing?: EgressNarrowing): Promise<EgressCheck>;
  /** Guards and sends the request, re-guarding every redirect hop; never throws for a network fault. */
  execute(input: unknown, policy: EgressPolicy, narrowing?: EgressNarrowing): Promise<EgressResult>;
}

const REDIRECT_STATUSES = new Set([301, 302, 303, 307, 308]);

interface Received {
  status: number;
  headers: Dispatcher.ResponseData['headers'];
  bytes: Buffer;
  decoded: boolean;
}

const first = (value: string | string[] | undefined) => (Array.isArray(value) ? value[0] : value);

/**
 * A `lookup` for the socket that answers only with the addresses the guard checked, so a resolver
 * that changes its answer between check and connect (DNS rebinding) is never asked again.
 */
function pinnedLookup(host: string, addresses: readonly ResolvedAddress[]): LookupFunction {
  return (hostname, options, callback) => {
    const usable = addresses.filter((entry) => !options.family || entry.family === options.family);
    if (hostname !== host || usable.length === 0) {
      const error: NodeJS.ErrnoException = new Error(`no checked address for ${hostname}`);
      error.code = 'ENOTFOUND';
      callback(error, []);
    } else if (options.all) {
      callback(null, usable);
    } else {
      callback(null, usable[0]!.address, usable[0]!.family);
    }
  };
}

/** Sends one hop through a dispatcher of its own, pinned to the hop's checked addresses. */
async function send(
  hop: GuardedHop,
  outgoing: OutgoingRequest,
  signal: AbortSignal,
  maxBytes: number,
): Promise<Received> {
  const dispatcher = new Agent({ connect: { lookup: pinnedLookup(hop.target.host, hop.addresses) } });
  try {
    const response = await request(hop.target.url, {
      dispatcher,
      method: outgoing.method as Dispatcher.HttpMethod,
      headers: { ...outgoing.headers, 'accept-encoding': ACCEPT_ENCODING },
      body: outgoing.body,
      signal,
    });
    const encoding = first(response.headers['content-encoding']);
    const { bytes, decoded } = await readBody(response.body, encoding, maxBytes);
    return { status: response.statusCode, headers: response.headers, bytes, decoded };
  } finally {
    await dispatcher.destroy();
  }
}

/**
 * The request a followed redirect makes, as browsers do: 303 (and 301/302 after POST) turn into a
 * body-less GET; 307/308 repeat method and body. `undefined` when there is nowhere to go.
 */
function redirected(outgoing: OutgoingRequest, received: Received, from: URL): OutgoingRequest | undefined {
  const location = first(received.headers.location);
  if (location === undefined) return undefined;
  const toGet =
    (received.status === 303 && outgoing.method !== 'HEAD') ||
    ((received.status === 301 || received.status === 302) && outgoing.method === 'POST');
  if (!toGet) return { ...outgoing, url: location, base: from };
  const { 'content-type': _contentType, ...headers } = outgoing.headers;
  return { url: location, base: from, method: 'GET', headers };
}

function withoutCredentials(outgoing: OutgoingRequest): OutgoingRequest {
  const headers = Object.fromEntries(
    Object.entries(outgoing.headers).filter(([name]) => !CREDENTIAL_HEADERS.includes(name)),
  );
  return { ...outgoing, headers };
}

/** Network faults become values; anything without an error code is a bug and is rethrown. */
function fault(error: unknown, signal: AbortSignal, timeoutMs: number): EgressFailed {
  if (signal.aborted) return failed('deadline_exceeded', { timeout_ms: timeoutMs });
  if (error instanceof ResponseBodyError) return failed(error.reason, error.details);
  const code = (error as { code?: unknown } | undefined)?.code;
  if (typeof code === 'string') return failed('connection_failed', { error_code: code });
  throw error;
}

/** Rejects as soon as `signal` aborts: the resolver cannot be cancelled, but it can be stopped waiting for. */
function untilAborted<T>(promise: Promise<T>, signal: AbortSignal): Promise<T> {
  return new Promise((resolve, reject) => {
    const abort = () => reject(signal.reason);
    if (signal.aborted) return abort();
    signal.addEventListener('abort', abort, { once: true });
    promise.then(resolve, reject).finally(() => signal.removeEventListener('abort', abort));
  });
}

const withHop = <T extends EgressDenied | EgressFailed>(result: T, hop: number): T => ({
  ...result,
  details: { hop, ...result.details },
});

/**
 * Builds the egress executor. Throws if an exception CIDR is invalid: a boot-time
 * configuration fault, never a per-call one.
 */
export function createEgressExecutor(config: EgressConfig): EgressExecutor {
  const context: GuardContext = {
    resolver: config.resolver ?? systemResolver,
    addressPolicy: createAddressPolicy(config.allowCidrs),
  };

  return {
    async check(input, policy, narrowing = {}) {
      const prepared = prepareRequest(input, policy);
      if (!prepared.ok) return prepared;
      const timeoutMs = policy.timeout_ms ?? DEFAULT_TIMEOUT_MS;
      const signal = AbortSignal.timeout(timeoutMs);
      try {
        const guarded = await untilAborted(guardHop(prepared.request, policy, narrowing, context), signal);
        if (!guarded.ok) return withHop(guarded, 0);
        const { target, addresses } = guarded.hop;
        return { ok: true, host: target.host, addresses: addresses.map((entry) => entry.address) };
      } catch (error) {
        return fault(error, signal, timeoutMs);
      }
    },

    async execute(input, policy, narrowing = {}) {
      const prepared = prepareRequest(input, policy);
      if (!prepared.ok) return prepared;
      const timeoutMs = policy.timeout_ms ?? DEFAULT_TIMEOUT_MS;
      const maxBytes = policy.max_response_bytes ?? DEFAULT_MAX_RESPONSE_BYTES;
      const maxRedirects = Math.min(policy.max_redirects ?? DEFAULT_MAX_REDIRECTS, MAX_REDIRECTS_CEILING);
      const signal = AbortSignal.timeout(timeoutMs);

      let outgoing = prepared.request;
      let previous: URL | undefined;
      try {
        for (let hop = 0; ; hop += 1) {
          const guarded = await untilAborted(guardHop(outgoing, policy, narrowing, context), signal);
          if (!guarded.ok) return withHop(guarded, hop);
          const url = guarded.hop.target.url;
          // As fetch does: credentials never follow a redirect to another origin.
          if (previous && url.origin !== previous.origin) outgoing = withoutCredentials(outgoing);

          const received = await send(guarded.hop, outgoing, signal, maxBytes);
          const next =
            policy.follow_redirects && REDIRECT_STATUSES.has(received.status)
              ? redirected(outgoing, received, url)
              : undefined;
          if (!next) {
            const headers = filterResponseHeaders(received.headers, received.decoded);
            const body = decodeBody(received.bytes, headers['content-type']);
            return { ok: true, output: { status: received.status, headers, body } };
          }
          if (hop >= maxRedirects) {
            return denied('redirect_limit_exceeded', { hop, origin: url.origin, max_redirects: maxRedirects });
          }
          previous = url;
          outgoing = next;
        }
      } catch (error) {
        return fault(error, signal, timeoutMs);
      }
    },
  };
}
