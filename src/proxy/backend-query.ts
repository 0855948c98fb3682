/**
 * A GET call's input as query parameters after the registered URL's own query, which always wins:
 * an input key naming one of its parameters, however spelled, is dropped (docs/design/backend-query.md).
 */

/** The name a backend may take a query parameter name for. */
export function queryParameterKey(name: string): string {
  return name
    .replace(/^ +/, '')
    .replace(/\[[\s\S]*$/, '')
    .replace(/[. ]/g, '_')
    .toLowerCase();
}

/** The input's keys that name a query parameter the registered URL fixes (and so are not sent). */
export function fixedQueryCollisions(registeredUrl: string | URL, input: unknown): string[] {
  if (!input || typeof input !== 'object') return [];
  const fixed = new Set<string>();
  for (const name of new URL(registeredUrl).searchParams.keys()) fixed.add(queryParameterKey(name));
  if (fixed.size === 0) return [];
  return Object.keys(input).filter((key) => fixed.has(queryParameterKey(key)));
}

/**
 * The URL a body-less call is sent to: the registered URL, its query untouched, followed by the
 * input's other keys. `withheld` lists the input keys left out because the URL fixes them.
 */
export function urlWithInputQuery(registeredUrl: string, input: unknown): { url: URL; withheld: string[] } {
  const url = new URL(registeredUrl);
  if (!input || typeof input !== 'object') return { url, withheld: [] };
  const withheld = fixedQueryCollisions(url, input);
  const added = new URLSearchParams();
  for (const [key, value] of Object.entries(input as Record<string, unknown>)) {
    if (withheld.includes(key)) continue;
    added.append(key, typeof value === 'string' ? value : JSON.stringify(value));
  }
  const extra = added.toString();
  if (extra) {
    // Appended as text: editing `url.searchParams` would re-serialise the operator's query too.
    const fixed = url.search.slice(1);
    url.search = fixed ? `${fixed}&${extra}` : extra;
  }
  return { url, withheld };
}
