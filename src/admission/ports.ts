import type { EgressExecutor } from '../egress/egress-executor.js';
import type { EgressPolicy } from '../egress/egress-policy.js';
import type { Decision } from '../errors/decision.js';

/**
 * What the admission pipeline needs from the other rooms. Each room implements its port; the
 * composition root passes them in. Expected denials are values, infrastructure faults throw.
 */

export type { Decision, Denial } from '../errors/decision.js';

/**
 * Not a refusal: the call waits for a human to approve exactly this input (stage 8). Nothing is
 * reserved or dispatched; the run pauses as `awaiting_approval`.
 */
export type Hold = {
  ok: false;
  hold: 'approval';
  message: string;
  inputSha256: string;
};

/** What a stage decides: go on, refuse, or (stage 8 only) wait for an approval. */
export type StageDecision = Decision | Hold;

/** The fields of a registered tool contract that admission and dispatch read. */
export interface AdmissibleTool {
  id: string;
  version: string;
  category: 'read_only' | 'draft_write' | 'final_write' | 'admin' | 'external_call';
  risk_level: string;
  allowed_agents: string[];
  required_context: string[];
  required_scopes: Array<{ scope: string; required: boolean; rationale?: string }>;
  requires_approval: boolean;
  backend: {
    url: string;
    method: string;
    timeout_ms: number;
    max_response_bytes: number;
    headers: Record<string, unknown>;
  } | null;
  target: { family?: string | null; provider?: string | null; region?: string | null } | null;
  cost_units: number;
  rate_limit: { capacity: number; refill_per_second: number } | null;
  egress: EgressPolicy | null;
}

export interface SchemaValidator {
  (data: unknown): boolean;
  errors?: Array<{ instancePath: string; message?: string }> | null;
}

export interface CatalogPort {
  /** Whether this replica's copy of the registry is loaded and recently confirmed. */
  readiness(): { ok: boolean; reason?: string };
  /**
   * The version an agent's call gets: the newest matching version it may use (what its views show),
   * else the version anyone would get, for stages 2–3 to refuse (docs/design/tool-resolution.md).
   */
  resolve(
    toolId: string,
    range: string | undefined,
    who: {
      as: 'caller';
      agent: { agentId: string; family: string | undefined };
      externalCallEnabled: () => Promise<boolean>;
    },
  ): Promise<
    { ok: true; tool: AdmissibleTool } | { ok: false; code: 'tool_not_registered' | 'tool_version_not_found' }
  >;
  validators(tool: AdmissibleTool): { input: SchemaValidator; output: SchemaValidator };
  /** Resolves backend header values (secrets by env name) for dispatch. */
  backendHeaders(tool: AdmissibleTool): Record<string, string>;
}

export interface GrantView {
  id: string;
  capability_modifiers: Record<string, unknown>;
}

export interface GrantQuery {
  tenantId: string;
  agentId: string;
  toolId: string;
  context: RunScopeContext;
}

/**
 * What a grant decided from this replica's copy of the grants assumed (opaque to the pipeline):
 * the grant-use write records the use only if it still holds.
 */
export interface GrantAssumption {
  readonly agentId: string;
  readonly toolId: string;
  readonly version: number;
  readonly decidedAt: Date;
}

export type GrantResolution =
  | { ok: true; grant: GrantView; assumed?: GrantAssumption | undefined }
  | { ok: false; code: 'grant_missing' | 'grant_expired' | 'grant_revoked'; [key: string]: unknown };

export interface GrantsPort {
  /**
   * The grant that applies, possibly decided from this replica's copy (then `assumed` says
   * what the copy assumed). `prefetched`: the candidates `prefetch` began reading for this very
   * query, if it did.
   */
  resolve(query: GrantQuery, prefetched?: GrantPrefetch): Promise<GrantResolution>;
  /** The exact answer, from the database; absent when `resolve` always is. */
  resolveFresh?(query: GrantQuery): Promise<GrantResolution>;
  /**
   * Starts reading the grants a query will resolve from, ahead of its turn (the first step's,
   * while its run is being claimed). Its result is used only by a `resolve` of the same query;
   * one never used costs a read and nothing else.
   */
  prefetch?(query: GrantQuery): GrantPrefetch;
  /**
   * What this replica's copy decides for a query now, when it holds a live grant for it (the first
   * call's, for the run's claim to record the use with): undefined when only the database can say.
   */
  assume?(query: GrantQuery): GrantAssumed | undefined;
  /**
   * Whether this replica's current copy holds no live grant for a query: a refusal the call's
   * record can make exact (its statement checks that no grant at all exists), before its run is claimed.
   */
  presumeMissing?(query: GrantQuery): boolean;
}

