/** What a caller records. Payloads are never stored raw: pass their SHA-256 instead. */
export interface AuditEventInput {
  event_type: string;
  actor: string;
  tenant_id?: string | null;
  agent_id?: string | null;
  run_id?: string | null;
  tool_call_id?: string | null;
  tool_id?: string | null;
  tool_version?: string | null;
  tool_category?: string | null;
  risk_level?: string | null;
  trace_id?: string | null;
  organization_id?: string | null;
  assessment_id?: string | null;
  status?: string | null;
  reason_code?: string | null;
  input_sha256?: string | null;
  output_sha256?: string | null;
  duration_ms?: number | null;
  cost_units?: number | null;
  details?: Record<string, unknown>;
}

/** A stored event, as `GET /audit` returns it. */
export interface AuditRecord {
  seq: number;
  event_id: string;
  /** Null only for a stored time no RFC 3339 timestamp can write: evidence of an edited row. */
  occurred_at: string | null;
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
  details: Record<string, unknown>;
  /** Null for a leaf record (scheme 3): the Merkle tree, not a chain, orders and covers it. */
  prev_hash: string | null;
  hash: string | null;
  /** How `hash` was made: 1, over the whole record; 2, linking its content's hash; 3, none (see audit-hash.ts). */
  hash_scheme: 1 | 2 | 3;
}

export const OPTIONAL_FIELDS = [
  'tenant_id',
  'agent_id',
  'run_id',
  'tool_call_id',
  'tool_id',
  'tool_version',
  'tool_category',
  'risk_level',
  'trace_id',
  'organization_id',
  'assessment_id',
  'status',
  'reason_code',
  'input_sha256',
  'output_sha256',
  'duration_ms',
  'cost_units',
] as const satisfies ReadonlyArray<keyof AuditEventInput>;
