-- A new log starts as leaves only, and its months are archived as ranges of the Merkle tree.

-- A checkpoint that seals a range of leaves names its last leaf: `hash` is that leaf's hash, and
-- the signature covers the index too (docs/design/audit-chain.md#leaf-partitions).
ALTER TABLE audit_checkpoints ADD COLUMN leaf_index bigint CHECK (leaf_index >= 0);

-- A detached month of leaf records archives leaves from_leaf..to_leaf (with the seqs of the records
-- at both ends); it has no link to chain from.
ALTER TABLE audit_partition_archives ADD COLUMN from_leaf bigint CHECK (from_leaf >= 0);
ALTER TABLE audit_partition_archives ADD COLUMN to_leaf bigint;
ALTER TABLE audit_partition_archives ALTER COLUMN prev_hash DROP NOT NULL;
ALTER TABLE audit_partition_archives DROP CONSTRAINT audit_partition_archives_check;
ALTER TABLE audit_partition_archives ADD CONSTRAINT audit_partition_archives_range CHECK (
  (from_leaf IS NULL AND to_leaf IS NULL AND prev_hash IS NOT NULL
    AND to_seq >= from_seq AND row_count = to_seq - from_seq + 1)
  OR (from_leaf IS NOT NULL AND prev_hash IS NULL
    AND to_leaf >= from_leaf AND row_count = to_leaf - from_leaf + 1)
);
CREATE UNIQUE INDEX audit_partition_archives_by_leaf ON audit_partition_archives (from_leaf);

-- A log with no record yet never needs the chain: it is closed at its genesis, so every record is
-- a leaf and no month holds both kinds. A log with records keeps its chain open.
UPDATE audit_chain_head SET closed = true
WHERE id = 1 AND seq = 0 AND NOT EXISTS (SELECT 1 FROM audit_events);
