import { randomBytes } from 'node:crypto';
import type { Logger } from 'pino';
import type { AdmissionPorts } from './admission/ports.js';
import { ApprovalService } from './approvals/approval-service.js';
import { AuditLog } from './audit/audit-log.js';
import { BudgetLedger } from './budgets/budget-ledger.js';
import type { Config } from './config/config.js';
import type { Database } from './db/database.js';
import { waitAtMost } from './db/wait-at-most.js';
import { createEgressExecutor } from './egress/egress-executor.js';
import type { Resolver } from './egress/resolver.js';
import { GrantAdmission, GrantUses } from './grants/grant-admission.js';
import { GrantExpirySweeper } from './grants/grant-expiry-sweeper.js';
import { GrantService } from './grants/grant-service.js';
import { GrantSnapshot } from './grants/grant-snapshot.js';
import type { ToolFacts } from './grants/tool-facts.js';
import { HandoffService } from './handoffs/handoff-service.js';
import { IdempotencyKeys } from './idempotency/idempotency-keys.js';
import { KillSwitchService } from './kill-switches/kill-switch-service.js';
import { KillSwitchSnapshot } from './kill-switches/kill-switch-snapshot.js';
import { countStatementsSent, createMetrics, watchCatalogAge, type Metrics } from './metrics/metrics.js';
import { BackendClient } from './proxy/backend-client.js';
import { RateLimiter } from './rate-limits/rate-limiter.js';
import type { AgentIdentity } from './registry/tool-access.js';
import { ToolCatalog } from './registry/tool-catalog.js';
import { ReplicaLease } from './replicas/replica-lease.js';
import { RetentionSweeper } from './retention/retention-sweeper.js';
import { RunCascades } from './runs/run-cascades.js';
import { RunControls } from './runs/run-controls.js';
import {
  callEndRider,
  runStartGuard,
  type CallEnd,
  type CallEndAnswer,
  type RunStartChange,
} from './runs/run-end-rider.js';
import type { ClaimedRunStartAnswer } from './runs/run-claim-repository.js';
import { AuditCheckpoints } from './audit/audit-checkpoints.js';
import { AuditPartitions } from './audit/audit-partitions.js';
import { CheckpointSigner } from './audit/checkpoint-signer.js';
import { AuditTree } from './audit/audit-tree.js';
import { logSigner } from './audit/log-key.js';
import { LogSequencer } from './audit/log-sequencer.js';
import { RunExecutor } from './runs/run-executor.js';
import { RunRecovery } from './runs/run-recovery.js';
import { getTenantPolicy } from './tenants/tenant-policy.js';

export interface ServiceOptions {
  config: Config;
  database: Database;
  logger: Logger;
  now?: () => Date;
  /** How the egress executor resolves host names (default `dns.lookup`); tests stand in for the internet. */
  resolver?: Resolver;
  /** This replica's id in the `replicas` table (default: a fresh random one). */
  replicaId?: string;
}

/** The kill-switch target of the version an agent's call gets, as the executor resolves it. */
export type CallTarget = (
  agent: AgentIdentity | null,
  toolId: string,
  tenantId: string,
) => Promise<ToolFacts['target'] | undefined>;

/** The services built once by the composition root and shared by every route. */
export interface Services {
  config: Config;
  database: Database;
  audit: AuditLog<CallEnd, CallEndAnswer, RunStartChange, ClaimedRunStartAnswer | undefined>;
  /** Signed checkpoints of the audit chain, and verification from one. */
  auditCheckpoints: AuditCheckpoints;
  /** The log as a Merkle tree: checkpoints, proofs, receipts and verification (SPEC §8.1). */
  auditTree: AuditTree;
  /** Sequences committed records into the tree, while this replica holds the sequencer's lease. */
  auditSequencer: LogSequencer;
  /** The audit log's monthly partitions: kept ahead, sealed, exported and detached. */
  auditPartitions: AuditPartitions;
  metrics: Metrics;
  now: () => Date;
  /** This replica's copy of the tool registry: synchronous lookups for the hot path. */
  catalog: ToolCatalog;
  /** Budget admission: reserve before dispatch, settle or release after. */
  budgets: BudgetLedger;
  /** Token buckets per (tenant, agent, tool). */
  rateLimiter: RateLimiter;
  /** Grant changes, and grant resolution read from the database (the exact path). */
  grants: GrantService;
  /** This replica's copy of the live grants, which the grant stage decides from. */
  grantSnapshot: GrantSnapshot;
  /** This replica's kill-switch snapshot: `decide` for the admission pipeline. */
  killSwitches: KillSwitchSnapshot;
  /** Arming and disarming kill switches, stopping the runs they cover. */
  killSwitchChanges: KillSwitchService;
  /** Executes runs: admission, dispatch, audit. */
  runs: RunExecutor;
  /** Run controls: cancel, kill, pause, resume, complete. */
  runControls: RunControls;
  /** Proposed actions and the operators' decisions on them (the approval stage). */
  approvals: ApprovalService;
  /** Sub-agent hand-offs. */
  handoffs: HandoffService;
  /** This replica's lease: what tells the others it is alive. */
  lease: ReplicaLease;
  /** Ends busy runs whose executor was lost. */
  recovery: RunRecovery;
  idempotencyKeys: IdempotencyKeys;
  callTarget: CallTarget;
  /** Whether a tenant has enabled `external_call` tools. */
  externalCallEnabled: (tenantId: string) => Promise<boolean>;
  /** Starts the replica's background work (lease, caches, sweepers), once the app is ready. */
  start(): Promise<void>;
  /** Stops it and lets go of what the services hold; the database itself is the caller's. */
  close(): Promise<void>;
}

