import type { ColumnType, Generated } from 'kysely';

/** Row shapes of toolgate's tables, as kysely sees them. Domain types are mapped in each room. */
export interface AuditEventTable {
  seq: ColumnType<string | number | bigint, number, never>;
  event_id: string;
  occurred_at: ColumnType<Date, Date, never>;
  tenant_id: string | null;
  actor: string;
  agent_id: string | null;
  event_type: string;
  run_id: string | null;
  tool_call_id: string | null;
  tool_id: string | null;
  tool_version: string | null;
  tool_category: string | null;
  risk_level: string | null;
  trace_id: string | null;
  organization_id: string | null;
  assessment_id: string | null;
  status: string | null;
  reason_code: string | null;
  // The four SHA-256s are stored as their bytes (migration 0022); readers select them as hex (encode).
  input_sha256: Buffer | null;
  output_sha256: Buffer | null;
  duration_ms: number | null;
  cost_units: number | null;
  details: ColumnType<Record<string, unknown>, string, never>;
  prev_hash: Buffer | null;
  hash: Buffer | null;
  hash_scheme: ColumnType<1 | 2 | 3, 1 | 2 | 3, never>;
}

export interface AuditChainHeadTable {
  id: number;
  seq: string | number | bigint;
  hash: string;
  /** Since migration 0026: once true, records are leaves only and the chain ends at this head. */
  closed: ColumnType<boolean, never, boolean>;
}

/** Leaf records committed and not yet sequenced; migration 0026. */
export interface AuditUnsequencedTable {
  seq: string | number | bigint;
}

export interface AuditCheckpointTable {
  id: string;
  seq: ColumnType<string, number, never>;
  hash: string;
  at: ColumnType<Date, Date, never>;
  key_id: string | null;
  signature: string | null;
  created_by: string;
  /** Set on a checkpoint that seals a range of leaves: its last leaf, whose leaf hash `hash` is. */
  leaf_index: ColumnType<string | null, number | null | undefined, never>;
}

/** The Merkle tree as the sequencer last left it, and its lease (one row). */
export interface AuditTreeStateTable {
  id: number;
  tree_size: ColumnType<string, number, number>;
  last_seq: ColumnType<string, number, number>;
  root_hash: Buffer;
  sequencer: string | null;
  lease_until: Date | null;
}

/** Which record each leaf of the tree is (append-only). */
export interface AuditLeafTable {
  leaf_index: ColumnType<string, number, never>;
  seq: ColumnType<string, number, never>;
  event_id: string;
}

/** The tree's tiles: node hashes at tree level 8·level, 256 a tile (C2SP tlog-tiles). */
export interface AuditTreeTileTable {
  level: number;
  idx: ColumnType<string, number, number>;
  hashes: Buffer;
}

/** Every signed checkpoint of the tree published (append-only). */
export interface AuditTreeCheckpointTable {
  tree_size: ColumnType<string, number, never>;
  root_hash: Buffer;
  note: string;
  published_at: ColumnType<Date, Date | undefined, never>;
}

/** A partition an operator detached after exporting it (append-only). */
export interface AuditPartitionArchiveTable {
  event_seq: ColumnType<string, number, never>;
  partition: string;
  from_seq: ColumnType<string, number, never>;
  to_seq: ColumnType<string, number, never>;
  /** Null for a range of leaves, which chains from nothing. */
  prev_hash: string | null;
  first_hash: string;
  last_hash: string;
  row_count: ColumnType<string, number, never>;
  /** The leaves a detached month of leaf records archives; null for a range of the chain. */
  from_leaf: ColumnType<string | null, number | null | undefined, never>;
  to_leaf: ColumnType<string | null, number | null | undefined, never>;
  last_leaf_hash: string | null;
  checkpoint_id: string;
  detached_by: string;
  detached_at: ColumnType<Date, Date, never>;
}

export interface SchemaMigrationTable {
  version: string;
  applied_at: Generated<Date>;
  /** SHA-256 of the file as applied; null for rows from before checksums were kept. */
  checksum: string | null;
}

// Budgets and rate limits (migrations/0005). numeric columns arrive as text.
export interface BudgetTable {
  id: string;
  tenant_id: string;
  scope: string;
  agent_id: string | null;
  run_id: string | null;
  period: string;
  limit_units: ColumnType<string, string, string>;
  warn_ratio: number;
  grace_units: ColumnType<string, string, string>;
  created_at: ColumnType<Date, Date, never>;
  created_by: ColumnType<string, string, never>;
  updated_at: Date;
  updated_by: string;
  removed_at: Date | null;
  removed_by: string | null;
}

