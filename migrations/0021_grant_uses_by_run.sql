-- A run's grant uses are only ever found by their run (a cascade probes a tenant's open runs for a
-- use of the grants it revokes; retention deletes a finished run's): the primary key leads with the
-- run, and the index that led with it apart goes. Grants are never deleted, so nothing looks a use
-- up by its grant alone.
ALTER TABLE run_grant_uses DROP CONSTRAINT run_grant_uses_pkey;
ALTER TABLE run_grant_uses ADD PRIMARY KEY (tenant_id, run_id, grant_id);
DROP INDEX run_grant_uses_run;
