import type { FastifyInstance, FastifyRequest } from 'fastify';
import { startServerSpan, type ServerSpan } from '../telemetry/spans.js';

/** What the app needs of request tracing beyond the hooks it installs. */
export interface RequestTracing {
  /** Runs `fn` in the request's span (the response's log line, written after the request's own context). */
  within<T>(request: FastifyRequest, fn: () => T): T;
}

/**
 * A server span per request, continuing an incoming `traceparent`: the request's trace id becomes
 * the span's, and the rest of the request (its body, hooks, handler) runs with the span active,
 * so that the domain's spans are its children. Installed only when traces are on.
 */
export function traceRequests(app: FastifyInstance): RequestTracing {
  const spans = new WeakMap<FastifyRequest, ServerSpan>();
  app.addHook('onRequest', (request, reply, done) => {
    const route = request.routeOptions.url;
    const server = startServerSpan(route ? `${request.method} ${route}` : request.method, request.headers, {
      'http.request.method': request.method,
      'url.path': request.url.split('?')[0],
      'url.scheme': request.protocol,
      ...(route ? { 'http.route': route } : {}),
      'toolgate.request_id': request.id,
    });
    spans.set(request, server);
    if (server.traceId) request.traceId = server.traceId;
    server.run(() => {
      server.bind(request.raw);
      server.bind(reply.raw);
      done();
    });
  });
  app.addHook('onResponse', (request, reply, done) => {
    spans.get(request)?.end(reply.statusCode);
    done();
  });
  app.addHook('onRequestAbort', (request, done) => {
    spans.get(request)?.end(undefined);
    done();
  });
  return {
    within: (request, fn) => {
      const server = spans.get(request);
      return server ? server.run(fn) : fn();
    },
  };
}
