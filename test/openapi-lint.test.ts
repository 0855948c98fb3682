import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';

const root = new URL('..', import.meta.url).pathname;

describe('openapi.yaml', () => {
  it('passes Redocly and Spectral (spectral:oas) with nothing reported', async () => {
    // Both linters exit non-zero on any finding: redocly.yaml makes its warnings errors, and
    // Spectral runs with --fail-severity=warn.
    const run = await promisify(execFile)('npm', ['run', '--silent', 'lint:openapi'], { cwd: root }).then(
      (result) => ({ ok: true, output: result.stdout }),
      (error: { stdout: string; stderr: string }) => ({ ok: false, output: `${error.stdout}\n${error.stderr}` }),
    );
    expect(run.ok, run.output).toBe(true);
  }, 60_000);
});
