-- Retention: finished run trees, and the bookkeeping rows each call left for them, are deleted
-- TOOLGATE_RETENTION_DAYS after they finished (src/retention/). The audit log never is.
-- IF NOT EXISTS: on a large database an operator may build these indexes beforehand with
-- CREATE INDEX CONCURRENTLY (same names), instead of this migration holding writes while it builds them.

-- Where the sweep finds run trees to delete: finished root runs, by when they last changed.
CREATE INDEX IF NOT EXISTS runs_finished_roots ON runs (updated_at, tenant_id, run_id)
  WHERE parent_run_id IS NULL AND status IN ('completed', 'failed', 'cancelled', 'killed');

-- A run's grant uses, by run: deleting a run (and the foreign key's check) probes these instead
-- of reading the table whole.
CREATE INDEX IF NOT EXISTS run_grant_uses_run ON run_grant_uses (tenant_id, run_id);

-- A hand-off's approval, by hand-off: the foreign key's check when a hand-off is deleted.
CREATE INDEX IF NOT EXISTS approvals_handoff ON approvals (handoff_id) WHERE handoff_id IS NOT NULL;

-- What the settled reservations deleted with their runs had spent, per (tenant, agent): a
-- `total` budget created later still starts from everything its subject ever spent.
CREATE TABLE budget_spend_archive (
  tenant_id   text NOT NULL,
  agent_id    text NOT NULL,
  spent_units numeric(20, 6) NOT NULL CHECK (spent_units >= 0),
  PRIMARY KEY (tenant_id, agent_id)
);
