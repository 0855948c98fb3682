-- Replicas and the runs they execute: a run left busy by a replica that died, or by an execution
-- that broke off (the database went away mid-call), is found and ended, never left busy for good.

-- Each gateway process while it runs: it renews `expires_at` (database time) well before it
-- passes. A replica whose lease has passed is presumed dead; its busy runs are recovered.
CREATE TABLE replicas (
  id           text PRIMARY KEY,
  hostname     text NOT NULL,
  pid          integer NOT NULL,
  started_at   timestamptz NOT NULL DEFAULT now(),
  renewed_at   timestamptz NOT NULL DEFAULT now(),
  expires_at   timestamptz NOT NULL
);

-- The replica whose executor holds the run while it is busy (null for runs taken up before this
-- migration: those are never presumed lost).
ALTER TABLE runs ADD COLUMN executor_id text;

CREATE INDEX runs_busy ON runs (executor_id) WHERE busy;
