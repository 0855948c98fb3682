/**
 * What the CLI prints is mostly other parties' text: tool ids, reasons, status copy, a server's
 * error message. A control character in it could erase and forge lines, retitle the window or set
 * the clipboard (OSC 52), so everything printed for people is escaped here, and nowhere else; and
 * the user and password of a URL (`https://user:pass@host`) are never shown.
 */

// C0, DEL and C1 (ESC, CSI, OSC, BEL, CR, backspace…), bidi overrides and isolates (which reorder
// what is shown), and the line and paragraph separators.
const UNPRINTABLE = /[\p{Cc}\p{Bidi_Control}\u2028\u2029]/gu;
// What JSON.stringify leaves raw inside a string: DEL, C1, bidi controls and the separators.
const RAW_IN_JSON = /[\u007f-\u009f\p{Bidi_Control}\u2028\u2029]/gu;

// A URL's user and password, up to the last `@` before its host (as URL parsers read it).
const USERINFO = /\b([a-z][a-z0-9+.-]*:\/\/)[^\s/?#]*@/gi;

const NAMED: Record<string, string> = { '\n': '\\n', '\r': '\\r', '\t': '\\t' };

const escape = (char: string): string => NAMED[char] ?? `\\u${char.codePointAt(0)!.toString(16).padStart(4, '0')}`;

/**
 * One value or one line: every control character written out (`\u001b`, `\n`), never obeyed, and
 * a URL's credentials as `***`.
 */
export function printable(text: string): string {
  return text.replace(UNPRINTABLE, escape).replace(USERINFO, '$1***@');
}

/** Lines of output made here: each line as `printable` makes it, the newlines between them kept. */
export function printableLines(text: string): string {
  return text.split('\n').map(printable).join('\n');
}

/**
 * `--json` output: the same JSON value, with the characters JSON.stringify leaves raw escaped as
 * `\uXXXX` too (they can only stand inside strings, where the escape means the same character).
 */
export function jsonText(value: unknown, indent?: number): string {
  return (JSON.stringify(value, null, indent) ?? 'null').replace(RAW_IN_JSON, escape);
}

/** A line for people on stderr (notes, refusals, hints), escaped as one line. */
export function sayOnStderr(line: string): void {
  process.stderr.write(`${printable(line)}\n`);
}
