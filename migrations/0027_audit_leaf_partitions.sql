-- The log becomes leaves only, and its months are archived as ranges of the Merkle tree.

-- A checkpoint that seals a range of leaves names its last leaf: `hash` is that leaf's hash, and
-- the signature covers the index too (docs/design/audit-chain.md#leaf-partitions).
ALTER TABLE audit_checkpoints ADD COLUMN leaf_index bigint CHECK (leaf_index >= 0);

-- A detached month of leaf records archives leaves from_leaf..to_leaf, the last of them hashing to
-- last_leaf_hash. Where the range holds the chain's last records (the month the chain closed in),
-- from_seq..to_seq, prev_hash, first_hash and last_hash are theirs, for the chain's walk to cross;
-- otherwise prev_hash is null and the seqs and hashes are those of the leaves at both ends.
ALTER TABLE audit_partition_archives ADD COLUMN from_leaf bigint CHECK (from_leaf >= 0);
ALTER TABLE audit_partition_archives ADD COLUMN to_leaf bigint;
ALTER TABLE audit_partition_archives ADD COLUMN last_leaf_hash text;
ALTER TABLE audit_partition_archives ALTER COLUMN prev_hash DROP NOT NULL;
ALTER TABLE audit_partition_archives DROP CONSTRAINT audit_partition_archives_check;
ALTER TABLE audit_partition_archives ADD CONSTRAINT audit_partition_archives_range CHECK (
  (from_leaf IS NULL AND to_leaf IS NULL AND last_leaf_hash IS NULL AND prev_hash IS NOT NULL
    AND to_seq >= from_seq AND row_count = to_seq - from_seq + 1)
  OR (from_leaf IS NOT NULL AND to_leaf >= from_leaf AND last_leaf_hash IS NOT NULL
    AND row_count = to_leaf - from_leaf + 1)
);
CREATE UNIQUE INDEX audit_partition_archives_by_leaf ON audit_partition_archives (from_leaf);

-- The chain closes at its head as it stands (at its genesis for a log with no record): every record
-- from now on is a leaf, and the old walk checks the chain up to here. The head's lock waits out a
-- linked append in flight; seqs go on after it.
WITH closing AS (UPDATE audit_chain_head SET closed = true WHERE id = 1 AND NOT closed RETURNING seq)
SELECT setval('audit_record_seq', greatest(seq, 1), seq > 0) FROM closing;
