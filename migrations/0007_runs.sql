-- Runs (SPEC §6). A run id is chosen by the client and owned, within its tenant, by the first
-- principal that uses it. The stored envelope answers an exact resubmission without re-running.
CREATE TABLE runs (
  tenant_id            text NOT NULL,
  run_id               text NOT NULL,
  owner_agent_id       text NOT NULL,
  parent_run_id        text,
  pipeline_instance_id text,
  session_id           text,
  user_id              text,
  status               text NOT NULL CHECK (status IN ('queued', 'running', 'paused', 'awaiting_approval',
                         'throttled', 'completed', 'failed', 'cancelled', 'killed')),
  request_sha256       text NOT NULL,
  trace_id             text,
  http_status          integer,
  envelope             jsonb,
  created_at           timestamptz NOT NULL DEFAULT now(),
  updated_at           timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tenant_id, run_id)
);

CREATE INDEX runs_tenant_created ON runs (tenant_id, created_at DESC, run_id);
CREATE INDEX runs_parent ON runs (tenant_id, parent_run_id) WHERE parent_run_id IS NOT NULL;
