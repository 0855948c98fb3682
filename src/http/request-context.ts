import { randomUUID } from 'node:crypto';
import { customAlphabet } from 'nanoid';
import type { IncomingMessage } from 'node:http';

declare module 'fastify' {
  interface FastifyRequest {
    /** The W3C trace id of this request: from `traceparent` when valid, else a fresh one. */
    traceId: string;
  }
}

const TRACEPARENT = /^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$/;
const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;
const traceIds = new WeakMap<IncomingMessage, string>();
/** A fresh W3C trace id: 16 random bytes in hex, from nanoid's pool (one randomBytes call costs microseconds). */
const newTraceId = customAlphabet('0123456789abcdef', 32);

/** The trace id of a raw request, computed once: logs and handlers see the same value. */
export function traceIdOf(raw: IncomingMessage): string {
  let traceId = traceIds.get(raw);
  if (traceId === undefined) {
    const header = raw.headers.traceparent;
    const match = typeof header === 'string' ? TRACEPARENT.exec(header.trim().toLowerCase()) : null;
    traceId = match?.[1] && !/^0+$/.test(match[1]) ? match[1] : newTraceId();
    traceIds.set(raw, traceId);
  }
  return traceId;
}

/** Honours a caller's `x-request-id` when it is a sane token, else mints one. */
export function requestIdOf(raw: IncomingMessage): string {
  const header = raw.headers['x-request-id'];
  return typeof header === 'string' && REQUEST_ID.test(header) ? header : randomUUID();
}
