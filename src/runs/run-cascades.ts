import type { Transaction } from 'kysely';
import type { DB } from '../db/schema.js';
import type { Grant } from '../grants/grant.js';
import { switchMatches } from '../kill-switches/kill-switch-decision.js';
import type { KillSwitch } from '../kill-switches/kill-switch.js';
import { endRunTrees } from './run-lifecycle.js';
import { findOpenRunsUsingGrants, listOpenRuns, type RunRecord } from './run-repository.js';

/**
 * The kill-switch target of the version an agent's call resolves to (`catalog.resolve` as `caller`), so a cascade
 * judges the version the call would run, not a newer one the agent may not use.
 */
export type ToolTargetLookup = (
  agent: { agentId: string; family: string | undefined },
  toolId: string,
  range: string | undefined,
  externalCallEnabled: () => Promise<boolean>,
) => Promise<{ family?: string | null; provider?: string | null; region?: string | null } | null | undefined>;

/** Whether a tenant's policy enables external calls, read in the cascade's transaction. */
export type ExternalCallPolicy = (trx: Transaction<DB>, tenantId: string) => Promise<boolean>;

/**
 * The cascades, in the transaction that pulls the authority: a grant revoked or expired, or a kill switch armed, stops
 * every open run it would stop at its next call, with its sub-runs. A run executing notices at its next call boundary.
 */
export class RunCascades {
  constructor(
    private readonly toolTarget: ToolTargetLookup,
    private readonly externalCallEnabled: ExternalCallPolicy,
  ) {}

  readonly grantsEnded = async (
    trx: Transaction<DB>,
    ended: Grant[],
    cause: { code: 'grant_revoked' | 'grant_expired'; actor: string; traceId?: string | null | undefined },
    at: Date,
  ): Promise<void> => {
    for (const grant of ended) {
      const roots = await findOpenRunsUsingGrants(trx, grant.tenant_id, [grant.id]);
      if (roots.length === 0) continue;
      await endRunTrees(
        trx,
        {
          roots,
          status: 'failed',
          stop: {
            code: cause.code,
            message: `grant ${grant.id} for ${grant.tool_id} was ${cause.code === 'grant_revoked' ? 'revoked' : 'expired'}`,
            details: { cause: cause.code, grant_id: grant.id, tool_id: grant.tool_id },
          },
          eventType: 'run.stopped',
          actor: cause.actor,
          traceId: cause.traceId,
        },
        at,
      );
    }
  };

  readonly killSwitchArmed = async (
    trx: Transaction<DB>,
    ks: KillSwitch,
    cause: { actor: string; traceId?: string | null | undefined },
    at: Date,
  ): Promise<void> => {
    const open = await listOpenRuns(trx, ks.tenant_id);
    // Each tenant's policy is read once per arming, and only if a call's version depends on it.
    const policies = new Map<string, Promise<boolean>>();
    const policyOf = (tenantId: string) => () => {
      let enabled = policies.get(tenantId);
      if (!enabled) policies.set(tenantId, (enabled = this.externalCallEnabled(trx, tenantId)));
      return enabled;
    };
    const roots: RunRecord[] = [];
    for (const run of open) if (await this.stoppedBy(run, ks, policyOf(run.tenant_id))) roots.push(run);
    if (roots.length === 0) return;
    await endRunTrees(
      trx,
      {
        roots,
        status: 'killed',
        stop: {
          code: 'kill_switch_active',
          message: ks.user_visible_status_copy,
          details: {
            cause: 'kill_switch',
            kill_switch_id: ks.id,
            scope: ks.scope,
            target: ks.target,
            platform_wide: ks.tenant_id === null,
          },
        },
        eventType: 'run.stopped',
        actor: cause.actor,
        traceId: cause.traceId,
      },
      at,
    );
  };

  /**
   * Whether the switch matches the run itself (tenant, agent, family) or a call it has yet to
   * make, each call's tool resolved as the run's agent's call resolves it.
   */
  private async stoppedBy(
    run: RunRecord,
    ks: KillSwitch,
    externalCallEnabled: () => Promise<boolean>,
  ): Promise<boolean> {
    const who = { tenantId: run.tenant_id, agentId: run.agent_id, family: run.agent_family ?? undefined };
    if (switchMatches(ks, who)) return true;
    const done = (run.envelope?.steps ?? []).findIndex((s) => s.status !== 'completed');
    const remaining = (run.request?.plan ?? []).slice(done === -1 ? (run.envelope?.steps.length ?? 0) : done);
    for (const step of remaining) {
      const target = await this.toolTarget(
        { agentId: who.agentId, family: who.family },
        step.tool_id,
        step.version,
        externalCallEnabled,
      );
      if (switchMatches(ks, { ...who, toolId: step.tool_id, target: target ?? null })) return true;
    }
    return false;
  }
}
