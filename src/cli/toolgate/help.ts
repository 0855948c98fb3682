import { Command, Option } from 'commander';
import { parseInteger } from './format.js';

/** A command with its example, shown by `--help` (every command has one: a test checks). */
export function command(name: string, description: string, ...examples: string[]): Command {
  return new Command(name)
    .description(description)
    .addHelpText(
      'after',
      `\nExample${examples.length > 1 ? 's' : ''}:\n${examples.map((line) => `  $ ${line}`).join('\n')}`,
    );
}

/** `--limit`, `--cursor` and `--all` of a listing. */
export function listOptions(cmd: Command, maximum: number): Command {
  return cmd
    .addOption(new Option('--limit <n>', `items per page (1-${maximum})`).argParser(parseInteger))
    .option('--cursor <cursor>', 'the `next_cursor` of the previous page')
    .option('--all', 'follow `next_cursor` to the end');
}

export interface ListOptions {
  limit?: number;
  cursor?: string;
  all?: boolean;
}

/** `--idempotency-key` of the creating commands: a retry with the same key creates nothing more. */
export const IDEMPOTENCY_KEY = [
  '--idempotency-key <key>',
  'a retry with the same key and request answers the first result',
] as const;

export function idempotencyHeader(options: { idempotencyKey?: string }): { 'Idempotency-Key'?: string } {
  return options.idempotencyKey ? { 'Idempotency-Key': options.idempotencyKey } : {};
}
