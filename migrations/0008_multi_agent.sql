-- Multi-agent runs and humans in the loop (SPEC §6): approvals, hand-offs, run controls and the
-- cascades that stop runs when the authority they depend on is pulled.

-- A run now outlives one request: any replica must be able to resume, stop or cascade it.
-- A sub-run created by a hand-off is `queued` before its agent has sent a request.
ALTER TABLE runs ALTER COLUMN request_sha256 DROP NOT NULL;
ALTER TABLE runs
  -- The validated request (plan, context), so that any replica can continue the run.
  ADD COLUMN request      jsonb,
  -- The owning agent as its token showed it when the run started: an operator's resume runs as it.
  ADD COLUMN agent_family text,
  ADD COLUMN agent_scopes text[] NOT NULL DEFAULT '{}',
  -- 0 for a root run; a sub-run is one deeper than its parent.
  ADD COLUMN depth        integer NOT NULL DEFAULT 0 CHECK (depth >= 0),
  -- The ancestors, root first: [{run_id, agent_id}] (the attribution chain without this run).
  ADD COLUMN lineage      jsonb NOT NULL DEFAULT '[]'::jsonb,
  -- The run's own budget (the request's budget_units, or a hand-off's): what it may hand on.
  ADD COLUMN budget_units numeric(20, 6) CHECK (budget_units > 0),
  -- Stays `running` after its plan, until completed or cancelled (parents of sub-runs).
  ADD COLUMN keep_open    boolean NOT NULL DEFAULT false,
  -- Bumped whenever an executor takes the run up; a stale executor's writes then change nothing.
  ADD COLUMN epoch        integer NOT NULL DEFAULT 1,
  -- An executor is working on the run right now (it clears this when it lets go).
  ADD COLUMN busy         boolean NOT NULL DEFAULT false,
  -- Why a control or cascade stopped the run: {code, message, details, audit_id}.
  ADD COLUMN stop         jsonb;

CREATE INDEX runs_open ON runs (tenant_id, run_id)
  WHERE status IN ('queued', 'running', 'paused', 'awaiting_approval', 'throttled');

-- Which grants each run has relied on: revoking or expiring one stops these runs (cascade).
CREATE TABLE run_grant_uses (
  grant_id   text NOT NULL REFERENCES grants (id),
  tenant_id  text NOT NULL,
  run_id     text NOT NULL,
  first_used_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (grant_id, tenant_id, run_id),
  FOREIGN KEY (tenant_id, run_id) REFERENCES runs (tenant_id, run_id)
);

-- A parent run handing part of its budget and a narrower authority to a sub-agent's run.
CREATE TABLE handoffs (
  id                   text PRIMARY KEY,
  tenant_id            text NOT NULL,
  parent_run_id        text NOT NULL,
  sub_run_id           text NOT NULL,
  parent_agent_id      text NOT NULL,
  sub_agent_id         text NOT NULL,
  budget_units         numeric(20, 6) NOT NULL CHECK (budget_units > 0),
  delegable_tool_ids   text[] NOT NULL,
  max_fanout           integer NOT NULL CHECK (max_fanout >= 0),
  capability_modifiers jsonb NOT NULL DEFAULT '{}'::jsonb,
  approval_requirement text NOT NULL CHECK (approval_requirement IN ('none', 'operator')),
  depth                integer NOT NULL CHECK (depth >= 1),
  status               text NOT NULL CHECK (status IN ('open', 'closed')),
  -- Set when the sub-run ends: what it used (its own calls and its sub-runs'), what went back.
  spent_units          numeric(20, 6),
  returned_units       numeric(20, 6),
  created_at           timestamptz NOT NULL,
  closed_at            timestamptz,
  UNIQUE (tenant_id, sub_run_id),
  FOREIGN KEY (tenant_id, parent_run_id) REFERENCES runs (tenant_id, run_id),
  FOREIGN KEY (tenant_id, sub_run_id) REFERENCES runs (tenant_id, run_id)
);

CREATE INDEX handoffs_parent ON handoffs (tenant_id, parent_run_id, created_at);

-- A proposed action waiting for a human: a tool call bound to its exact input, or a hand-off.
CREATE TABLE approvals (
  id           text PRIMARY KEY,
  tenant_id    text NOT NULL,
  kind         text NOT NULL CHECK (kind IN ('tool_call', 'handoff')),
  run_id       text NOT NULL,
  agent_id     text NOT NULL,
  step_index   integer,
  tool_id      text,
  tool_version text,
  -- The exact input the approver sees and the only one an approval lets through (by its hash).
  input        jsonb,
  input_sha256 text,
  handoff_id   text REFERENCES handoffs (id),
  -- The actor whose request made the proposal: never the one who may approve it.
  proposed_by  text NOT NULL,
  status       text NOT NULL CHECK (status IN ('pending', 'approved', 'rejected', 'expired', 'cancelled')),
  created_at   timestamptz NOT NULL,
  expires_at   timestamptz NOT NULL,
  decided_by   text,
  decided_at   timestamptz,
  rationale    text,
  CHECK (kind <> 'tool_call' OR (step_index IS NOT NULL AND tool_id IS NOT NULL AND tool_version IS NOT NULL AND input_sha256 IS NOT NULL)),
  CHECK (kind <> 'handoff' OR handoff_id IS NOT NULL),
  CHECK (status NOT IN ('approved', 'rejected') OR (decided_by IS NOT NULL AND btrim(rationale) <> '')),
  FOREIGN KEY (tenant_id, run_id) REFERENCES runs (tenant_id, run_id)
);

CREATE INDEX approvals_listing ON approvals (tenant_id, created_at DESC, id DESC);
CREATE INDEX approvals_of_run ON approvals (tenant_id, run_id, step_index);
