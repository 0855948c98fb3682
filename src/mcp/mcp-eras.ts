import {
  PROTOCOL_VERSION_META_KEY,
  RELATED_TASK_META_KEY,
  SUPPORTED_PROTOCOL_VERSIONS,
} from '@modelcontextprotocol/server';

/** Whether a JSON-RPC request carries the per-request envelope of protocol 2026-07-28. */
export function claimsEnvelope(body: unknown): boolean {
  const meta = (body as { params?: { _meta?: Record<string, unknown> } } | null)?.params?._meta;
  return typeof meta === 'object' && meta !== null && PROTOCOL_VERSION_META_KEY in meta;
}

/** The 2025-era protocol versions a request may name in its `MCP-Protocol-Version` header. */
const LEGACY_VERSIONS: ReadonlySet<string> = new Set(SUPPORTED_PROTOCOL_VERSIONS);

/** The members of a JSON-RPC request (the SDK's schema for one admits no others). */
const REQUEST_MEMBERS: ReadonlySet<string> = new Set(['jsonrpc', 'id', 'method', 'params']);

/**
 * Whether a request is plainly 2025-era as the SDK would classify it: one well-formed JSON-RPC request, no `_meta` the
 * SDK might read, a 2025-era `MCP-Protocol-Version` header or none. Anything less plain is left to the SDK.
 */
export function plainlyLegacy(request: Request, body: unknown): boolean {
  const version = request.headers.get('mcp-protocol-version');
  if ((version !== null && !LEGACY_VERSIONS.has(version)) || !isPlainObject(body)) return false;
  for (const member of Object.keys(body)) if (!REQUEST_MEMBERS.has(member)) return false;
  const { jsonrpc, id, method, params } = body;
  if (jsonrpc !== '2.0' || typeof method !== 'string') return false;
  if (typeof id !== 'string' && !Number.isSafeInteger(id)) return false;
  if (params === undefined) return true;
  if (!isPlainObject(params)) return false;
  const meta = params._meta;
  if (meta === undefined) return true;
  if (!isPlainObject(meta) || PROTOCOL_VERSION_META_KEY in meta || RELATED_TASK_META_KEY in meta) return false;
  const token = meta.progressToken;
  return token === undefined || typeof token === 'string' || Number.isSafeInteger(token);
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