/** The composition root: builds every service once, each handed what it needs. */
export function buildServices(options: ServiceOptions): Services {
  const { config, database, logger } = options;
  const now = options.now ?? (() => new Date());
  const metrics = createMetrics();
  const budgets = new BudgetLedger(database, {
    now,
    registry: metrics.registry,
    reservationTtlMs: config.budgetReservationTtlSeconds * 1000,
    sweepIntervalMs: Math.min(60_000, (config.budgetReservationTtlSeconds * 1000) / 2),
    onSweepError: (error) => logger.warn({ err: error }, 'releasing abandoned budget reservations failed'),
  });
  const audit = new AuditLog<CallEnd, CallEndAnswer, RunStartChange, ClaimedRunStartAnswer | undefined>(database, {
    now,
    onCommit: (batchSize) => {
      metrics.auditEventsCommitted.inc(batchSize);
      metrics.auditCommitBatchSize.observe(batchSize);
    },
    rider: callEndRider(budgets.settlements),
    guard: runStartGuard(budgets),
  });
  const catalog = new ToolCatalog({
    database,
    secrets: config.secrets,
    now,
    logger,
    refreshIntervalMs: config.registryRefreshMs,
  });
  watchCatalogAge(metrics, () => catalog.ageMs());
  countStatementsSent(metrics, () => database.statementsSent());
  const rateLimiter = new RateLimiter(database, { now, registry: metrics.registry });
  const externalCallEnabled = async (tenantId: string) =>
    (await getTenantPolicy(database.control, tenantId)).external_call_enabled;
  // Pulling authority stops the runs that rely on it, in the same transaction.
  const resolveTarget = async (
    agent: AgentIdentity | null,
    toolId: string,
    range: string | undefined,
    enabled: () => Promise<boolean>,
  ) => {
    const resolved = await catalog.resolve(toolId, range, { as: 'caller', agent, externalCallEnabled: enabled });
    return resolved.ok ? resolved.tool.target : undefined;
  };
  const callTarget: CallTarget = (agent, toolId, tenantId) =>
    resolveTarget(agent, toolId, undefined, () => externalCallEnabled(tenantId));
  const cascades = new RunCascades(
    resolveTarget,
    async (trx, tenantId) => (await getTenantPolicy(trx, tenantId)).external_call_enabled,
  );
  const grants = new GrantService({
    database,
    audit,
    tools: catalog,
    now,
    onGrantsEnded: cascades.grantsEnded,
  });
  // Kept current, and bounded in staleness, like the kill switches.
  const grantSnapshot = new GrantSnapshot({
    db: database.control,
    listener: database.listener,
    registry: metrics.registry,
    logger,
    now,
    ...config.killSwitches,
  });
  const killSwitches = new KillSwitchSnapshot({
    database,
    listener: database.listener,
    registry: metrics.registry,
    logger,
    ...config.killSwitches,
  });
  const expirySweeper = new GrantExpirySweeper({
    database,
    now,
    intervalMs: config.grants.expirySweepIntervalMs,
    logger,
    onGrantsEnded: cascades.grantsEnded,
  });
  const approvals = new ApprovalService({ database, now });
  const grantUses = new GrantUses(database, metrics.registry);
  const ports: AdmissionPorts = {
    catalog,
    grants: new GrantAdmission(grantSnapshot, grants, now, metrics.registry),
    killSwitches,
    budgets,
    rateLimiter,
    tenantPolicy: { externalCallEnabled },
    egress: createEgressExecutor({
      allowCidrs: config.egressAllowCidrs,
      ...(options.resolver ? { resolver: options.resolver } : {}),
    }),
    approvals,
    grantUses,
  };
  const backend = new BackendClient();
  const approvalTtlMs = config.approvalTtlSeconds * 1000;
  const replicaId = options.replicaId ?? `rep_${randomBytes(8).toString('hex')}`;
  const lease = new ReplicaLease({ database, id: replicaId, leaseMs: config.replicaLeaseMs, logger });
  const recovery = new RunRecovery({
    database,
    replicaId,
    now,
    intervalMs: config.replicaLeaseMs / 2,
    logger,
    registry: metrics.registry,
  });
  const retention = new RetentionSweeper({
    database,
    now,
    retentionDays: config.retention.days,
    intervalMs: config.retention.sweepIntervalMs,
    logger,
    registry: metrics.registry,
  });
  const runs = new RunExecutor({
    database,
    audit,
    ports,
    backend,
    metrics,
    now,
    approvalTtlMs,
    approvals,
    replicaId,
    recovery,
    lease,
    charges: budgets,
  });
  const signer = new CheckpointSigner({
    signingKeyPem: config.auditCheckpoints.signingKey,
    verifyKeysPem: config.auditCheckpoints.verifyKeys,
  });
  const auditCheckpoints = new AuditCheckpoints({
    database,
    signer,
    now,
    logger,
    intervalSeconds: config.auditCheckpoints.intervalSeconds,
  });
  const noteSigner = logSigner({
    origin: config.auditLog.origin,
    signingKeyPem: config.auditCheckpoints.signingKey,
    dataDir: config.dataDir,
  });
  const auditTree = new AuditTree(
    database,
    noteSigner,
    config.auditLog.sequenceIntervalMs,
    config.auditCheckpoints.verifyKeys,
  );
  const auditPartitions = new AuditPartitions({ database, signer, tree: auditTree, now, logger });
  const auditSequencer = new LogSequencer({
    database,
    signer: noteSigner,
    replicaId,
    intervalMs: config.auditLog.sequenceIntervalMs,
    logger,
    onSequenced: (delays) => delays.forEach((delay) => metrics.auditSequencingDelay.observe(delay)),
  });
  const runControls = new RunControls({ database, executor: runs, replicaId, approvals, now });
  const handoffs = new HandoffService({
    database,
    grants,
    grantUses,
    now,
    approvalTtlMs,
    maxDepth: config.handoffs.maxDepth,
    rootMaxFanout: config.handoffs.rootMaxFanout,
  });

  return {
    config,
    database,
    audit,
    auditCheckpoints,
    auditPartitions,
    auditTree,
    auditSequencer,
    metrics,
    now,
    catalog,
    budgets,
    rateLimiter,
    grants,
    grantSnapshot,
    killSwitches,
    killSwitchChanges: new KillSwitchService(database, killSwitches, now, cascades.killSwitchArmed),
    runs,
    runControls,
    approvals,
    handoffs,
    lease,
    recovery,
    idempotencyKeys: new IdempotencyKeys({ database, now }),
    callTarget,
    externalCallEnabled,
    async start() {
      await lease.start();
      await catalog.start();
      await killSwitches.start();
      await grantSnapshot.start();
      expirySweeper.start();
      recovery.start();
      retention.start();
      auditCheckpoints.start();
      auditPartitions.start();
      auditSequencer.start();
    },
    // Each step that needs the database waits for it at most CLOSE_STEP_WAIT_MS: in a silent
    // partition none would ever finish, and closing the database (the caller's next step) destroys
    // the connections still waiting.
    async close() {
      await Promise.all([
        expirySweeper.stop(),
        recovery.stop(),
        retention.stop(),
        auditCheckpoints.stop(),
        auditPartitions.stop(),
        auditSequencer.stop(),
      ]);
      await Promise.all([
        // Every call in flight has finished: nothing this replica held is busy any more.
        lease.stop(),
        waitAtMost(
          Promise.all([
            catalog.close(),
            budgets.close(),
            rateLimiter.close(),
            killSwitches.stop(),
            grantSnapshot.stop(),
          ]),
        ),
        backend.close(),
      ]);
      await waitAtMost(audit.drain());
    },
  };
}
