import type { Resolver } from './resolver.js';

/**
 * The `egress` block of an `external_call` tool contract: where the gateway's
 * egress executor may go on the tool's behalf, and how far.
 */
export interface EgressPolicy {
  /** Exact hosts, `*.example.com` (subdomains only, not the apex) or `"*"` for any public host. */
  allowed_hosts: string[];
  /** URL schemes; default `["https"]`. Only `http` and `https` can ever be used. */
  schemes?: string[];
  /** HTTP methods; default `["GET"]`. */
  methods?: string[];
  /** Follow 3xx responses, re-checking every hop from scratch; default `false` (the 3xx is the output). */
  follow_redirects?: boolean;
  /** How many redirects one call may follow; default 3, never more than 10. */
  max_redirects?: number;
  /** Cap on the response body after decompression; default 1 MiB. */
  max_response_bytes?: number;
  /** Deadline for the whole call: resolution, every hop, every body; default 10 s. */
  timeout_ms?: number;
  /**
   * Let the caller send `authorization` and `cookie` request headers. Off by default: credentials
   * handed to an agent are a secret the agent can be talked into sending elsewhere. Even when on,
   * they are dropped when a redirect leaves the original origin.
   */
  allow_credential_headers?: boolean;
}

/** A grant's narrowing of a policy (`capability_modifiers`); it can only narrow, never widen. */
export interface EgressNarrowing {
  /** Host patterns like `allowed_hosts`; a host must match both. Absent: no narrowing; `[]`: nothing. */
  egress_domains?: string[];
}

/** Operator configuration, built once by the composition root. */
export interface EgressConfig {
  /**
   * CIDRs (`TOOLGATE_EGRESS_ALLOW_CIDRS`) whose addresses pass the address policy although they are
   * not public, for sites whose egress goes through an internal proxy. Cloud metadata addresses are
   * never excepted. Invalid entries make `createEgressExecutor` throw.
   */
  allowCidrs: string[];
  /** How host names become addresses; default `systemResolver` (`dns.lookup`, so `/etc/hosts` applies). */
  resolver?: Resolver;
}

export const DEFAULT_SCHEMES = ['https'] as const;
export const DEFAULT_METHODS = ['GET'] as const;
export const DEFAULT_MAX_REDIRECTS = 3;
export const MAX_REDIRECTS_CEILING = 10;
export const DEFAULT_MAX_RESPONSE_BYTES = 1024 * 1024;
export const DEFAULT_TIMEOUT_MS = 10_000;
