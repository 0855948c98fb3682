import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { Kysely } from 'kysely';
import { z } from 'zod';
import { actorOf, type Principal } from '../../auth/principal.js';
import type { DB } from '../../db/schema.js';
import type { CatalogResolution, ToolCatalog } from '../../registry/tool-catalog.js';
import { TOOL_ID_PATTERN } from '../../registry/tool-contract.js';
import { missingSecret, toolRegistrationSchema } from '../../registry/tool-registration.js';
import { registerToolVersion } from '../../registry/tool-registry.js';
import { agentViewOf, operatorViewOf } from '../../registry/tool-views.js';
import { operatorOf, principalOf } from '../auth.js';
import { ApiError } from '../errors.js';
import { parseInput } from '../validation.js';

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

const toolParams = z.strictObject({ id: z.string().max(200).regex(TOOL_ID_PATTERN, 'must be a tool id') });
const getQuery = z.strictObject({ version: z.string().min(1).max(200).optional() });

/**
 * The tool registry (SPEC §2). Reads are answered from this replica's catalog (never more than
 * about a second behind the database); writes refresh it before answering, so an operator
 * reads its own writes.
 */
export async function toolRoutes(app: FastifyInstance, deps: ToolRouteDeps): Promise<void> {
  const externalCallEnabled = deps.externalCallEnabled ?? (async () => false);

  /** The resolution an agent gets: only versions it may use exist for it. */
  async function resolveForPrincipal(principal: Principal, toolId: string, range: string | undefined): Promise<CatalogResolution> {
    if (principal.kind !== 'agent') return deps.catalog.resolve(toolId, range);
    return deps.catalog.resolveFor({ agentId: principal.id, family: principal.family }, toolId, range, {
      externalCallEnabled: await externalCallEnabled(principal.tenantId),
    });
  }

  app.post('/tools', { config: { access: 'platform-operator' } }, async (request, reply) => {
    const operator = operatorOf(request);
    const registration = parseInput(toolRegistrationSchema, request.body, 'body');
    const missing = missingSecret(registration, deps.secrets);
    if (missing) {
      throw new ApiError('invalid_request', `${missing.field}: ${missing.name} is not set on this gateway`, { field: missing.field });
    }
    const result = await registerToolVersion(deps.db, registration, by(request, operator));
    if (!result.ok) throw new ApiError(result.code, result.message, result.details);
    await deps.catalog.refresh();
    return reply.code(result.created ? 201 : 200).send(operatorViewOf(result.tool));
  });

  app.get('/tools/:id', { config: { access: 'any' } }, async (request) => {
    const principal = principalOf(request);
    const { id } = parseInput(toolParams, request.params, 'params');
    const { version } = parseInput(getQuery, request.query, 'query');
    const resolved = await resolveForPrincipal(principal, id, version);
    if (!resolved.ok) throw notFound(resolved.code, id, version);
    return principal.kind === 'agent' ? agentViewOf(resolved.tool) : operatorViewOf(resolved.tool);
  });

  function by(request: FastifyRequest, principal: Principal) {
    return { actor: actorOf(principal), traceId: request.traceId, now: deps.now() };
  }
}

function notFound(code: 'tool_not_registered' | 'tool_version_not_found', toolId: string, range: string | undefined): ApiError {
  return code === 'tool_not_registered'
    ? new ApiError(code, `tool ${toolId} is not registered`, { tool_id: toolId })
    : new ApiError(code, `no usable version of ${toolId} matches ${range ?? 'the newest'}`, { tool_id: toolId, version: range ?? null });
}
