-- The audit log partitioned by month of occurred_at (UTC), so that old months can be sealed,
-- exported, and detached by an operator (docs/design/audit-chain.md, "Partitions").

-- The table as it stands becomes the first partition, attached in place rather than copied: it
-- holds everything before next month (or the month after, when a clock a little ahead already
-- wrote rows of next month). Its primary key (seq) cannot stay: a partitioned table's key must
-- include the partition key. seq stays unique because only the chain head hands it out, under its
-- lock, and verification reports any row whose seq is not the one expected.
DO $$
DECLARE
  newest timestamptz := (SELECT max(occurred_at) FROM audit_events WHERE occurred_at < now() + interval '1 month');
  upper_bound timestamptz := date_trunc('month', greatest(now(), newest), 'UTC') + interval '1 month';
  legacy text := 'audit_events_before_' || to_char(upper_bound AT TIME ZONE 'UTC', 'YYYY_MM');
  idx text;
BEGIN
  PERFORM set_config('toolgate.audit_legacy_upper', upper_bound::text, true);
  ALTER TABLE audit_events RENAME TO audit_events_unpartitioned;
  ALTER TABLE audit_events_unpartitioned DROP CONSTRAINT audit_events_pkey;
  ALTER TABLE audit_events_unpartitioned DROP CONSTRAINT audit_events_event_id_key;
  -- The partitioned table's own trigger is cloned onto it when attached.
  DROP TRIGGER audit_events_no_update_delete ON audit_events_unpartitioned;
  FOREACH idx IN ARRAY ARRAY['tenant_seq', 'run_seq', 'tool_seq', 'agent_seq', 'type_seq', 'occurred_at'] LOOP
    EXECUTE format('ALTER INDEX %I RENAME TO %I', 'audit_events_' || idx, legacy || '_' || idx);
  END LOOP;
  EXECUTE format('ALTER TABLE audit_events_unpartitioned RENAME TO %I', legacy);
END;
$$;

CREATE TABLE audit_events (
  seq             bigint NOT NULL,
  event_id        uuid NOT NULL,
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
  hash            text NOT NULL,
  PRIMARY KEY (seq, occurred_at),
  UNIQUE (event_id, occurred_at)
) PARTITION BY RANGE (occurred_at);

ALTER TABLE audit_events ADD CONSTRAINT audit_events_seq_positive CHECK (seq >= 1) NOT VALID;

CREATE INDEX audit_events_tenant_seq ON audit_events (tenant_id, seq);
CREATE INDEX audit_events_run_seq ON audit_events (run_id, seq) WHERE run_id IS NOT NULL;
CREATE INDEX audit_events_tool_seq ON audit_events (tool_id, seq) WHERE tool_id IS NOT NULL;
CREATE INDEX audit_events_agent_seq ON audit_events (agent_id, seq) WHERE agent_id IS NOT NULL;
CREATE INDEX audit_events_type_seq ON audit_events (event_type, seq);
CREATE INDEX audit_events_occurred_at ON audit_events (occurred_at);

-- Row triggers on a partitioned table are cloned onto every partition; TRUNCATE triggers are not,
-- so each partition gets its own (audit_events_add_partition).
CREATE TRIGGER audit_events_no_update_delete
  BEFORE UPDATE OR DELETE ON audit_events
  FOR EACH ROW EXECUTE FUNCTION audit_events_refuse_change();

CREATE TRIGGER audit_events_no_truncate
  BEFORE TRUNCATE ON audit_events
  FOR EACH STATEMENT EXECUTE FUNCTION audit_events_refuse_change();

-- Rows of no month's partition land here, so a write never fails for want of one. It stays
-- empty while the gateway keeps months ahead; a month it holds rows of gets no partition of its own.
CREATE TABLE audit_events_default PARTITION OF audit_events DEFAULT;
CREATE TRIGGER audit_events_no_truncate
  BEFORE TRUNCATE ON audit_events_default
  FOR EACH STATEMENT EXECUTE FUNCTION audit_events_refuse_change();

DO $$
DECLARE
  upper_bound timestamptz := current_setting('toolgate.audit_legacy_upper')::timestamptz;
  legacy text := 'audit_events_before_' || to_char(upper_bound AT TIME ZONE 'UTC', 'YYYY_MM');
