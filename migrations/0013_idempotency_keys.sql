-- Idempotency-Key on creating routes: the first request with a key claims it (status_code null
-- while it runs); a 2xx answer is kept so that a retry with the same key and request gets the same
-- answer without creating anything. Keys belong to the caller (tenant and actor), so one caller's
-- key never answers another's request. Kept at least 24 hours; the retention sweep deletes them after.
CREATE TABLE idempotency_keys (
  tenant_id    text NOT NULL,
  actor        text NOT NULL,
  key          text NOT NULL,
  fingerprint  text NOT NULL,
  status_code  integer,
  response     text,
  created_at   timestamptz NOT NULL,
  completed_at timestamptz,
  PRIMARY KEY (tenant_id, actor, key)
);

CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at);
