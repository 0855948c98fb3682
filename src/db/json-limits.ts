/**
 * Any JSON the gateway takes in must be storable and hashable: nested at most `MAX_JSON_DEPTH` levels (hashing and
 * serialising recurse), with no string or key PostgreSQL refuses (a NUL, UTF-16 with a lone surrogate).
 */
export const MAX_JSON_DEPTH = 64;

/** The first part of `value` that breaks those rules, with its path (`plan.0.input.q`), if any. */
export function jsonProblem(value: unknown, root: string): { path: string; message: string } | undefined {
  // Iterative, so that the check itself cannot overflow the stack it protects.
  const stack: Array<{ value: unknown; path: string; depth: number }> = [{ value, path: root, depth: 0 }];
  while (stack.length > 0) {
    const { value: current, path, depth } = stack.pop()!;
    if (typeof current === 'string') {
      const bad = textProblem(current);
      if (bad) return { path, message: bad };
      continue;
    }
    if (current === null || typeof current !== 'object') continue;
    if (depth >= MAX_JSON_DEPTH) return { path, message: `nested deeper than ${MAX_JSON_DEPTH} levels` };
    for (const [key, child] of Object.entries(current)) {
      const bad = textProblem(key);
      if (bad) return { path: `${path}.${printable(key)}`, message: `key ${bad}` };
      stack.push({ value: child, path: `${path}.${printable(key)}`, depth: depth + 1 });
    }
  }
  return undefined;
}

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;
// eslint-disable-next-line no-control-regex -- NUL is what PostgreSQL refuses in text
const UNPRINTABLE = /\u0000|[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;

/** A key as a path shows it: what could not be kept written as a `\uXXXX` escape, so the path can be. */
function printable(key: string): string {
  return key.replace(UNPRINTABLE, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

function textProblem(text: string): string | undefined {
  if (text.includes('\u0000')) return 'must not contain a NUL character';
  if (LONE_SURROGATE.test(text)) return 'must be well-formed Unicode (no lone surrogate)';
  return undefined;
}