export interface BudgetCounterTable {
  counter_key: string;
  period_start: Date;
  spent_units: ColumnType<string, string | undefined, string>;
  reserved_units: ColumnType<string, string | undefined, string>;
}

export interface BudgetReservationTable {
  id: string;
  tenant_id: string;
  agent_id: string;
  run_id: string;
  units: ColumnType<string, string, never>;
  actual_units: ColumnType<string | null, string | null, string | null>;
  status: string;
  charges: ColumnType<Array<{ counter_key: string; period_start: string }>, string, never>;
  reserved_at: ColumnType<Date, Date, never>;
  expires_at: ColumnType<Date, Date, never>;
  closed_at: Date | null;
}

/** What deleted settled reservations had spent, per (tenant, agent) (migration 0011). */
export interface BudgetSpendArchiveTable {
  tenant_id: string;
  agent_id: string;
  spent_units: ColumnType<string, string, string>;
}

export interface RateBucketTable {
  tenant_id: string;
  agent_id: string;
  tool_id: string;
  tokens: number;
  updated_at: Date;
}

/** Grants; migration 0003. */
export interface GrantTable {
  id: string;
  tenant_id: string;
  agent_id: string;
  tool_id: string;
  scope: string;
  scope_ref: string;
  capability_modifiers: ColumnType<Record<string, unknown>, string, string>;
  expires_at: Date;
  granted_by_actor_id: string;
  granted_by_actor_role: string;
  rationale: string;
  granted_at: Date;
  revoked_at: Date | null;
  revoked_by_actor_id: string | null;
  revoked_by_actor_role: string | null;
  revocation_reason: string | null;
  renewed_from: string | null;
  superseded_by: string | null;
  expiry_recorded_at: Date | null;
  /** Set by migration 0015's trigger on creation and revocation: the grant_state version of the change. */
  version: ColumnType<string | number, never, never>;
}

/** Kill switches; migration 0003. */
export interface KillSwitchTable {
  id: string;
  scope: string;
  target: string;
  tenant_id: string | null;
  reason: string;
  user_visible_status_copy: string;
  safe_degradation_mode_id: string | null;
  armed_by_actor_id: string;
  armed_by_actor_role: string;
  armed_at: Date;
  disarmed_at: Date | null;
  disarmed_by_actor_id: string | null;
  disarmed_by_actor_role: string | null;
  disarm_reason: string | null;
}

export interface KillSwitchStateTable {
  id: number;
  version: ColumnType<number, number, number>;
}

/** The version of the grants every replica's snapshot compares against; migration 0015. */
export interface GrantStateTable {
  id: number;
  version: ColumnType<string | number, never, never>;
}

export interface DB {
  audit_events: AuditEventTable;
  audit_chain_head: AuditChainHeadTable;
  audit_checkpoints: AuditCheckpointTable;
  audit_partition_archives: AuditPartitionArchiveTable;
  audit_tree_state: AuditTreeStateTable;
  audit_leaves: AuditLeafTable;
  audit_tree_tiles: AuditTreeTileTable;
  audit_tree_checkpoints: AuditTreeCheckpointTable;
  audit_unsequenced: AuditUnsequencedTable;
  schema_migrations: SchemaMigrationTable;
  grants: GrantTable;
  grant_state: GrantStateTable;
  kill_switches: KillSwitchTable;
  kill_switch_state: KillSwitchStateTable;
  runs: RunTable;
  replicas: ReplicaTable;
  tenant_policies: TenantPolicyTable;
  tool_versions: ToolVersionTable;
  registry_revision: RegistryRevisionTable;
  budgets: BudgetTable;
  budget_counters: BudgetCounterTable;
  budget_reservations: BudgetReservationTable;
  budget_spend_archive: BudgetSpendArchiveTable;
  rate_buckets: RateBucketTable;
  run_grant_uses: RunGrantUseTable;
  handoffs: HandoffTable;
  approvals: ApprovalTable;
  idempotency_keys: IdempotencyKeyTable;
}

