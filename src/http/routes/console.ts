import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import fastifyStatic from '@fastify/static';
import type { FastifyInstance, FastifyReply } from 'fastify';
import { ApiError } from '../errors.js';

/** Where `npm run build` puts the console (the same folder whether this runs from src/ or dist/). */
export const consoleAssetsDir = fileURLToPath(new URL('../../../dist/console/', import.meta.url));

export interface ConsoleRouteOptions {
  /** The built console; tests pass another folder. */
  assetsDir?: string;
}

// The console's only script and style come from /console/assets and it talks to this gateway
// only, so a script injected through data it displays has nowhere to load from or send to.
const SECURITY_HEADERS = {
  'content-security-policy':
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
  // For browsers that predate frame-ancestors.
  'x-frame-options': 'DENY',
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
  'cache-control': 'no-cache',
};

/**
 * Serves the operator console: `/console` is its page and `/console/assets/*` its hashed,
 * immutable scripts and styles. Both are public: the console signs in through the API itself.
 */
export async function consoleRoutes(app: FastifyInstance, options: ConsoleRouteOptions = {}): Promise<void> {
  const assetsDir = options.assetsDir ?? consoleAssetsDir;
  app.addHook('onRoute', (route) => {
    route.config = { ...route.config, access: 'public' };
  });
  await app.register(fastifyStatic, {
    root: join(assetsDir, 'assets'),
    serve: false,
    immutable: true,
    maxAge: '365d',
  });

  // Read on every request (a few KB, `no-cache` anyway): a rebuild while the gateway runs names new
  // hashed assets, and a page kept from before it would load scripts that are gone.
  const readPage = (): Promise<string | undefined> =>
    readFile(join(assetsDir, 'index.html'), 'utf8').catch(() => undefined);

  app.get('/console', async (_request, reply: FastifyReply) => {
    const html = await readPage();
    if (html === undefined)
      throw new ApiError('not_found', 'the console is not built: run `npm run build` (or `npm run build:console`)');
    return reply.headers(SECURITY_HEADERS).type('text/html; charset=utf-8').send(html);
  });
  app.get<{ Params: { file: string } }>('/console/assets/:file', async (request, reply) =>
    reply.header('x-content-type-options', 'nosniff').sendFile(request.params.file),
  );
}
