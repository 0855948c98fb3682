-- A run's live per-run grants, by run id: a run tree is kept while one names any of its runs.
-- (Databases that ran an earlier edit of 0011 have it already.)
CREATE INDEX IF NOT EXISTS grants_per_run ON grants (tenant_id, scope_ref) WHERE scope = 'per-run' AND revoked_at IS NULL;