/** A grant decided from the copy, and what the decision assumed. */
export interface GrantAssumed {
  grant: GrantView;
  assumed: GrantAssumption;
}

/** Grants being read ahead for one query (opaque to the pipeline). */
export interface GrantPrefetch {
  readonly query: unknown;
  readonly candidates: Promise<unknown>;
}

export interface RunScopeContext {
  tenant_id: string;
  run_id: string;
  pipeline_instance_id?: string | undefined;
  session_id?: string | undefined;
  user_id?: string | undefined;
}

export interface KillSwitchPort {
  decide(query: {
    tenantId: string;
    agentId: string;
    family: string | undefined;
    toolId: string;
    target: { family?: string | null; provider?: string | null; region?: string | null };
  }):
    | { ok: true }
    | { ok: false; code: 'gateway_unavailable' }
    | {
        ok: false;
        code: 'kill_switch_active';
        blamed: { id: string; scope: string; user_visible_status_copy: string };
      };
}

export interface Reservation {
  readonly id: string;
  readonly units: number;
}

export interface BudgetPort {
  reserve(query: {
    tenantId: string;
    agentId: string;
    runId: string;
    units: number;
    requestLimitUnits?: number | undefined;
  }): Promise<
    | { ok: true; reservation: Reservation; verdict: 'ok' | 'warn' | 'grace'; warnings: string[] }
    | { ok: false; code: 'budget_exceeded'; details?: Record<string, unknown> }
  >;
  /** The same verdict as `reserve`, reserving nothing (dry runs). */
  check(query: {
    tenantId: string;
    agentId: string;
    runId: string;
    units: number;
    requestLimitUnits?: number | undefined;
  }): Promise<
    | { ok: true; verdict: 'ok' | 'warn' | 'grace'; warnings: string[] }
    | { ok: false; code: 'budget_exceeded'; details?: Record<string, unknown> }
  >;
  /** `settled_after_expiry` when the reservation had expired before the call settled (its cost is charged all the same). */
  settle(reservation: Reservation, actualUnits: number): Promise<string>;
  release(reservation: Reservation): Promise<unknown>;
}

export interface RateLimitPort {
  take(query: RateQuery): Promise<{ ok: true } | { ok: false; code: 'rate_limited'; retryAfterSeconds: number }>;
  peek(query: RateQuery): Promise<{ ok: true } | { ok: false; code: 'rate_limited'; retryAfterSeconds: number }>;
  /** Gives back a token `take` admitted, for a call not made after all (optional: else it is lost, the strict side). */
  giveBack?(query: RateQuery): void;
  /**
   * A refusal decided from the bucket's level as this replica knows it, without a statement, with that level for the
   * refusal's record to confirm (optional: else `take` decides).
   */
  refusalFromKnown?(
    query: RateQuery,
  ): { decision: { ok: false; code: 'rate_limited'; retryAfterSeconds: number }; level: RateLevel } | undefined;
  /**
   * A refusal `refusalFromKnown` decided stood: its record confirmed the level. Counted then, not when decided: a
   * refusal whose level had moved is decided again by `take`.
   */
  refusalStood?(level: RateLevel): void;
}

/** A bucket at the level a refusal was decided from. */
export interface RateLevel {
  tenantId: string;
  agentId: string;
  toolId: string;
  tokens: number;
  updatedAtMs: number;
}

export interface RateQuery {
  tenantId: string;
  agentId: string;
  toolId: string;
  capacity: number;
  refillPerSecond: number;
}

export interface ApprovalPort {
  /** The approval that lets exactly this call through now, if an operator gave one. */
  approvedFor(query: {
    tenantId: string;
    runId: string;
    stepIndex: number;
    toolId: string;
    toolVersion: string;
    inputSha256: string;
  }): Promise<{ approvalId: string } | undefined>;
}

export interface GrantUsePort {
  /**
   * Records that a run relies on a grant (revoking or expiring it then stops the run); false
   * when the grant was revoked since it resolved or, with `assumed`, when what the decision
   * assumed no longer holds.
   */
  record(query: {
    tenantId: string;
    runId: string;
    grantId: string;
    assumed?: GrantAssumption | undefined;
  }): Promise<boolean>;
}

export interface TenantPolicyPort {
  externalCallEnabled(tenantId: string): Promise<boolean>;
}

export interface AdmissionPorts {
  catalog: CatalogPort;
  grants: GrantsPort;
  killSwitches: KillSwitchPort;
  budgets: BudgetPort;
  rateLimiter: RateLimitPort;
  tenantPolicy: TenantPolicyPort;
  approvals: ApprovalPort;
  grantUses: GrantUsePort;
  /** The built-in backend of `external_call` tools; its guard also runs at the input stage. */
  egress: EgressExecutor;
}
