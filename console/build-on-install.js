// The `prepare` script, which `npm ci` and `npm install` run: the console is built with the
// dependencies, so that `npm start` on a fresh clone serves it. It steps aside where it cannot
// build — an install without dev dependencies (no Vite), or without the console's sources (the
// Docker image's dependency layer, which `npm run build` follows).
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const here = (path) => fileURLToPath(new URL(path, import.meta.url));

if (!existsSync(here('./index.html'))) {
  console.log('console: no sources here, not built');
} else {
  const vite = await import('vite').catch(() => null);
  if (vite === null) console.log('console: Vite is not installed (a production install), not built');
  else {
    await vite.build({ configFile: here('./vite.config.ts'), logLevel: 'warn' });
    console.log('console: built into dist/console');
  }
}