/** Idempotency keys of creating requests (migrations 0013, 0023). */
export interface IdempotencyKeyTable {
  tenant_id: string;
  actor: string;
  role: string;
  key: string;
  fingerprint: string;
  status_code: number | null;
  response: string | null;
  created_at: Date;
  completed_at: Date | null;
}

export interface RunTable {
  tenant_id: string;
  run_id: string;
  owner_agent_id: string;
  parent_run_id: string | null;
  pipeline_instance_id: string | null;
  session_id: string | null;
  user_id: string | null;
  status: string;
  request_sha256: string | null;
  trace_id: string | null;
  http_status: number | null;
  envelope: ColumnType<unknown, string | null, string | null>;
  created_at: ColumnType<Date, Date | undefined, never>;
  updated_at: ColumnType<Date, Date | undefined, Date>;
  // migration 0008
  request: ColumnType<unknown, string | null | undefined, string | null>;
  agent_family: string | null;
  agent_scopes: ColumnType<string[], string[] | undefined, string[]>;
  depth: ColumnType<number, number | undefined, number>;
  lineage: ColumnType<unknown, string | undefined, string>;
  budget_units: ColumnType<string | null, string | null | undefined, string | null>;
  keep_open: ColumnType<boolean, boolean | undefined, boolean>;
  epoch: ColumnType<number, number | undefined, number>;
  busy: ColumnType<boolean, boolean | undefined, boolean>;
  stop: ColumnType<unknown, string | null | undefined, string | null>;
  // migration 0009
  executor_id: ColumnType<string | null, string | null | undefined, string | null>;
}

/** Gateway processes and their leases (migration 0009). */
export interface ReplicaTable {
  id: string;
  hostname: string;
  pid: number;
  started_at: ColumnType<Date, Date | undefined, never>;
  renewed_at: ColumnType<Date, Date | undefined, Date>;
  expires_at: ColumnType<Date, Date, Date>;
}

/** Grants each run relied on (migration 0008): what a revocation or expiry cascades to. */
export interface RunGrantUseTable {
  grant_id: string;
  tenant_id: string;
  run_id: string;
  first_used_at: ColumnType<Date, Date | undefined, never>;
}

/** Hand-offs from a parent run to a sub-agent's run (migration 0008). numeric arrives as text. */
export interface HandoffTable {
  id: string;
  tenant_id: string;
  parent_run_id: string;
  sub_run_id: string;
  parent_agent_id: string;
  sub_agent_id: string;
  budget_units: ColumnType<string, string, never>;
  delegable_tool_ids: ColumnType<string[], string[], never>;
  max_fanout: number;
  capability_modifiers: ColumnType<Record<string, unknown>, string, never>;
  approval_requirement: string;
  depth: number;
  status: string;
  spent_units: ColumnType<string | null, never, string>;
  returned_units: ColumnType<string | null, never, string>;
  created_at: ColumnType<Date, Date, never>;
  closed_at: ColumnType<Date | null, never, Date>;
}

/** Proposed actions waiting for a human (migration 0008). */
export interface ApprovalTable {
  id: string;
  tenant_id: string;
  kind: string;
  run_id: string;
  agent_id: string;
  step_index: number | null;
  tool_id: string | null;
  tool_version: string | null;
  input: ColumnType<unknown, string | null, never>;
  input_sha256: string | null;
  /** The exact call's SHA-256 (tool call approvals from migration 0024 on; see `callSha256`). */
  call_sha256: ColumnType<string | null, string | null | undefined, never>;
  handoff_id: string | null;
  proposed_by: string;
  status: string;
  created_at: ColumnType<Date, Date, never>;
  expires_at: ColumnType<Date, Date, never>;
  decided_by: string | null;
  decided_at: Date | null;
  rationale: string | null;
}

export interface TenantPolicyTable {
  tenant_id: string;
  external_call_enabled: boolean;
  updated_at: Date;
  updated_by: string;
}

/** One registered tool version (src/registry/); `contract` holds its immutable content. */
export interface ToolVersionTable {
  tool_id: string;
  version: string;
  contract: ColumnType<unknown, string, never>;
  content_sha256: string;
  deprecated_at: Date | null;
  replacement_tool_id: string | null;
  registered_at: ColumnType<Date, Date, never>;
  registered_by: string;
  revision: ColumnType<string | number | bigint, number, number>;
}

export interface RegistryRevisionTable {
  id: number;
  revision: ColumnType<string | number | bigint, number, number>;
}
