import { Option } from 'commander';
import type { Schemas } from '../../client/index.js';
import { agentId, toolId } from '../../validation/fields.js';
import { collect, parseDuration, parseField, parseNumber, record, table } from './format.js';
import { command, IDEMPOTENCY_KEY, idempotencyHeader, listOptions, type ListOptions } from './help.js';
import { CheckFailed, Session, UsageError } from './session.js';

type Grant = Schemas['Grant'];
const SCOPES = ['per-run', 'per-pipeline-instance', 'per-session', 'per-user', 'per-tenant'];

export function grantRows(grants: Grant[]): string {
  return table(
    ['ID', 'AGENT', 'TOOL', 'SCOPE', 'SCOPE_REF', 'STATUS', 'EXPIRES_AT'],
    grants.map((g) => [g.id, g.agent_id, g.tool_id, g.scope, g.scope_ref, g.status, g.expires_at]),
  );
}

/** `--ttl 7d` from now, or `--expires-at`; exactly one. */
function expiry(options: { ttl?: number; expiresAt?: string }): string {
  if ((options.ttl === undefined) === (options.expiresAt === undefined))
    throw new UsageError('give one of --ttl and --expires-at');
  return options.expiresAt ?? new Date(Date.now() + options.ttl! * 1000).toISOString();
}

function modifiers(options: { maxCost?: number; egressDomain?: string[] }): Schemas['CapabilityModifiers'] | undefined {
  if (options.maxCost === undefined && options.egressDomain === undefined) return undefined;
  return {
    ...(options.maxCost !== undefined ? { max_cost_units: options.maxCost } : {}),
    ...(options.egressDomain ? { egress_domains: options.egressDomain } : {}),
  };
}

const withExpiry = (cmd: ReturnType<typeof command>) =>
  cmd
    .addOption(new Option('--ttl <duration>', 'lifetime from now: 90s, 15m, 12h, 7d, 2w').argParser(parseDuration))
    .option('--expires-at <time>', 'RFC 3339, instead of --ttl')
    .addOption(new Option('--max-cost <units>', 'the most one call may be charged').argParser(parseNumber))
    .addOption(new Option('--egress-domain <host>', 'narrow egress to this host (repeatable)').argParser(collect));

