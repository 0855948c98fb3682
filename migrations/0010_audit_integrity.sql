-- The audit log holds only what its hash chain covers (SPEC §8).

-- The chain starts at seq 1: a row below it would sit before the chain's first link, where
-- walking from 1 would never meet it. Every row the gateway wrote has seq >= 1. NOT VALID: new
-- rows are checked from now on without scanning (and locking) the whole log; a row already there
-- below 1 is reported by GET /audit/verify rather than stopping the gateway from starting.
ALTER TABLE audit_events ADD CONSTRAINT audit_events_seq_positive CHECK (seq >= 1) NOT VALID;
