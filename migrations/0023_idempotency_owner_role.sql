-- A key belongs to the caller as its token proves it, role included: one person holding a
-- platform-operator token and a tenant-operator token with the same `sub` is two callers, and the
-- tenant-operator never replays an answer only the platform-operator could have been given.
-- Agents have no role: theirs is 'agent'. Operators' keys kept from before carry no role and
-- answer no one (a retry of one runs again); they age out with the retention sweep.
ALTER TABLE idempotency_keys ADD COLUMN role text NOT NULL DEFAULT '';
UPDATE idempotency_keys SET role = 'agent' WHERE actor LIKE 'agent:%';
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_pkey;
ALTER TABLE idempotency_keys ADD PRIMARY KEY (tenant_id, actor, role, key);
