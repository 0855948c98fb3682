import fastifySwagger from '@fastify/swagger';
import fastifySwaggerUi from '@fastify/swagger-ui';
import type { FastifyInstance } from 'fastify';
import { loadOpenApiDocument } from '../contract.js';

export { openapiPath } from '../contract.js';

// Swagger UI loads its scripts and styles from /docs/static and calls this gateway only. It shares
// an origin with /console, so no other site may frame it (clickjacking "Try it out" or the console).
const SECURITY_HEADERS = {
  'content-security-policy':
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
  'x-frame-options': 'DENY',
  'x-content-type-options': 'nosniff',
};

/** Serves `openapi.yaml` as `/openapi.json` and interactive docs at `/docs`. */
export async function docsRoutes(app: FastifyInstance): Promise<void> {
  const document = await loadOpenApiDocument();
  // Docs are public: every route registered in this context is marked so.
  app.addHook('onRoute', (route) => {
    route.config = { ...route.config, access: 'public' };
  });
  app.addHook('onSend', async (_request, reply, payload) => {
    reply.headers(SECURITY_HEADERS);
    return payload;
  });
  // Swagger UI's "Try it out" calls the gateway that served it, whatever its host and port.
  const servedHere = { ...document, servers: [{ url: '/', description: 'this gateway' }] };
  await app.register(fastifySwagger, { mode: 'static', specification: { document: servedHere as never } });
  await app.register(fastifySwaggerUi, {
    routePrefix: '/docs',
    uiConfig: { docExpansion: 'list', deepLinking: true, validatorUrl: null },
  });
  app.get('/openapi.json', async () => document);
}
