import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vite';

const here = (path: string) => fileURLToPath(new URL(path, import.meta.url));

/** The operator console: built into dist/console, which the gateway serves at /console. */
export default defineConfig({
  root: here('.'),
  base: '/console/',
  logLevel: 'warn',
  resolve: { alias: { 'toolgate/client': here('../src/client/index.ts') } },
  oxc: { jsx: { runtime: 'automatic', importSource: 'preact' } },
  build: {
    outDir: here('../dist/console'),
    emptyOutDir: true,
    target: 'es2022',
    // The polyfill would be an inline script, which the console's Content-Security-Policy forbids.
    modulePreload: { polyfill: false },
  },
});
