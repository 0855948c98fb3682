-- Reservations the TTL sweep released whose call may yet settle late, by tenant: a sub-run's end
-- finds those of its calls among them, so that a late settlement charges its parent too. Few rows
-- (a call outliving its reservation means its gateway stalled or died mid-call).
CREATE INDEX IF NOT EXISTS budget_reservations_expired ON budget_reservations (tenant_id) WHERE status = 'expired';
