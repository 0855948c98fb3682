import type { IncomingHttpHeaders } from 'node:http';

/** Request headers the SDK is not shown: the token stays with the gateway, and the body was read already. */
const NOT_FORWARDED = new Set([
  'authorization',
  'content-length',
  'transfer-encoding',
  'connection',
  'keep-alive',
  'upgrade',
]);

/** Node's parsed request headers, read through the `Headers` interface (names are case-insensitive). */
class HeadersView {
  constructor(private readonly raw: IncomingHttpHeaders) {}

  get(name: string): string | null {
    const key = name.toLowerCase();
    if (NOT_FORWARDED.has(key)) return null;
    const value = this.raw[key];
    if (value === undefined) return null;
    return Array.isArray(value) ? value.join(', ') : value;
  }

  has(name: string): boolean {
    return this.get(name) !== null;
  }

  *entries(): IterableIterator<[string, string]> {
    for (const name of Object.keys(this.raw).sort()) {
      const value = this.get(name);
      if (value !== null) yield [name, value];
    }
  }

  *keys(): IterableIterator<string> {
    for (const [name] of this.entries()) yield name;
  }

  *values(): IterableIterator<string> {
    for (const [, value] of this.entries()) yield value;
  }

  forEach(callback: (value: string, name: string, parent: HeadersView) => void): void {
    for (const [name, value] of this.entries()) callback(value, name, this);
  }

  [Symbol.iterator](): IterableIterator<[string, string]> {
    return this.entries();
  }
}

/**
 * A POST to `/mcp` with its body parsed, as the SDK's HTTP entry and transport see it: they read only the method,
 * headers by name and the signal, so this view of Node's request spares building a web `Request` per call.
 */
class InboundRequest {
  readonly method = 'POST';
  readonly url = 'http://localhost/mcp';
  readonly headers: HeadersView;
  /** Nothing left to read: the SDK is always given the parsed body. */
  readonly body = null;
  readonly bodyUsed = false;

  constructor(
    headers: IncomingHttpHeaders,
    readonly signal: AbortSignal | undefined,
  ) {
    this.headers = new HeadersView(headers);
  }

  /** The body was read already, so a copy is the same request. */
  clone(): InboundRequest {
    return this;
  }
}

/**
 * The `Request` the SDK is handed for a POST whose parsed body it is given beside it; `signal`
 * fires when a listen stream's client goes away (other exchanges end with their answer).
 */
export function inboundRequestOf(headers: IncomingHttpHeaders, signal: AbortSignal | undefined): Request {
  return new InboundRequest(headers, signal) as unknown as Request;
}
