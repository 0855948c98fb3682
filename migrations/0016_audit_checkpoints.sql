-- Signed checkpoints of the audit chain: verification starts after one instead of at row 1.
CREATE TABLE audit_checkpoints (
  id         text PRIMARY KEY,
  seq        bigint NOT NULL CHECK (seq >= 0),
  hash       text NOT NULL,
  at         timestamptz NOT NULL,
  key_id     text,
  signature  text,
  created_by text NOT NULL,
  CHECK ((key_id IS NULL) = (signature IS NULL))
);

CREATE INDEX audit_checkpoints_by_seq ON audit_checkpoints (seq DESC, id DESC);

-- Like the log itself: a checkpoint, once written, is never changed or removed by the gateway.
CREATE FUNCTION audit_checkpoints_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'audit_checkpoints is append-only: % refused', TG_OP
    USING ERRCODE = 'insufficient_privilege';
END;
$$;

CREATE TRIGGER audit_checkpoints_no_update_delete
  BEFORE UPDATE OR DELETE ON audit_checkpoints
  FOR EACH ROW EXECUTE FUNCTION audit_checkpoints_refuse_change();

CREATE TRIGGER audit_checkpoints_no_truncate
  BEFORE TRUNCATE ON audit_checkpoints
  FOR EACH STATEMENT EXECUTE FUNCTION audit_checkpoints_refuse_change();
