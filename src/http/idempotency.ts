import fp from 'fastify-plugin';
import type { FastifyInstance } from 'fastify';
import { actorOf } from '../auth/principal.js';
import { requestFingerprint, type IdempotencyKeys } from '../idempotency/idempotency-keys.js';
import type { KeyOwner } from '../idempotency/idempotency-repository.js';
import { principalOf } from './auth.js';
import { ApiError } from './errors.js';

declare module 'fastify' {
  interface FastifyContextConfig {
    /** A creating route: it honours an `Idempotency-Key` header. */
    idempotent?: boolean;
  }
  interface FastifyRequest {
    idempotencyClaim: { owner: KeyOwner; key: string } | undefined;
  }
}

/** The IETF draft's key is a string; ours is bounded and printable, so it can be logged and stored. */
const KEY_PATTERN = /^[\x20-\x7e]{1,255}$/;

/**
 * `Idempotency-Key` on the routes marked `idempotent`: the first request claims the key, a retry
 * with the same request is answered what the first was (`Idempotent-Replayed: true`), and the
 * same key with another request is `422 idempotency_key_reused`.
 */
export const idempotencyPlugin = fp<{ keys: IdempotencyKeys }>(
  async (app: FastifyInstance, { keys }) => {
    app.decorateRequest('idempotencyClaim', undefined);

    app.addHook('preHandler', async (request, reply) => {
      const header = request.headers['idempotency-key'];
      if (!request.routeOptions.config?.idempotent || header === undefined) return;
      if (typeof header !== 'string' || !KEY_PATTERN.test(header)) {
        throw new ApiError('invalid_request', 'header.idempotency-key: must be 1 to 255 printable ASCII characters', {
          issues: [{ field: 'header.idempotency-key', message: 'must be 1 to 255 printable ASCII characters' }],
        });
      }
      const principal = principalOf(request);
      const owner = {
        tenantId: principal.tenantId,
        actor: actorOf(principal),
        role: principal.kind === 'operator' ? principal.role : 'agent',
      };
      const verdict = await keys.begin(owner, header, requestFingerprint(request.method, request.url, request.body));
      switch (verdict.kind) {
        case 'claimed':
          request.idempotencyClaim = { owner, key: header };
          return;
        case 'replay':
          return reply
            .code(verdict.statusCode)
            .header('content-type', 'application/json; charset=utf-8')
            .header('idempotent-replayed', 'true')
            .send(verdict.body);
        case 'reused':
          throw new ApiError(
            'idempotency_key_reused',
            'this Idempotency-Key was used for another request; use a new key for a new request',
            {
              field: 'header.idempotency-key',
            },
          );
        case 'busy':
          throw new ApiError(
            'gateway_unavailable',
            'the first request with this Idempotency-Key has not answered yet; retry',
            {},
            { 'retry-after': '1' },
          );
      }
    });

    app.addHook('onSend', async (request, reply, payload) => {
      const claim = request.idempotencyClaim;
      if (!claim) return payload;
      request.idempotencyClaim = undefined;
      const body = typeof payload === 'string' ? payload : JSON.stringify(payload);
      try {
        await keys.finish(claim.owner, claim.key, { statusCode: reply.statusCode, body });
      } catch (error) {
        // The answer still goes out; the claim is taken over once it looks abandoned.
        request.log.warn({ err: error }, 'could not keep the answer of an idempotent request');
      }
      return payload;
    });
  },
  { name: 'toolgate-idempotency', dependencies: ['toolgate-auth'] },
);
