#!/usr/bin/env node
// `toolgate`: from a checkout, the TypeScript source through tsx (a development dependency); where
// only the build is (the Docker image, `npm ci --omit=dev`), the compiled command.
import { existsSync } from 'node:fs';

const source = new URL('../src/cli/toolgate.ts', import.meta.url);
const tsx = existsSync(source) ? await import('tsx/esm/api').catch(() => undefined) : undefined;
if (tsx) {
  tsx.register();
  await import(source.href);
} else {
  await import('../dist/cli/toolgate.js');
}