export function grantsCommand() {
  const grants = command(
    'grants',
    'which agent may call which tool, in which scope, until when, and why',
    'toolgate grants create --agent a1 --tool web.fetch --scope per-tenant --ttl 7d --reason "pilot"',
  );

  grants.addCommand(
    withExpiry(
      command(
        'create',
        'grant one agent one tool in one scope, for a time, for a reason',
        'toolgate grants create --agent a1 --tool web.fetch --scope per-session --ref s-42 --ttl 12h --reason "ticket 812"',
      )
        .requiredOption('--agent <id>', 'the agent', parseField(agentId))
        .requiredOption('--tool <id>', 'the tool', parseField(toolId))
        .addOption(new Option('--scope <scope>', 'what the grant is for').choices(SCOPES).makeOptionMandatory())
        .option('--ref <id>', 'the run, pipeline instance, session or user id (per-tenant: the tenant)')
        .requiredOption('--reason <text>', 'the rationale, kept with the grant')
        .option('--tenant <id>', 'platform-operators: another tenant')
        .option(...IDEMPOTENCY_KEY),
    ).action(async (options, cmd) => {
      const s = new Session(cmd);
      const capability = modifiers(options);
      const grant = await s.call(
        s.api.POST('/grants', {
          params: { header: idempotencyHeader(options) },
          body: {
            agent_id: options.agent,
            tool_id: options.tool,
            scope: options.scope,
            ...(options.ref ? { scope_ref: options.ref } : {}),
            ...(options.tenant ? { tenant_id: options.tenant } : {}),
            ...(capability ? { capability_modifiers: capability } : {}),
            expires_at: expiry(options),
            rationale: options.reason,
          },
        }),
      );
      s.print(grant, () => record(grant));
    }),
  );

  grants.addCommand(
    listOptions(command('list', 'grants, newest first', 'toolgate grants list --agent a1 --status live'), 500)
      .option('--agent <id>')
      .option('--tool <id>')
      .option('--tenant <id>')
      .addOption(new Option('--scope <scope>').choices(SCOPES))
      .option('--ref <id>', 'scope_ref')
      .addOption(new Option('--status <status>').choices(['live', 'expired', 'revoked']))
      .action(
        async (
          options: ListOptions & {
            agent?: string;
            tool?: string;
            tenant?: string;
            scope?: Schemas['GrantScope'];
            ref?: string;
            status?: Schemas['GrantStatus'];
          },
          cmd,
        ) => {
          const s = new Session(cmd);
          const page = await s.page(
            options.all,
            (cursor) =>
              s.call(
                s.api.GET('/grants', {
                  params: {
                    query: {
                      agent_id: options.agent,
                      tool_id: options.tool,
                      tenant_id: options.tenant,
                      scope: options.scope,
                      scope_ref: options.ref,
                      status: options.status,
                      limit: options.limit,
                      cursor,
                    },
                  },
                }),
              ),
            options.cursor,
          );
          s.print(page, () => grantRows(page.items));
          s.more(page.next_cursor);
        },
      ),
  );

  grants.addCommand(
    command('show', 'one grant and its standing now', 'toolgate grants show grt_V1StGXR8')
      .argument('<id>')
      .action(async (id: string, _options, cmd) => {
        const s = new Session(cmd);
        const grant = await s.call(s.api.GET('/grants/{id}', { params: { path: { id } } }));
        s.print(grant, () => record(grant));
      }),
  );

  grants.addCommand(
    command(
      'revoke',
      'revoke a grant by id, or every live grant of an agent for a tool',
      'toolgate grants revoke grt_V1StGXR8 --reason "incident 7"',
      'toolgate grants revoke --agent a1 --tool web.fetch --reason "incident 7"',
    )
      .argument('[id]', 'the grant (or give --agent and --tool)')
      .requiredOption('--reason <text>', 'why, kept with the revocation')
      .option('--agent <id>', 'with --tool: every live grant of this agent for the tool', parseField(agentId))
      .addOption(new Option('--tool <id>').argParser(parseField(toolId)))
      .option('--tenant <id>', 'platform-operators: the tenant of those grants')
      .action(
        async (
          id: string | undefined,
          options: { reason: string; agent?: string; tool?: string; tenant?: string },
          cmd,
        ) => {
          const s = new Session(cmd);
          const byMatch = options.agent !== undefined || options.tool !== undefined;
          if (id ? byMatch : !(options.agent && options.tool))
            throw new UsageError('give a grant id, or both --agent and --tool');
          const ids = id
            ? [id]
            : (
                await s.page(true, (cursor) =>
                  s.call(
                    s.api.GET('/grants', {
                      params: {
                        query: {
                          agent_id: options.agent,
                          tool_id: options.tool,
                          tenant_id: options.tenant,
                          status: 'live',
                          limit: 500,
                          cursor,
                        },
                      },
                    }),
                  ),
                )
              ).items.map((g) => g.id);
          const revoked: Grant[] = [];
          for (const grantId of ids)
            revoked.push(
              await s.call(
                s.api.POST('/grants/{id}/revoke', {
                  params: { path: { id: grantId } },
                  body: { reason: options.reason },
                }),
              ),
            );
          if (!id && revoked.length === 0) s.note(`no live grant of ${options.agent} for ${options.tool}`);
          s.print(id ? revoked[0] : { items: revoked }, () => (revoked.length ? grantRows(revoked) : ''));
        },
      ),
  );

  grants.addCommand(
    withExpiry(
      command(
        'renew',
        'renew a grant as a new grant with a fresh reason and expiry (the old one ends)',
        'toolgate grants renew grt_V1StGXR8 --ttl 30d --reason "pilot extended"',
      )
        .argument('<id>')
        .requiredOption('--reason <text>', 'the new rationale'),
    ).action(async (id: string, options, cmd) => {
      const s = new Session(cmd);
      const capability = modifiers(options);
      const grant = await s.call(
        s.api.POST('/grants/{id}/renew', {
          params: { path: { id } },
          body: {
            rationale: options.reason,
            expires_at: expiry(options),
            ...(capability ? { capability_modifiers: capability } : {}),
          },
        }),
      );
      s.print(grant, () => record(grant));
    }),
  );

  grants.addCommand(
    command(
      'resolve',
      'which grant applies to a call of an agent to a tool, or why none does (exit 1 when none)',
      'toolgate grants resolve --agent a1 --tool web.fetch --session s-42',
    )
      .addOption(new Option('--agent <id>').argParser(parseField(agentId)).makeOptionMandatory())
      .addOption(new Option('--tool <id>').argParser(parseField(toolId)).makeOptionMandatory())
      .option('--tenant <id>', "default: the caller's tenant")
      .option('--run <id>')
      .option('--pipeline-instance <id>')
      .option('--session <id>')
      .option('--user <id>')
      .action(
        async (
          options: {
            agent: string;
            tool: string;
            tenant?: string;
            run?: string;
            pipelineInstance?: string;
            session?: string;
            user?: string;
          },
          cmd,
        ) => {
          const s = new Session(cmd);
          const resolution = await s.call(
            s.api.GET('/grants/resolve', {
              params: {
                query: {
                  agent_id: options.agent,
                  tool_id: options.tool,
                  tenant_id: options.tenant,
                  run_id: options.run,
                  pipeline_instance_id: options.pipelineInstance,
                  session_id: options.session,
                  user_id: options.user,
                },
              },
            }),
          );
          s.print(resolution, () => {
            const verdict = resolution.ok
              ? `${resolution.agent_id} may call ${resolution.tool_id}: grant ${resolution.grant!.id}`
              : `${resolution.agent_id} may not call ${resolution.tool_id}: ${resolution.code}`;
            const candidates = resolution.candidates.length
              ? table(
                  ['', 'ID', 'SCOPE', 'SCOPE_REF', 'PRIORITY', 'STATUS', 'EXPIRES_AT'],
                  resolution.candidates.map((c) => [
                    c.selected ? '*' : ' ',
                    c.grant.id,
                    c.grant.scope,
                    c.grant.scope_ref,
                    c.priority,
                    c.status,
                    c.grant.expires_at,
                  ]),
                )
              : 'no grant matches this context';
            return `${verdict}\n\n${candidates}`;
          });
          if (!resolution.ok)
            throw new CheckFailed(
              `${resolution.code}: no live grant of ${resolution.agent_id} for ${resolution.tool_id} applies`,
            );
        },
      ),
  );
  return grants;
}
