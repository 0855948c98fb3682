import type { Kysely, Transaction } from 'kysely';
import { payloadHash } from '../audit/audit-hash.js';
import { writeAuditEvents } from '../audit/audit-repository.js';
import type { DB } from '../db/schema.js';
import { dependencyNodeOf, resolveDependency, type DependencyReason } from './dependency-resolution.js';
import type { ToolContent, ToolContract, ToolDeprecation } from './tool-contract.js';
import { mcpNameOf, mcpNameTakenBy } from './mcp-names.js';
import { contentOf, type ToolRegistration } from './tool-registration.js';
import {
  advanceRevision,
  findToolVersion,
  findVersionsOf,
  insertToolVersion,
  listToolIds,
  lockRegistry,
  setDeprecation,
  toolExists,
  type StoredToolVersion,
} from './tool-repository.js';

/** Who changes the registry, and when. */
export interface RegistryActor {
  actor: string;
  traceId: string | null;
  now: Date;
}

/** A registration that cannot be accepted because of another tool, or of its own new version: the field and a typed reason. */
export interface RegistryInvalid {
  ok: false;
  code: 'invalid_request';
  message: string;
  details: { field: string; reason: DependencyReason | 'input_schema_not_object'; tool_id: string; range?: string };
}

export type RegistrationResult =
  | { ok: true; created: boolean; tool: ToolContract; revision: number }
  | {
      ok: false;
      code: 'tool_version_conflict';
      message: string;
      details: { tool_id: string; version: string; differing_fields: string[] };
    }
  | {
      ok: false;
      code: 'tool_name_conflict';
      message: string;
      details: { tool_id: string; mcp_name: string; conflicting_tool_id: string };
    }
  | RegistryInvalid;

/** An input schema whose instances are objects, as MCP's `inputSchema` must be. */
function isObjectSchema(schema: unknown): boolean {
  return typeof schema === 'object' && schema !== null && (schema as { type?: unknown }).type === 'object';
}

/** The SHA-256 idempotency compares: over the immutable content only, never the deprecation. */
export function contentSha256(content: ToolContent): string {
  return payloadHash(content);
}

/**
 * Registers one immutable `(id, version)` with its `tool.registered` audit event in one transaction. Writers serialise
 * on the registry lock, so a concurrent second writer gets the idempotent answer or `tool_version_conflict`.
 */
export async function registerToolVersion(
  db: Kysely<DB>,
  registration: ToolRegistration,
  by: RegistryActor,
): Promise<RegistrationResult> {
  const { content, deprecation } = contentOf(registration);
  const sha = contentSha256(content);
  return db.transaction().execute(async (trx): Promise<RegistrationResult> => {
    const revision = await lockRegistry(trx);
    const existing = await findToolVersion(trx, content.id, content.version);
    if (existing) {
      const stored = existing.tool.deprecation;
      // A deprecation sent with a re-registration must agree with the stored one: changing it is the
      // deprecate route's job. Leaving it out (null) is how a catalog is re-seeded unchanged.
      const deprecationDiffers =
        deprecation !== null &&
        (stored?.deprecated_at !== deprecation.deprecated_at ||
          stored?.replacement_tool_id !== deprecation.replacement_tool_id);
      if (existing.contentSha256 === sha && !deprecationDiffers)
        return { ok: true, created: false, tool: existing.tool, revision };
      if (existing.contentSha256 === sha) {
        return {
          ok: false,
          code: 'tool_version_conflict',
          message: `${content.id}@${content.version} is registered with another deprecation; change it with POST /tools/${content.id}/versions/${content.version}/deprecate`,
          details: { tool_id: content.id, version: content.version, differing_fields: ['deprecation'] },
        };
      }
      return {
        ok: false,
        code: 'tool_version_conflict',
        message: `${content.id}@${content.version} is already registered with different content; register a new version instead`,
        details: {
          tool_id: content.id,
          version: content.version,
          differing_fields: differingFields(existing.tool, content),
        },
      };
    }
    if (!isObjectSchema(content.input_schema)) {
      return {
        ok: false,
        code: 'invalid_request',
        message:
          'body.input_schema: a new tool version needs an object schema ("type": "object"): MCP clients and model APIs send arguments as an object',
        details: { field: 'body.input_schema', reason: 'input_schema_not_object', tool_id: content.id },
      };
    }
    if (!(await toolExists(trx, content.id))) {
      const taken = mcpNameTakenBy(content.id, await listToolIds(trx));
      if (taken !== undefined) {
        const name = mcpNameOf(content.id);
        return {
          ok: false,
          code: 'tool_name_conflict',
          message: `${content.id} would be named ${name} over MCP, as ${taken} already is; choose another id`,
          details: { tool_id: content.id, mcp_name: name, conflicting_tool_id: taken },
        };
      }
    }
    const invalid = await checkDependencies(trx, content, by.now);
    if (invalid) return invalid;
    if (
      deprecation?.replacement_tool_id &&
      deprecation.replacement_tool_id !== content.id &&
      !(await toolExists(trx, deprecation.replacement_tool_id))
    ) {
      return unknownReplacement('body.deprecation.replacement_tool_id', deprecation.replacement_tool_id);
    }
    const stored = await insertToolVersion(trx, {
      content,
      contentSha256: sha,
      deprecation,
      registeredAt: by.now,
      registeredBy: by.actor,
      revision: revision + 1,
    });
    await advanceRevision(trx, revision + 1);
    await writeAuditEvents(trx, [
      {
        occurredAt: by.now,
        event: {
          ...toolAuditFields(stored.tool, by),
          event_type: 'tool.registered',
          status: 'registered',
          details: {
            content_sha256: sha,
            revision: revision + 1,
            allowed_agents: content.allowed_agents,
            backend_configured: content.backend !== null,
            dependencies: content.dependencies,
            deprecation,
          },
        },
      },
    ]);
    return { ok: true, created: true, tool: stored.tool, revision: revision + 1 };
  });
}

