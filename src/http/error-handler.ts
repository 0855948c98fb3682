import { randomUUID } from 'node:crypto';
import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type {
  ConnectionError,
  FastifyBaseLogger,
  FastifyError,
  FastifyInstance,
  FastifyReply,
  FastifyRequest,
} from 'fastify';
import { isDataException, isDatabaseUnavailable } from '../db/unavailable.js';
import { CodedError } from '../errors/coded-error.js';
import { statusForCode } from '../errors/error-codes.js';
import { ApiError, errorBody } from './errors.js';

/**
 * The one place errors become responses. Client errors carry their code; anything
 * unexpected is a `500 internal` whose details stay in the log, keyed by request id.
 */
export function installErrorHandlers(app: FastifyInstance): void {
  app.setErrorHandler((error: FastifyError | CodedError, request, reply) => {
    if (error instanceof CodedError) {
      const status = statusForCode(error.code);
      if (status >= 500) request.log.warn({ code: error.code, details: error.details }, error.message);
      const headers = error instanceof ApiError ? error.headers : {};
      return reply
        .code(status)
        .headers(headers)
        .send(errorBody(error.code, error.message, error.details));
    }
    if (isClientAbort(error, request)) {
      request.log.info({ reason: 'client_aborted' }, CLIENT_WENT_AWAY);
      return reply
        .code(400)
        .send(errorBody('invalid_request', 'the request did not arrive whole', { reason: 'client_aborted' }));
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
      return reply
        .code(400)
        .send(errorBody('invalid_request', 'a value in the request cannot be used', { reason: 'data_exception' }));
    }
    const status = typeof error.statusCode === 'number' ? error.statusCode : 500;
    if (status === 413) {
      return reply
        .code(413)
        .send(errorBody('payload_too_large', 'the request body is larger than the gateway accepts'));
    }
    if (status >= 400 && status < 500) {
      // Fastify's own refusals: malformed JSON, wrong content type, empty body…
      return reply.code(400).send(errorBody('invalid_request', error.message, { reason: error.code ?? 'bad_request' }));
    }
    request.log.error({ err: error }, 'unexpected error');
    return reply.code(500).send(
      errorBody('internal', `an unexpected error occurred; quote request id ${request.id}`, {
        request_id: request.id,
      }),
    );
  });

  app.setNotFoundHandler((request, reply) => {
    reply.code(404).send(errorBody('not_found', `no route ${request.method} ${request.url.split('?')[0]}`));
  });
}

/** What the log says of a client that closed its connection before its request arrived whole. */
export const CLIENT_WENT_AWAY = 'the client closed the connection before its request arrived whole';

/**
 * A request body cut off by its client (Node's `aborted`, code `ECONNRESET` like a lost database
 * connection): the client's doing, and no fault of the gateway's.
 */
function isClientAbort(error: { code?: unknown; message: string }, request: FastifyRequest): boolean {
  return error.code === 'ECONNRESET' && error.message === 'aborted' && request.raw.destroyed;
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
    .send(
      errorBody('invalid_request', 'the URL is malformed or a path segment is too long', {
        reason: error.code ?? 'bad_url',
      }),
    );
}

const UNPARSEABLE: Record<string, string> = {
  HPE_HEADER_OVERFLOW: 'the request headers are larger than the gateway accepts',
  ERR_HTTP_REQUEST_TIMEOUT: 'the request did not arrive in time',
};

/**
 * Answers what Node's HTTP parser refuses (never a Fastify request) as `400 invalid_request` on the
 * socket, `details.reason` naming the fault, after any pipelined answers owed before it.
 */
export function clientErrorHandler(logger: FastifyBaseLogger): (error: ConnectionError, socket: Socket) => void {
  // Connections whose refusal is written or waiting on the answers before it: the parser stays
  // failed and refuses again every further chunk the client sends meanwhile.
  const refused = new WeakSet<Socket>();
  return (error, socket) => {
    // The client went away: there is no one to answer.
    if (error.code === 'ECONNRESET' || socket.destroyed || refused.has(socket)) return;
    refused.add(socket);
    const requestId = randomUUID();
    const reason = error.code ?? 'bad_request';
    // The client ended the connection mid-request: the parser's refusal is only the consequence.
    logger.info(
      { request_id: requestId, status: 400, reason },
      reason === 'HPE_INVALID_EOF_STATE' ? CLIENT_WENT_AWAY : 'request refused by the HTTP parser',
    );
    afterAnswersInFlight(socket, () => {
      if (socket.writable) {
        const body = JSON.stringify(
          errorBody('invalid_request', UNPARSEABLE[reason] ?? 'the request is not valid HTTP', { reason }),
        );
        socket.write(
          [
            'HTTP/1.1 400 Bad Request',
            'content-type: application/json; charset=utf-8',
            `content-length: ${Buffer.byteLength(body)}`,
            `x-request-id: ${requestId}`,
            'connection: close',
            '',
            body,
          ].join('\r\n'),
        );
      }
      socket.destroy(error);
    });
  };
}

/**
 * Calls `then` once every answer owed on the connection has been sent: written earlier, a refusal
 * would go out in place of a pipelined good request's answer.
 */
function afterAnswersInFlight(socket: Socket, then: () => void): void {
  const answering = (socket as Socket & { _httpMessage?: ServerResponse | null })._httpMessage;
  if (!answering || answering.writableFinished || socket.destroyed) return then();
  answering.once('finish', () => afterAnswersInFlight(socket, then));
  // A connection lost meanwhile: there is no one left to answer.
  answering.once('close', () => {
    if (!answering.writableFinished) then();
  });
}
