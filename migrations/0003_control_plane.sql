-- The operator control plane: scoped grants (SPEC §3) and kill switches (SPEC §4).

CREATE TABLE grants (
  id                    text PRIMARY KEY,
  tenant_id             text NOT NULL,
  agent_id              text NOT NULL,
  tool_id               text NOT NULL,
  scope                 text NOT NULL
    CHECK (scope IN ('per-run', 'per-pipeline-instance', 'per-session', 'per-user', 'per-tenant')),
  scope_ref             text NOT NULL,
  capability_modifiers  jsonb NOT NULL DEFAULT '{}'::jsonb,
  expires_at            timestamptz NOT NULL,
  granted_by_actor_id   text NOT NULL,
  granted_by_actor_role text NOT NULL,
  rationale             text NOT NULL CHECK (btrim(rationale) <> ''),
  granted_at            timestamptz NOT NULL,
  revoked_at            timestamptz,
  revoked_by_actor_id   text,
  revoked_by_actor_role text,
  revocation_reason     text,
  -- Renewal mints a new grant and ends the old one; these link the two.
  renewed_from          text REFERENCES grants (id),
  superseded_by         text REFERENCES grants (id),
  -- Set by the expiry sweeper in the transaction that writes `grant.expired`: the marker that
  -- makes that event exactly-once across replicas. Resolution never reads it (expires_at rules).
  expiry_recorded_at    timestamptz,
  CHECK ((revoked_at IS NULL) = (revoked_by_actor_id IS NULL)),
  CHECK (scope <> 'per-tenant' OR scope_ref = tenant_id)
);

-- The hot path: one probe per scope for (tenant, agent, tool), at every step of every run.
CREATE INDEX grants_resolution ON grants (tenant_id, agent_id, tool_id, scope, scope_ref);
CREATE INDEX grants_listing ON grants (tenant_id, granted_at DESC, id DESC);
CREATE INDEX grants_listing_all ON grants (granted_at DESC, id DESC);
CREATE INDEX grants_expiry_due ON grants (expires_at)
  WHERE expiry_recorded_at IS NULL AND revoked_at IS NULL;

CREATE TABLE kill_switches (
  id                       text PRIMARY KEY,
  scope                    text NOT NULL
    CHECK (scope IN ('global', 'region', 'provider', 'tenant', 'family', 'agent', 'tool')),
  target                   text NOT NULL,
  -- NULL: platform-wide. Otherwise the switch only matches calls of that tenant.
  tenant_id                text,
  reason                   text NOT NULL CHECK (btrim(reason) <> ''),
  user_visible_status_copy text NOT NULL CHECK (btrim(user_visible_status_copy) <> ''),
  safe_degradation_mode_id text,
  armed_by_actor_id        text NOT NULL,
  armed_by_actor_role      text NOT NULL,
  armed_at                 timestamptz NOT NULL,
  disarmed_at              timestamptz,
  disarmed_by_actor_id     text,
  disarmed_by_actor_role   text,
  disarm_reason            text,
  CHECK ((disarmed_at IS NULL) = (disarmed_by_actor_id IS NULL)),
  CHECK (scope NOT IN ('global', 'region', 'provider') OR tenant_id IS NULL),
  CHECK (scope <> 'tenant' OR tenant_id = target),
  CHECK (scope <> 'global' OR target = '*')
);

-- At most one armed switch per target: arming twice is idempotent, even when two replicas race.
CREATE UNIQUE INDEX kill_switches_one_armed_per_target
  ON kill_switches (scope, target, (coalesce(tenant_id, '')))
  WHERE disarmed_at IS NULL;
CREATE INDEX kill_switches_listing ON kill_switches (armed_at DESC, id DESC);
CREATE INDEX kill_switches_armed ON kill_switches (armed_at) WHERE disarmed_at IS NULL;

-- The version every replica's snapshot compares against. Bumped (and announced with NOTIFY, which
-- PostgreSQL delivers only on commit) by a trigger, so no writer can change switches silently.
CREATE TABLE kill_switch_state (
  id      smallint PRIMARY KEY CHECK (id = 1),
  version bigint NOT NULL
);
INSERT INTO kill_switch_state (id, version) VALUES (1, 0);

CREATE FUNCTION kill_switches_announce_change() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  new_version bigint;
BEGIN
  UPDATE kill_switch_state SET version = version + 1 WHERE id = 1 RETURNING version INTO new_version;
  PERFORM pg_notify('toolgate_kill_switches', new_version::text);
  RETURN NULL;
END;
$$;

CREATE TRIGGER kill_switches_changed
  AFTER INSERT OR UPDATE OR DELETE ON kill_switches
  FOR EACH ROW EXECUTE FUNCTION kill_switches_announce_change();
