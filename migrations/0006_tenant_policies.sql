-- Per-tenant policy (SPEC §7). A tenant without a row has the defaults: everything off.
CREATE TABLE tenant_policies (
  tenant_id             text PRIMARY KEY,
  external_call_enabled boolean NOT NULL DEFAULT false,
  updated_at            timestamptz NOT NULL,
  updated_by            text NOT NULL
);
