-- Each replica keeps the live grants in memory (docs/design/replica-snapshots.md). Every grant
-- change gets a version from one counter, whose row lock serialises the changes, so versions
-- follow commit order: a replica at version v catches up with `where version > v`, and a call
-- decided at version v is still exact when no grant of its (tenant, agent, tool) is newer than v.
CREATE TABLE grant_state (
  id      smallint PRIMARY KEY CHECK (id = 1),
  version bigint NOT NULL
);
INSERT INTO grant_state (id, version) VALUES (1, 0);

-- Grants that existed before this migration share version 0: every replica loads them in full.
ALTER TABLE grants ADD COLUMN version bigint NOT NULL DEFAULT 0;
-- A replica catching up reads the changes after its version; a call's guard, the changes after
-- it to the grants of its (tenant, agent, tool): both touch only the newer rows.
CREATE INDEX grants_version ON grants (version);
CREATE INDEX grants_subject_version ON grants (tenant_id, agent_id, tool_id, version);

-- Creation and revocation (renewal is both) change what resolves; the expiry sweeper's marker
-- does not (expiry is judged by the clock), so it bumps nothing. NOTIFY is delivered on commit.
CREATE FUNCTION grants_announce_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  UPDATE grant_state SET version = version + 1 WHERE id = 1 RETURNING version INTO NEW.version;
  PERFORM pg_notify('toolgate_grants', NEW.version::text);
  RETURN NEW;
END;
$$;

CREATE TRIGGER grants_changed
  BEFORE INSERT OR UPDATE OF revoked_at ON grants
  FOR EACH ROW EXECUTE FUNCTION grants_announce_change();
