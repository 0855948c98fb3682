-- A tool-call approval is bound to the exact call as well as to its run (SPEC §12.1): the SHA-256
-- of tool id, version, input hash and context, so that an identical call by the same agent finds
-- it whatever its run id. Older rows have none and are found by their run only, as before.
ALTER TABLE approvals ADD COLUMN call_sha256 text;
CREATE INDEX approvals_open_calls ON approvals (tenant_id, agent_id, call_sha256, created_at DESC)
  WHERE call_sha256 IS NOT NULL AND status IN ('pending', 'approved');
