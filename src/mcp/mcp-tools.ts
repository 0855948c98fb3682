import type { Tool } from '@modelcontextprotocol/server';
import { mcpNameOf } from '../registry/mcp-names.js';
import type { AgentToolView } from '../registry/tool-views.js';

/** The `_meta` key under which a listed tool carries toolgate's facts about it. */
export const TOOL_META_KEY = 'dev.toolgate/tool';

/** Tools per `tools/list` page. */
export const TOOLS_PAGE_SIZE = 100;

/**
 * How long a client may keep a `tools/list` answer: short, for clients that never hear a
 * `notifications/tools/list_changed` (2025-era clients have no stream to hear it on here).
 */
export const TOOLS_LIST_TTL_MS = 10_000;

type JsonObject = { [key: string]: unknown };

/**
 * One MCP tool from an agent's view of a tool (`GET /tools`): named after its tool id (`mcpNameOf`), its newest
 * version the agent may use, its schemas, and annotations from its category.
 */
export function mcpToolOf(view: AgentToolView): Tool {
  const outputSchema = advertisedOutputSchema(view.output_schema);
  return {
    name: mcpNameOf(view.id),
    title: view.display_name,
    description: view.description,
    inputSchema: inputSchemaOf(view.input_schema) as Tool['inputSchema'],
    ...(outputSchema ? { outputSchema: outputSchema as Tool['outputSchema'] } : {}),
    annotations: {
      title: view.display_name,
      readOnlyHint: view.category === 'read_only',
      // MCP presumes a tool reaches the open world unless told otherwise.
      openWorldHint: view.category === 'external_call',
    },
    _meta: {
      [TOOL_META_KEY]: {
        id: view.id,
        version: view.version,
        category: view.category,
        risk_level: view.risk_level,
        requires_approval: view.requires_approval,
        required_context: view.required_context,
        cost_units: view.cost_units,
      },
    },
  };
}

/**
 * MCP arguments are always an object, and MCP requires `inputSchema` to say so. A schema that
 * does not gets `type: "object"` (when it names no type) or is wrapped, so it still constrains.
 */
function inputSchemaOf(schema: AgentToolView['input_schema']): JsonObject {
  if (isObject(schema)) {
    if (schema.type === 'object') return schema;
    if (schema.type === undefined) return { ...schema, type: 'object' };
  }
  return { type: 'object', allOf: [schema] };
}

/** An output schema MCP can carry (`structuredContent` is an object), else none. */
export function advertisedOutputSchema(schema: unknown): JsonObject | undefined {
  return isObject(schema) && schema.type === 'object' ? schema : undefined;
}

function isObject(value: unknown): value is JsonObject {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/**
 * A page of tools, sorted by name, after an opaque cursor (the last name of the page before);
 * undefined for a cursor this gateway did not issue.
 */
export function toolsPage(
  unsorted: Tool[],
  cursor: string | undefined,
  pageSize = TOOLS_PAGE_SIZE,
): { tools: Tool[]; nextCursor?: string } | undefined {
  const tools = unsorted.toSorted((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  let start = 0;
  if (cursor !== undefined) {
    const after = decodeCursor(cursor);
    if (after === undefined) return undefined;
    start = tools.findIndex((tool) => tool.name > after);
    if (start < 0) start = tools.length;
  }
  const page = tools.slice(start, start + pageSize);
  const last = page[page.length - 1];
  return start + pageSize < tools.length && last
    ? { tools: page, nextCursor: encodeCursor(last.name) }
    : { tools: page };
}

function encodeCursor(after: string): string {
  return Buffer.from(JSON.stringify({ after }), 'utf8').toString('base64url');
}

function decodeCursor(cursor: string): string | undefined {
  if (cursor.length > 1000 || !/^[A-Za-z0-9_-]*$/.test(cursor)) return undefined;
  try {
    const parsed: unknown = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8'));
    return isObject(parsed) && typeof parsed.after === 'string' && encodeCursor(parsed.after) === cursor
      ? parsed.after
      : undefined;
  } catch {
    return undefined;
  }
}
