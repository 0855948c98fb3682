-- The tool registry (SPEC §2). Each row is one immutable (tool_id, version) contract; only its
-- deprecation may change afterwards. `revision` is the registry revision of the row's last change,
-- so a replica's catalog catches up by reading the rows newer than the revision it holds.
CREATE TABLE tool_versions (
  tool_id             text NOT NULL,
  version             text NOT NULL,
  contract            jsonb NOT NULL,
  content_sha256      text NOT NULL,
  deprecated_at       timestamptz,
  replacement_tool_id text,
  registered_at       timestamptz NOT NULL,
  registered_by       text NOT NULL,
  revision            bigint NOT NULL,
  PRIMARY KEY (tool_id, version)
);

CREATE INDEX tool_versions_revision ON tool_versions (revision);

-- One counter for the whole registry. Writers lock this row, so registry changes commit one at
-- a time across every replica and a revision is never visible before the ones below it.
CREATE TABLE registry_revision (
  id       smallint PRIMARY KEY CHECK (id = 1),
  revision bigint NOT NULL
);
INSERT INTO registry_revision (id, revision) VALUES (1, 0);

-- Registered content is immutable in the database itself, not only in the code that writes it.
CREATE FUNCTION tool_versions_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    RAISE EXCEPTION 'tool_versions: registered versions are never deleted'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  IF NEW.tool_id IS DISTINCT FROM OLD.tool_id
     OR NEW.version IS DISTINCT FROM OLD.version
     OR NEW.contract IS DISTINCT FROM OLD.contract
     OR NEW.content_sha256 IS DISTINCT FROM OLD.content_sha256
     OR NEW.registered_at IS DISTINCT FROM OLD.registered_at
     OR NEW.registered_by IS DISTINCT FROM OLD.registered_by THEN
    RAISE EXCEPTION 'tool_versions: a registered version is immutable (only its deprecation changes)'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  RETURN NEW;
END;
$$;

CREATE TRIGGER tool_versions_immutable
  BEFORE UPDATE OR DELETE ON tool_versions
  FOR EACH ROW EXECUTE FUNCTION tool_versions_guard();