/** Each direct dependency must name a registered tool with a version its range resolves to. */
async function checkDependencies(
  trx: Transaction<DB>,
  content: ToolContent,
  now: Date,
): Promise<RegistryInvalid | undefined> {
  if (content.dependencies.length === 0) return undefined;
  const stored = await findVersionsOf(
    trx,
    content.dependencies.map((d) => d.tool_id),
  );
  const lookup = (toolId: string) =>
    stored.filter((s) => s.tool.id === toolId).map((s) => dependencyNodeOf(s.tool, now));
  for (const [index, dependency] of content.dependencies.entries()) {
    const result = resolveDependency(dependency, lookup);
    if (result.ok) continue;
    return {
      ok: false,
      code: 'invalid_request',
      message:
        result.reason === 'unknown_tool'
          ? `body.dependencies.${index}: ${dependency.tool_id} is not a registered tool`
          : `body.dependencies.${index}: no usable version of ${dependency.tool_id} satisfies ${dependency.range}`,
      details: {
        field: `body.dependencies.${index}`,
        reason: result.reason,
        tool_id: dependency.tool_id,
        range: dependency.range,
      },
    };
  }
  return undefined;
}

export type DeprecationResult =
  | { ok: true; changed: boolean; tool: ToolContract; revision: number }
  | { ok: false; code: 'tool_not_registered' | 'tool_version_not_found'; message: string }
  | {
      ok: false;
      code: 'tool_name_conflict';
      message: string;
      details: { tool_id: string; mcp_name: string; conflicting_tool_id: string };
    }
  | RegistryInvalid;

/**
 * Sets (or reschedules) the deprecation of one version, with its `tool.deprecated` audit event
 * in the same transaction. Repeating the same deprecation changes nothing and records nothing.
 */
export async function deprecateToolVersion(
  db: Kysely<DB>,
  target: { toolId: string; version: string; deprecation: ToolDeprecation },
  by: RegistryActor,
): Promise<DeprecationResult> {
  return db.transaction().execute(async (trx): Promise<DeprecationResult> => {
    const revision = await lockRegistry(trx);
    const existing: StoredToolVersion | undefined = await findToolVersion(trx, target.toolId, target.version);
    if (!existing) {
      return (await toolExists(trx, target.toolId))
        ? { ok: false, code: 'tool_version_not_found', message: `${target.toolId} has no version ${target.version}` }
        : { ok: false, code: 'tool_not_registered', message: `tool ${target.toolId} is not registered` };
    }
    const replacement = target.deprecation.replacement_tool_id;
    if (replacement !== null && replacement !== target.toolId && !(await toolExists(trx, replacement))) {
      return unknownReplacement('body.replacement_tool_id', replacement);
    }
    const before = existing.tool.deprecation;
    if (
      before &&
      before.deprecated_at === target.deprecation.deprecated_at &&
      before.replacement_tool_id === replacement
    ) {
      return { ok: true, changed: false, tool: existing.tool, revision };
    }
    const stored = await setDeprecation(trx, { ...target, revision: revision + 1 });
    await advanceRevision(trx, revision + 1);
    await writeAuditEvents(trx, [
      {
        occurredAt: by.now,
        event: {
          ...toolAuditFields(stored.tool, by),
          event_type: 'tool.deprecated',
          status: 'deprecated',
          details: { revision: revision + 1, before, after: stored.tool.deprecation },
        },
      },
    ]);
    return { ok: true, changed: true, tool: stored.tool, revision: revision + 1 };
  });
}

function unknownReplacement(field: string, toolId: string): RegistryInvalid {
  return {
    ok: false,
    code: 'invalid_request',
    message: `${field}: ${toolId} is not a registered tool`,
    details: { field, reason: 'unknown_tool', tool_id: toolId },
  };
}

function toolAuditFields(tool: ToolContract, by: RegistryActor) {
  return {
    actor: by.actor,
    tenant_id: null,
    tool_id: tool.id,
    tool_version: tool.version,
    tool_category: tool.category,
    risk_level: tool.risk_level,
    trace_id: by.traceId,
  };
}

/** The top-level fields whose content differs between a stored version and a new registration. */
function differingFields(stored: ToolContract, content: ToolContent): string[] {
  return (Object.keys(content) as Array<keyof ToolContent>).filter(
    (field) => payloadHash(stored[field]) !== payloadHash(content[field]),
  );
}
