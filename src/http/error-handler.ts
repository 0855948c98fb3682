import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { isDataException, isDatabaseUnavailable } from '../db/unavailable.js';
import { ApiError, errorBody, statusForCode } from './errors.js';

/**
 * The one place errors become responses. Client errors carry their code; anything
 * unexpected is a `500 internal` whose details stay in the log, keyed by request id.
 */
export function installErrorHandlers(app: FastifyInstance): void {
  app.setErrorHandler((error: FastifyError | ApiError, request, reply) => {
    if (error instanceof ApiError) {
      if (error.statusCode >= 500) request.log.warn({ code: error.code, details: error.details }, error.message);
      return reply.code(error.statusCode).headers(error.headers).send(errorBody(error.code, error.message, error.details));
    }
    if (isDatabaseUnavailable(error)) {
      request.log.warn({ err: error }, 'database unavailable');
      return reply
        .code(statusForCode('gateway_unavailable'))
        .send(errorBody('gateway_unavailable', 'the gateway cannot reach its database; nothing was done'));
    }
    if (isDataException(error)) {
      // PostgreSQL could not take a value as given (a NUL byte, an impossible number…): the
      // request's fault, whichever route let it through.
      request.log.info({ err: error }, 'value refused by the database');
      return reply.code(400).send(errorBody('invalid_request', 'a value in the request cannot be used', { reason: 'data_exception' }));
    }
    const status = typeof error.statusCode === 'number' ? error.statusCode : 500;
    if (status === 413) {
      return reply.code(413).send(errorBody('payload_too_large', 'the request body is larger than the gateway accepts'));
    }
    if (status >= 400 && status < 500) {
      // Fastify's own refusals: malformed JSON, wrong content type, empty body…
      return reply.code(400).send(errorBody('invalid_request', error.message, { reason: error.code ?? 'bad_request' }));
    }
    request.log.error({ err: error }, 'unexpected error');
    return reply
      .code(500)
      .send(errorBody('internal', `an unexpected error occurred; quote request id ${request.id}`, { request_id: request.id }));
  });

  app.setNotFoundHandler((request, reply) => {
    reply.code(404).send(errorBody('not_found', `no route ${request.method} ${request.url.split('?')[0]}`));
  });
}

/**
 * Fastify's own refusals made before routing (a malformed URL, a path parameter over
 * `maxParamLength`) answer in the same error envelope as everything else. They skip the
 * `onRequest` hooks, so the request id is echoed here.
 */
export function frameworkErrors(error: FastifyError, request: FastifyRequest, reply: FastifyReply): void {
  reply
    .code(400)
    .header('x-request-id', request.id)
    .send(errorBody('invalid_request', 'the URL is malformed or a path segment is too long', { reason: error.code ?? 'bad_url' }));
}
