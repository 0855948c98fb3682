import { createHash } from 'node:crypto';

/** What model APIs accept as a function name, and so what an MCP tool is named (SPEC §12.1). */
export const MCP_NAME_PATTERN = /^[a-zA-Z0-9_-]{1,64}$/;

const MAX_NAME = 64;
/** Characters of the id's SHA-256 (hex) that end a name cut to fit. */
const HASH_CHARS = 8;

/**
 * The MCP tool name of a tool id (docs/mcp.md#tool-names): each `.` becomes `-` (which no tool id
 * holds, so ids never meet another's name); a result over 64 characters keeps its first 55 and
 * ends in `-` and the first 8 hex digits of the id's SHA-256. The same id always gets the same name.
 */
export function mcpNameOf(toolId: string): string {
  const name = toolId.replaceAll('.', '-');
  if (name.length <= MAX_NAME) return name;
  const hash = createHash('sha256').update(toolId).digest('hex').slice(0, HASH_CHARS);
  return `${name.slice(0, MAX_NAME - HASH_CHARS - 1)}-${hash}`;
}

/** The first of `others` whose MCP name is `toolId`'s, if any (registration refuses such an id). */
export function mcpNameTakenBy(toolId: string, others: Iterable<string>): string | undefined {
  const name = mcpNameOf(toolId);
  for (const other of others) if (other !== toolId && mcpNameOf(other) === name) return other;
  return undefined;
}
