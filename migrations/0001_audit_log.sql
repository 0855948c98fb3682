-- The audit log: append-only and hash-chained (SPEC §8).
CREATE TABLE audit_events (
  seq             bigint PRIMARY KEY,
  event_id        uuid NOT NULL UNIQUE,
  occurred_at     timestamptz NOT NULL,
  tenant_id       text,
  actor           text NOT NULL,
  agent_id        text,
  event_type      text NOT NULL,
  run_id          text,
  tool_call_id    text,
  tool_id         text,
  tool_version    text,
  tool_category   text,
  risk_level      text,
  trace_id        text,
  organization_id text,
  assessment_id   text,
  status          text,
  reason_code     text,
  input_sha256    text,
  output_sha256   text,
  duration_ms     double precision,
  cost_units      double precision,
  details         jsonb NOT NULL DEFAULT '{}'::jsonb,
  prev_hash       text NOT NULL,
  hash            text NOT NULL
);

CREATE INDEX audit_events_tenant_seq ON audit_events (tenant_id, seq);
CREATE INDEX audit_events_run_seq ON audit_events (run_id, seq) WHERE run_id IS NOT NULL;
CREATE INDEX audit_events_tool_seq ON audit_events (tool_id, seq) WHERE tool_id IS NOT NULL;
CREATE INDEX audit_events_agent_seq ON audit_events (agent_id, seq) WHERE agent_id IS NOT NULL;
CREATE INDEX audit_events_type_seq ON audit_events (event_type, seq);
CREATE INDEX audit_events_occurred_at ON audit_events (occurred_at);

-- The head of the chain. Appenders lock this row, so the chain has one writer at a time
-- across every replica, and seq has no gaps.
CREATE TABLE audit_chain_head (
  id   smallint PRIMARY KEY CHECK (id = 1),
  seq  bigint NOT NULL,
  hash text NOT NULL
);
INSERT INTO audit_chain_head (id, seq, hash)
VALUES (1, 0, '0000000000000000000000000000000000000000000000000000000000000000');

CREATE FUNCTION audit_events_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'audit_events is append-only: % refused', TG_OP
    USING ERRCODE = 'insufficient_privilege';
END;
$$;

CREATE TRIGGER audit_events_no_update_delete
  BEFORE UPDATE OR DELETE ON audit_events
  FOR EACH ROW EXECUTE FUNCTION audit_events_refuse_change();

CREATE TRIGGER audit_events_no_truncate
  BEFORE TRUNCATE ON audit_events
  FOR EACH STATEMENT EXECUTE FUNCTION audit_events_refuse_change();