BEGIN
  -- Rows dated past the bound (a clock far ahead, or an edit) move to the default partition.
  EXECUTE format('INSERT INTO audit_events_default SELECT * FROM %I WHERE occurred_at >= %L', legacy, upper_bound);
  EXECUTE format('ALTER TABLE %I DISABLE TRIGGER audit_events_no_update_delete', 'audit_events_default');
  EXECUTE format('DELETE FROM %I WHERE occurred_at >= %L', legacy, upper_bound);
  EXECUTE format('ALTER TABLE %I ENABLE TRIGGER audit_events_no_update_delete', 'audit_events_default');
  EXECUTE format('ALTER TABLE audit_events ATTACH PARTITION %I FOR VALUES FROM (MINVALUE) TO (%L)', legacy, upper_bound);
END;
$$;

-- Gives the month holding `at` (UTC) a partition of its own, unless it has one, overlaps another,
-- or the default partition already holds rows of it. Answers 'created', 'exists', 'overlaps' or
-- 'default_has_rows'. Created apart and then attached: attaching does not lock out appends, as
-- creating a partition in place would.
CREATE FUNCTION audit_events_add_partition(at timestamptz) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  lower_bound timestamptz := date_trunc('month', at, 'UTC');
  upper_bound timestamptz := date_trunc('month', at, 'UTC') + interval '1 month';
  name text := 'audit_events_' || to_char(lower_bound AT TIME ZONE 'UTC', 'YYYY_MM');
BEGIN
  PERFORM pg_advisory_xact_lock(hashtext('toolgate.audit_partitions'));
  IF to_regclass(name) IS NOT NULL THEN
    RETURN 'exists';
  END IF;
  IF EXISTS (
    SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'audit_events'::regclass
      AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT'
      AND (SELECT (r.lo IS NULL OR r.lo < upper_bound) AND (r.hi IS NULL OR r.hi > lower_bound)
           FROM (SELECT
                   nullif(substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \(''([^'']*)''\)'), '')::timestamptz AS lo,
                   nullif(substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''([^'']*)''\)'), '')::timestamptz AS hi) r)
  ) THEN
    RETURN 'overlaps';
  END IF;
  IF EXISTS (SELECT 1 FROM audit_events_default WHERE occurred_at >= lower_bound AND occurred_at < upper_bound) THEN
    RETURN 'default_has_rows';
  END IF;
  EXECUTE format('CREATE TABLE %I (LIKE audit_events INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', name);
  EXECUTE format('CREATE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON %I '
    'FOR EACH STATEMENT EXECUTE FUNCTION audit_events_refuse_change()', name);
  EXECUTE format('ALTER TABLE audit_events ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
    name, lower_bound, upper_bound);
  RETURN 'created';
END;
$$;

-- The next three months get their own now, but those the first partition covers.
SELECT audit_events_add_partition(date_trunc('month', now(), 'UTC') + make_interval(months => m))
FROM generate_series(1, 3) AS m;

-- What an operator detached after exporting it: the range the chain skips as archived.
CREATE TABLE audit_partition_archives (
  -- The seq of the audit.partition_detached record that reports the detachment.
  event_seq    bigint PRIMARY KEY,
  partition    text NOT NULL,
  from_seq     bigint NOT NULL CHECK (from_seq >= 1),
  to_seq       bigint NOT NULL,
  -- The hash of the record before from_seq, which the range chains from.
  prev_hash    text NOT NULL,
  first_hash   text NOT NULL,
  last_hash    text NOT NULL,
  row_count    bigint NOT NULL,
  checkpoint_id text NOT NULL,
  detached_by  text NOT NULL,
  detached_at  timestamptz NOT NULL,
  CHECK (to_seq >= from_seq AND row_count = to_seq - from_seq + 1)
);

CREATE UNIQUE INDEX audit_partition_archives_by_range ON audit_partition_archives (from_seq);

CREATE FUNCTION audit_partition_archives_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'audit_partition_archives is append-only: % refused', TG_OP
    USING ERRCODE = 'insufficient_privilege';
END;
$$;

CREATE TRIGGER audit_partition_archives_no_update_delete
  BEFORE UPDATE OR DELETE ON audit_partition_archives
  FOR EACH ROW EXECUTE FUNCTION audit_partition_archives_refuse_change();

CREATE TRIGGER audit_partition_archives_no_truncate
  BEFORE TRUNCATE ON audit_partition_archives
  FOR EACH STATEMENT EXECUTE FUNCTION audit_partition_archives_refuse_change();
