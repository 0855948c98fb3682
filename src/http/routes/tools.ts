import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { Kysely } from 'kysely';
import semver from 'semver';
import { z } from 'zod';
import type { operations } from '../../client/openapi-types.js';
import { actorOf, type Principal } from '../../auth/principal.js';
import type { DB } from '../../db/schema.js';
import { approximateYears, parseIsoDuration, reviewWindow, type IsoDuration } from '../../registry/review-window.js';
import type { CatalogResolution, ToolCatalog } from '../../registry/tool-catalog.js';
import type { ToolContract } from '../../registry/tool-contract.js';
import { missingSecret, toolRegistrationSchema } from '../../registry/tool-registration.js';
import { deprecateToolVersion, registerToolVersion } from '../../registry/tool-registry.js';
import { agentViewOf, operatorViewOf } from '../../registry/tool-views.js';
import { operatorOf, principalOf } from '../auth.js';
import { decodeCursor, encodeCursor } from '../cursor.js';
import { ApiError } from '../errors.js';
import { INSTANT_YEARS, isWrittenBack } from '../../validation/values.js';
import { invalidField, parseInput, requireThat, type Defaulted } from '../validation.js';

export interface ToolRouteDeps {
  db: Kysely<DB>;
  catalog: ToolCatalog;
  now: () => Date;
  secrets: Readonly<Record<string, string>>;
  /**
   * Whether a tenant's agents may be offered `external_call` tools. The tenant policy plugs in
   * here; without it, deny.
   */
  externalCallEnabled?: (tenantId: string) => Promise<boolean>;
}

type ToolParams = { id: string };
type VersionParams = { id: string; version: string };
type GetQuery = { version?: string };
type ListQuery = Defaulted<operations['listTools']['parameters']['query'], 'limit'>;
type DeprecateBody = Defaulted<
  NonNullable<operations['deprecateToolVersion']['requestBody']>['content']['application/json'],
  'replacement_tool_id'
>;
type DeprecationsQuery = Defaulted<operations['listToolDeprecations']['parameters']['query'], 'within'>;

const cursorPosition = z.strictObject({ id: z.string(), version: z.string().refine((v) => semver.valid(v) !== null) });

/** What openapi.yaml cannot say of a version in a path: that it is an exact semver version. */
function checkVersion(version: string): void {
  requireThat(semver.valid(version) === version, 'params.version', 'must be an exact registered version such as 1.2.0');
}

/** A review window's width: an ISO 8601 duration of at most a century either way, so that its ends are dates. */
function windowOf(within: string): IsoDuration {
  const duration = parseIsoDuration(within);
  if (!duration || approximateYears(duration) > 100)
    throw invalidField('query.within', 'must be an ISO 8601 duration of at most 100 years, such as P30D or PT12H');
  return duration;
}

/**
 * The tool registry. Reads are answered from this replica's catalog (never more than
 * about a second behind the database); writes refresh it before answering, so an operator
 * reads its own writes.
 */
