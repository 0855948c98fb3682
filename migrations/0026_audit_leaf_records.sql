-- Records written as leaves only (SPEC §8.1): once the linear chain is closed, a record is a plain
-- INSERT numbered by a sequence, with no chain fields and no lock that every append shares; the
-- sequencer finds it through audit_unsequenced, since records no longer commit in seq order.

-- The chain closes once, at its head as it then stands; the old walk checks it up to there.
ALTER TABLE audit_chain_head ADD COLUMN closed boolean NOT NULL DEFAULT false;

-- Seqs of records written after the chain closed (set past the head when it closes; gaps allowed).
CREATE SEQUENCE audit_record_seq AS bigint MINVALUE 1;

-- A leaf record (hash_scheme 3) has no chain fields: the Merkle tree orders and covers it.
ALTER TABLE audit_events ALTER COLUMN prev_hash DROP NOT NULL;
ALTER TABLE audit_events ALTER COLUMN hash DROP NOT NULL;
ALTER TABLE audit_events DROP CONSTRAINT audit_events_hash_scheme_known;
ALTER TABLE audit_events ADD CONSTRAINT audit_events_hash_scheme_known CHECK (
  (hash_scheme IN (1, 2) AND prev_hash IS NOT NULL AND hash IS NOT NULL)
  OR (hash_scheme = 3 AND prev_hash IS NULL AND hash IS NULL)
) NOT VALID;

-- Leaf records committed and not yet sequenced, by seq: written with the record, removed by the
-- sequencer in the transaction that makes it a leaf.
CREATE TABLE audit_unsequenced (
  seq bigint PRIMARY KEY
);
