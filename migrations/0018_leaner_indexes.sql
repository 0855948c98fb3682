-- Time-range filters on the audit log need only block ranges: rows arrive in occurred_at order, so
-- a BRIN index answers them for a sliver of what a btree costs on every append.
DROP INDEX audit_events_occurred_at;
CREATE INDEX audit_events_occurred_at ON audit_events USING brin (occurred_at);

-- An agent's spend in a period is found through its tenant's reservations (a budget's counter is
-- rebuilt from them only when it is created or its period turns): no index of its own per call.
DROP INDEX IF EXISTS budget_reservations_agent_time;
