-- The audit log's Merkle tree (SPEC §8.1, docs/design/audit-chain.md): records are sequenced into it
-- as leaves by one replica at a time, stored as C2SP tlog-tiles, and covered by signed checkpoints.

-- The tree as the sequencer last left it, and who holds the sequencer's lease.
CREATE TABLE audit_tree_state (
  id          smallint PRIMARY KEY CHECK (id = 1),
  tree_size   bigint NOT NULL CHECK (tree_size >= 0),
  -- The seq of the last record sequenced: records after it are sequenced next, in seq order.
  last_seq    bigint NOT NULL CHECK (last_seq >= 0),
  root_hash   bytea NOT NULL,
  sequencer   text,
  lease_until timestamptz
);
INSERT INTO audit_tree_state (id, tree_size, last_seq, root_hash)
VALUES (1, 0, 0, sha256(''::bytea));

-- Which record each leaf is. A record is found by its id (proofs, receipts), a leaf by its index (verification).
CREATE TABLE audit_leaves (
  leaf_index bigint PRIMARY KEY CHECK (leaf_index >= 0),
  seq        bigint NOT NULL,
  event_id   uuid NOT NULL UNIQUE
);

-- Tile (level, idx) holds the hashes of nodes idx·256 … at tree level 8·level, concatenated (32 bytes each).
CREATE TABLE audit_tree_tiles (
  level  smallint NOT NULL CHECK (level >= 0),
  idx    bigint NOT NULL CHECK (idx >= 0),
  hashes bytea NOT NULL CHECK (length(hashes) BETWEEN 32 AND 8192 AND length(hashes) % 32 = 0),
  PRIMARY KEY (level, idx)
);

-- Every checkpoint published: the C2SP signed note, byte for byte.
CREATE TABLE audit_tree_checkpoints (
  tree_size    bigint PRIMARY KEY CHECK (tree_size >= 0),
  root_hash    bytea NOT NULL,
  note         text NOT NULL,
  published_at timestamptz NOT NULL DEFAULT now()
);

-- Leaves and checkpoints are never changed or removed, as the log itself is not.
CREATE FUNCTION audit_tree_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
    USING ERRCODE = 'insufficient_privilege';
END;
$$;

CREATE TRIGGER audit_leaves_no_update_delete
  BEFORE UPDATE OR DELETE ON audit_leaves
  FOR EACH ROW EXECUTE FUNCTION audit_tree_refuse_change();
CREATE TRIGGER audit_leaves_no_truncate
  BEFORE TRUNCATE ON audit_leaves
  FOR EACH STATEMENT EXECUTE FUNCTION audit_tree_refuse_change();
CREATE TRIGGER audit_tree_checkpoints_no_update_delete
  BEFORE UPDATE OR DELETE ON audit_tree_checkpoints
  FOR EACH ROW EXECUTE FUNCTION audit_tree_refuse_change();
CREATE TRIGGER audit_tree_checkpoints_no_truncate
  BEFORE TRUNCATE ON audit_tree_checkpoints
  FOR EACH STATEMENT EXECUTE FUNCTION audit_tree_refuse_change();
