import createClient, { type Client } from 'openapi-fetch';
import type { components, operations, paths } from './openapi-types.js';

export type { components, operations, paths };

/** The API's schemas by name, e.g. `Schemas['Grant']`. */
export type Schemas = components['schemas'];
/** The closed set of error codes the API answers with; stable API. */
export type ErrorCode = Schemas['ErrorCode'];
/** A typed client of the whole API: `client.GET('/grants/{id}', { params: { path: { id } } })`. */
export type ToolgateClient = Client<paths>;

export interface ToolgateClientOptions {
  /** The gateway, e.g. `http://127.0.0.1:8080`. */
  baseUrl: string;
  /** A bearer token (JWT) of an agent or an operator. */
  token?: string | undefined;
  /** Another fetch, e.g. one with a proxy or a timeout. */
  fetch?: (request: Request) => Promise<Response>;
}

/** The API refused a request: its error code, message and details, and the HTTP status. */
export class ToolgateError extends Error {
  override readonly name = 'ToolgateError';
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly details: Record<string, unknown>,
    /** The body as answered: the error envelope, or a run envelope for a run a step stopped. */
    readonly body: unknown,
  ) {
    super(message);
  }
}

/** The gateway did not answer at all (refused, reset, no such host); the message names the URL tried. */
export class GatewayUnreachableError extends Error {
  override readonly name = 'GatewayUnreachableError';
  constructor(
    readonly url: string,
    cause: unknown,
  ) {
    const reason = (cause as { cause?: { code?: string; message?: string } })?.cause;
    super(
      `cannot reach the gateway at ${url}: ${reason?.code ?? reason?.message ?? (cause as Error)?.message ?? String(cause)}`,
      { cause },
    );
  }
}

/** A client of the gateway at `baseUrl`, sending `token` on every request. */
export function createToolgateClient(options: ToolgateClientOptions): ToolgateClient {
  const client = createClient<paths>({
    baseUrl: options.baseUrl.replace(/\/+$/, ''),
    headers: options.token ? { authorization: `Bearer ${options.token}` } : {},
    ...(options.fetch ? { fetch: options.fetch } : {}),
  });
  // fetch's own "fetch failed" says nothing of where: name the URL that was tried.
  client.use({ onError: ({ error, request }) => new GatewayUnreachableError(request.url, error) });
  return client;
}

/**
 * The data of a call that succeeded; otherwise throws its refusal as a `ToolgateError` (for a
 * run a step stopped, the code of that step).
 */
export async function unwrap<T>(call: Promise<{ data?: T; error?: unknown; response: Response }>): Promise<T> {
  const { data, error, response } = await call;
  if (response.ok) return data as T;
  throw refusal(response.status, error);
}

/** A refusal from a non-2xx answer's body, whatever its shape. */
export function refusal(status: number, body: unknown): ToolgateError {
  const envelope = body as
    | {
        error?: { code?: string; message?: string; details?: Record<string, unknown> };
        steps?: Array<{ error?: { code?: string; message?: string; details?: Record<string, unknown> } }>;
      }
    | undefined;
  const error = envelope?.error ?? envelope?.steps?.find((step) => step.error)?.error;
  return new ToolgateError(
    status,
    error?.code ?? `http_${status}`,
    error?.message ?? `HTTP ${status}`,
    error?.details ?? {},
    body,
  );
}
