/** What an `external_call` tool's input carries. */
export interface EgressInput {
  url: string;
  /** Default `GET`; compared case-insensitively, sent upper-case. */
  method?: string;
  headers?: Record<string, string>;
  /** A string is sent as is; anything else is sent as JSON. */
  body?: unknown;
}

/** The tool output of an egress call: `body` is parsed JSON for JSON content types, else text. */
export interface EgressOutput {
  status: number;
  headers: Record<string, string>;
  body: unknown;
}

/** Why the guard refused a call; `details` say which hop, host, address or header. */
export type EgressDenialReason =
  | 'input_invalid'
  | 'url_unparseable'
  | 'url_ambiguous'
  | 'scheme_not_allowed'
  | 'method_not_allowed'
  | 'credentials_in_url'
  | 'host_invalid'
  | 'host_not_allowed'
  | 'host_not_in_grant'
  | 'host_unresolvable'
  | 'address_not_public'
  | 'header_not_allowed'
  | 'body_not_allowed'
  | 'redirect_limit_exceeded';

/** Why the call failed although the guard admitted it: the destination misbehaved or the network did. */
export type EgressFailureReason =
  'deadline_exceeded' | 'dns_failed' | 'connection_failed' | 'response_too_large' | 'response_decoding_failed';

/** A guard refusal: `403 egress_denied`, to be audited as blocked egress. */
export interface EgressDenied {
  ok: false;
  code: 'egress_denied';
  reason: EgressDenialReason;
  details: Record<string, unknown>;
}

/** An infrastructure fault: `504 tool_backend_timeout` or `502 tool_backend_failed`. */
export interface EgressFailed {
  ok: false;
  code: 'tool_backend_timeout' | 'tool_backend_failed';
  reason: EgressFailureReason;
  details: Record<string, unknown>;
}

/** The outcome of an egress call, as a value: the pipeline maps `code` to its error. */
export type EgressResult = { ok: true; output: EgressOutput } | EgressDenied | EgressFailed;

export function denied(reason: EgressDenialReason, details: Record<string, unknown> = {}): EgressDenied {
  return { ok: false, code: 'egress_denied', reason, details };
}

export function failed(reason: EgressFailureReason, details: Record<string, unknown> = {}): EgressFailed {
  return {
    ok: false,
    code: reason === 'deadline_exceeded' ? 'tool_backend_timeout' : 'tool_backend_failed',
    reason,
    details,
  };
}
