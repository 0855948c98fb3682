import { pino, type Logger } from 'pino';
import { describe, expect, it } from 'vitest';
import { BackgroundTask } from '../../src/db/background-task.js';

/** A logger whose lines are kept, parsed. */
function capturedLogger(): { logger: Logger; lines: Array<{ level: number; msg: string }> } {
  const lines: Array<{ level: number; msg: string }> = [];
  const logger = pino({ level: 'debug' }, { write: (line: string) => lines.push(JSON.parse(line)) });
  return { logger, lines };
}

const warnings = (lines: Array<{ level: number; msg: string }>) =>
  lines.filter((line) => line.level >= 40).map((line) => line.msg);

describe('a background task', () => {
  it('reports a round that fails once, as a warning, until a round works again', async () => {
    const { logger, lines } = capturedLogger();
    let round = 0;
    const task = new BackgroundTask({
      name: 'sweep',
      run: async () => {
        round += 1;
        if (round <= 2) throw new Error('database away');
      },
      intervalMs: () => 5,
      logger,
    });
    task.start();
    while (round < 3) await new Promise((r) => setTimeout(r, 5));
    await task.stop();
    expect(warnings(lines)).toEqual(['sweep failed; retrying']);
    expect(lines.map((line) => line.msg)).toContain('sweep works again');
  });

  it('does not report as a failure a round the close cut off', async () => {
    const { logger, lines } = capturedLogger();
    let cut: (error: Error) => void = () => undefined;
    let started = false;
    const task = new BackgroundTask({
      name: 'sweep',
      run: () => {
        started = true;
        return new Promise((_, reject) => (cut = reject));
      },
      intervalMs: () => 5,
      logger,
    });
    task.start();
    while (!started) await new Promise((r) => setTimeout(r, 5));
    const stopping = task.stop();
    // Closing the database ends the round's connection under it.
    cut(new Error('Connection terminated'));
    await stopping;
    await new Promise((r) => setTimeout(r, 10));
    expect(warnings(lines)).toEqual([]);
    expect(lines.map((line) => line.msg)).toContain('sweep stopped mid-round');
  });
});
