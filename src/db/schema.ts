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
  input_sha256: string | null;
  output_sha256: string | null;
  duration_ms: number | null;
  cost_units: number | null;
  details: ColumnType<Record<string, unknown>, string, never>;
  prev_hash: string;
  hash: string;
}

export interface AuditChainHeadTable {
  id: number;
  seq: string | number | bigint;
  hash: string;
}

export interface SchemaMigrationTable {
  version: string;
  applied_at: Generated<Date>;
}

export interface DB {
  audit_events: AuditEventTable;
  audit_chain_head: AuditChainHeadTable;
  schema_migrations: SchemaMigrationTable;
  runs: RunTable;
  tenant_policies: TenantPolicyTable;
  tool_versions: ToolVersionTable;
  registry_revision: RegistryRevisionTable;
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
  request_sha256: string;
  trace_id: string | null;
  http_status: number | null;
  envelope: ColumnType<unknown, string | null, string | null>;
  created_at: ColumnType<Date, Date | undefined, never>;
  updated_at: ColumnType<Date, Date | undefined, Date>;
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
