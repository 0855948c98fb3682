import type { CanonicalPayload } from '../audit/audit-hash.js';
import type { Principal } from '../auth/principal.js';
import type { CapabilityModifiers } from '../grants/grant.js';
import type {
  AdmissibleTool,
  AdmissionPorts,
  GrantAssumed,
  GrantPrefetch,
  GrantView,
  RateLevel,
  RateQuery,
  Reservation,
  StageDecision,
} from './ports.js';

export type AgentPrincipal = Extract<Principal, { kind: 'agent' }>;

/** One step of a plan, with the run it belongs to, as admission sees it. */
export interface StepRequest {
  principal: AgentPrincipal;
  run: {
    run_id: string;
    parent_run_id?: string | undefined;
    pipeline_instance_id?: string | undefined;
    session_id?: string | undefined;
    user_id?: string | undefined;
    context: Record<string, unknown>;
    budget_units?: number | undefined;
    /** The run stays open for later requests (`keep_open`). */
    keep_open?: boolean | undefined;
    /** A sub-run's authority envelope: it acts within it and its own grants. */
    delegation?: { delegable_tool_ids: readonly string[]; capability_modifiers: CapabilityModifiers } | undefined;
  };
  step: {
    index: number;
    tool_id: string;
    version?: string | undefined;
    input: unknown;
    /** The input with its hash made once for the call: the approval stage's, then its records'. */
    canonicalInput?: CanonicalPayload | undefined;
  };
  dryRun: boolean;
  /** The grants of this step, read ahead while its run was claimed (the first step only). */
  prefetchedGrants?: GrantPrefetch | undefined;
  /** The grant this step was decided on before its run was claimed, its use recorded with the claim (the first step only). */
  reliedOn?: GrantAssumed | undefined;
  /** Its budget reservation, written with its run's claim (the first step only): the cost stage's, if the price holds. */
  reserved?: Reservation | undefined;
  /**
   * Its budget refusal, decided before its run's claim and found exact by the claim's statement (the
   * first step only): the cost stage's, if the price is still `units`.
   */
  budgetRefusal?: { units: number; details: Record<string, unknown> } | undefined;
  /**
   * The copy of the grants holds none for this step (the first, before its run is claimed): the grant
   * stage refuses without reading, and the refusal's record stands only if no grant exists at all.
   */
  presumedMissing?: boolean | undefined;
  /**
   * The run is not claimed yet (the first step, its intent record to claim it): `reserved` is not written, so nothing
   * is given back when the call is refused or held; the caller drops what admission decided.
   */
  unclaimed?: boolean | undefined;
}

/** What earlier stages learned, for later stages and for dispatch. */
export interface StepState {
  tool?: AdmissibleTool;
  grant?: GrantView;
  /** The approval that let this call through stage 8. */
  approvalId?: string;
  reservation?: Reservation;
  /** The token the rate stage took for the call, if it took one. */
  rateTaken?: RateQuery;
  /** The bucket level the rate stage refused an unclaimed run's call from, without a statement. */
  rateRefusedAt?: RateLevel;
  warnings: string[];
}

/** One admission stage: a name for the verdict list and a check returning a decision value. */
export interface Stage {
  name: string;
  check(request: StepRequest, state: StepState, ports: AdmissionPorts): StageDecision | Promise<StageDecision>;
}

/** The tool a stage after the registry stage may rely on. */
export function toolOf(state: StepState): AdmissibleTool {
  if (!state.tool) throw new Error('stage ran before the registry stage resolved the tool');
  return state.tool;
}