export async function toolRoutes(app: FastifyInstance, deps: ToolRouteDeps): Promise<void> {
  // Reads come from this replica's copy of the registry: a copy never loaded, or not confirmed
  // current for too long (the database is away), answers 503 rather than a stale or empty catalog.
  app.addHook('preHandler', async (request) => {
    if (request.method !== 'GET' && request.method !== 'HEAD') return;
    const fresh = deps.catalog.readiness();
    if (!fresh.ok)
      throw new ApiError('gateway_unavailable', 'the tool registry cannot be confirmed current on this replica', {
        reason: fresh.reason ?? null,
      });
  });
  const externalCallEnabled = deps.externalCallEnabled ?? (async () => false);

  /** The resolution an agent gets: only versions it may use exist for it, and its calls resolve the same way. */
  async function resolveForPrincipal(
    principal: Principal,
    toolId: string,
    range: string | undefined,
  ): Promise<CatalogResolution> {
    if (principal.kind !== 'agent') return deps.catalog.resolve(toolId, range, { as: 'anyone' });
    return deps.catalog.resolve(toolId, range, {
      as: 'viewer',
      agent: { agentId: principal.id, family: principal.family },
      externalCallEnabled: await externalCallEnabled(principal.tenantId),
    });
  }

  app.post('/tools', { config: { access: 'platform-operator', idempotent: true } }, async (request, reply) => {
    const operator = operatorOf(request);
    // zod: registration's own rules (semver, schemas that compile, RE2 patterns, category rules), past the schema.
    const registration = parseInput(toolRegistrationSchema, request.body, 'body');
    const missing = missingSecret(registration, deps.secrets);
    if (missing) {
      throw new ApiError('invalid_request', `${missing.field}: ${missing.name} is not set on this gateway`, {
        field: missing.field,
      });
    }
    const result = await registerToolVersion(deps.db, registration, by(request, operator));
    // Even a conflict saw a version this replica may not hold yet: catch up before answering.
    if (result.ok || result.code === 'tool_version_conflict') await catchUp();
    if (!result.ok) throw new ApiError(result.code, result.message, result.details);
    return reply.code(result.created ? 201 : 200).send(operatorViewOf(result.tool, operator.role));
  });

  app.get<{ Params: ToolParams; Querystring: GetQuery }>(
    '/tools/:id',
    { config: { access: 'any' } },
    async (request) => {
      const principal = principalOf(request);
      const { id } = request.params;
      const { version } = request.query;
      const resolved = await resolveForPrincipal(principal, id, version);
      if (!resolved.ok) throw notFound(resolved.code, id, version);
      return principal.kind === 'agent' ? agentViewOf(resolved.tool) : operatorViewOf(resolved.tool, principal.role);
    },
  );

  app.get<{ Querystring: ListQuery }>('/tools', { config: { access: 'any' } }, async (request) => {
    const principal = principalOf(request);
    if (principal.kind === 'agent') {
      // Agents get all their tools in one page: they may pass no query parameter.
      const named = new URLSearchParams(request.url.split('?')[1] ?? '').keys().next();
      if (!named.done) throw invalidField(`query.${named.value}`, 'agents pass no query parameters');
      const offered = deps.catalog.offeredTo(
        { agentId: principal.id, family: principal.family },
        { externalCallEnabled: await externalCallEnabled(principal.tenantId) },
      );
      return { items: offered.map(agentViewOf), revision: deps.catalog.revision, next_cursor: null };
    }
    const query = request.query;
    const revision = deps.catalog.revision;
    let tools = deps.catalog.all();
    if (query.category) tools = tools.filter((tool) => tool.category === query.category);
    if (query.cursor !== undefined) {
      const after = decodeCursor(query.cursor, cursorPosition);
      tools = tools.filter(
        (tool) => tool.id > after.id || (tool.id === after.id && semver.lt(tool.version, after.version)),
      );
    }
    const page = tools.slice(0, query.limit);
    const last = page[page.length - 1];
    return {
      items: page.map((tool) => operatorViewOf(tool, principal.role)),
      revision,
      next_cursor: tools.length > query.limit && last ? encodeCursor({ id: last.id, version: last.version }) : null,
    };
  });

  // Declared before /tools/:id; the router prefers the static path either way, and `deprecations` is not a valid tool id.
  app.get<{ Querystring: DeprecationsQuery }>(
    '/tools/deprecations',
    { config: { access: 'operator' } },
    async (request) => {
      const window = reviewWindow(deps.now(), windowOf(request.query.within));
      return {
        items: deps.catalog.deprecations(window),
        window: { from: window.from.toISOString(), to: window.to.toISOString() },
        next_cursor: null,
      };
    },
  );

  app.get<{ Params: ToolParams }>('/tools/:id/versions', { config: { access: 'operator' } }, async (request) => {
    const { role } = operatorOf(request);
    const { id } = request.params;
    const versions = deps.catalog.versions(id);
    if (versions.length === 0) throw notFound('tool_not_registered', id, undefined);
    return { items: versions.map((tool) => operatorViewOf(tool, role)), next_cursor: null };
  });

  app.post<{ Params: VersionParams; Body: DeprecateBody }>(
    '/tools/:id/versions/:version/deprecate',
    { config: { access: 'platform-operator' } },
    async (request) => {
      const operator = operatorOf(request);
      const { id, version } = request.params;
      checkVersion(version);
      const body = request.body;
      if (body.deprecated_at !== undefined)
        requireThat(isWrittenBack(body.deprecated_at), 'body.deprecated_at', INSTANT_YEARS);
      const actor = by(request, operator);
      const result = await deprecateToolVersion(
        deps.db,
        {
          toolId: id,
          version,
          deprecation: {
            deprecated_at: (body.deprecated_at ? new Date(body.deprecated_at) : actor.now).toISOString(),
            replacement_tool_id: body.replacement_tool_id,
          },
        },
        actor,
      );
      if (!result.ok) {
        throw result.code === 'invalid_request'
          ? new ApiError(result.code, result.message, result.details)
          : new ApiError(result.code, result.message, { tool_id: id, version });
      }
      await catchUp();
      return operatorViewOf(result.tool, operator.role);
    },
  );

  app.get<{ Params: VersionParams }>(
    '/tools/:id/versions/:version/dependencies',
    { config: { access: 'operator' } },
    async (request) => {
      const { id, version } = request.params;
      checkVersion(version);
      const tool = exactVersion(id, version);
      const resolution = deps.catalog.dependencies(tool);
      return resolution.ok
        ? { tool_id: id, version, satisfied: true, resolved: resolution.resolved, unsatisfied: null }
        : { tool_id: id, version, satisfied: false, resolved: [], unsatisfied: resolution.unsatisfied };
    },
  );

  function exactVersion(toolId: string, version: string): ToolContract {
    const versions = deps.catalog.versions(toolId);
    if (versions.length === 0) throw notFound('tool_not_registered', toolId, undefined);
    const tool = versions.find((t) => t.version === version);
    if (!tool) throw notFound('tool_version_not_found', toolId, version);
    return tool;
  }

  // The change is committed whatever happens here: a failed catch-up is left to the revision check.
  async function catchUp(): Promise<void> {
    await deps.catalog
      .refresh()
      .catch((error: unknown) => app.log.warn({ err: error }, 'tool catalog refresh after a registry change failed'));
  }

  function by(request: FastifyRequest, principal: Principal) {
    return { actor: actorOf(principal), traceId: request.traceId, now: deps.now() };
  }
}

function notFound(
  code: 'tool_not_registered' | 'tool_version_not_found',
  toolId: string,
  range: string | undefined,
): ApiError {
  return code === 'tool_not_registered'
    ? new ApiError(code, `tool ${toolId} is not registered`, { tool_id: toolId })
    : new ApiError(code, `no usable version of ${toolId} matches ${range ?? 'the newest'}`, {
        tool_id: toolId,
        version: range ?? null,
      });
}
