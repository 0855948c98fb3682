-- Budgets and rate limits (SPEC §5). Units are exact decimals with six places.

-- A budget: a cost-unit limit for a tenant, an agent or a run, over a period.
CREATE TABLE budgets (
  id           text PRIMARY KEY,
  tenant_id    text NOT NULL,
  scope        text NOT NULL CHECK (scope IN ('tenant', 'agent', 'run')),
  agent_id     text,
  run_id       text,
  period       text NOT NULL CHECK (period IN ('day', 'month', 'total')),
  limit_units  numeric(20, 6) NOT NULL CHECK (limit_units > 0),
  warn_ratio   double precision NOT NULL CHECK (warn_ratio > 0 AND warn_ratio <= 1),
  grace_units  numeric(20, 6) NOT NULL CHECK (grace_units >= 0),
  created_at   timestamptz NOT NULL,
  created_by   text NOT NULL,
  updated_at   timestamptz NOT NULL,
  updated_by   text NOT NULL,
  removed_at   timestamptz,
  removed_by   text,
  CHECK (
    (scope = 'tenant' AND agent_id IS NULL AND run_id IS NULL)
    OR (scope = 'agent' AND agent_id IS NOT NULL AND run_id IS NULL)
    OR (scope = 'run' AND run_id IS NOT NULL AND agent_id IS NULL)
  )
);

-- One live budget per (tenant, scope, subject, period); a removed one frees its place.
CREATE UNIQUE INDEX budgets_one_live_per_subject
  ON budgets (tenant_id, scope, coalesce(agent_id, ''), coalesce(run_id, ''), period)
  WHERE removed_at IS NULL;
CREATE INDEX budgets_tenant_listing ON budgets (tenant_id, created_at DESC, id DESC);
CREATE INDEX budgets_listing ON budgets (created_at DESC, id DESC);

-- What has been spent and is reserved, per budget and period window. `counter_key` is a budget
-- id, or `run/<tenant>/<run_id>` for a run's own running total (checked against the request's
-- `budget_units`). Rows are locked in (counter_key, period_start) order by every writer, so
-- replicas never deadlock on them.
CREATE TABLE budget_counters (
  counter_key    text NOT NULL,
  period_start   timestamptz NOT NULL,
  spent_units    numeric(20, 6) NOT NULL DEFAULT 0,
  reserved_units numeric(20, 6) NOT NULL DEFAULT 0,
  PRIMARY KEY (counter_key, period_start)
);

-- The ledger: one row per reservation, keeping what was reserved and what was actually spent.
-- `charges` lists the counters it was charged to, so it settles against the period it was
-- admitted in even after a rollover.
CREATE TABLE budget_reservations (
  id           text PRIMARY KEY,
  tenant_id    text NOT NULL,
  agent_id     text NOT NULL,
  run_id       text NOT NULL,
  units        numeric(20, 6) NOT NULL CHECK (units >= 0),
  actual_units numeric(20, 6) CHECK (actual_units >= 0),
  status       text NOT NULL CHECK (status IN ('reserved', 'settled', 'released', 'expired')),
  charges      jsonb NOT NULL,
  reserved_at  timestamptz NOT NULL,
  expires_at   timestamptz NOT NULL,
  closed_at    timestamptz
);

CREATE INDEX budget_reservations_open ON budget_reservations (expires_at) WHERE status = 'reserved';
CREATE INDEX budget_reservations_tenant_time ON budget_reservations (tenant_id, reserved_at);
CREATE INDEX budget_reservations_agent_time ON budget_reservations (tenant_id, agent_id, reserved_at);
CREATE INDEX budget_reservations_run ON budget_reservations (tenant_id, run_id, reserved_at);

-- Token buckets per (tenant, agent, tool). Capacity and refill rate come from the tool contract
-- at each call; the row keeps only the level and when it was last brought up to date.
CREATE TABLE rate_buckets (
  tenant_id  text NOT NULL,
  agent_id   text NOT NULL,
  tool_id    text NOT NULL,
  tokens     double precision NOT NULL,
  updated_at timestamptz NOT NULL,
  PRIMARY KEY (tenant_id, agent_id, tool_id)
);
