-- A record's four SHA-256s as their 32 bytes instead of 64 hex digits: most of a row's fixed size
-- (issue 29 item 4). Readers turn them back into the same lowercase hex in SQL (encode), so neither
-- the API nor any hash changes. A rewrite fires no row trigger: the append-only ones stay as they are.
-- A value that is not lowercase hex (only an edit of the row puts one there) keeps its text's bytes
-- instead: it still fails verification where it did, and nothing of it is lost.
ALTER TABLE audit_events
  ALTER COLUMN prev_hash TYPE bytea USING
    CASE WHEN prev_hash ~ '^([0-9a-f]{2})*$' THEN decode(prev_hash, 'hex') ELSE convert_to(prev_hash, 'UTF8') END,
  ALTER COLUMN hash TYPE bytea USING
    CASE WHEN hash ~ '^([0-9a-f]{2})*$' THEN decode(hash, 'hex') ELSE convert_to(hash, 'UTF8') END,
  ALTER COLUMN input_sha256 TYPE bytea USING
    CASE WHEN input_sha256 ~ '^([0-9a-f]{2})*$' THEN decode(input_sha256, 'hex') ELSE convert_to(input_sha256, 'UTF8') END,
  ALTER COLUMN output_sha256 TYPE bytea USING
    CASE WHEN output_sha256 ~ '^([0-9a-f]{2})*$' THEN decode(output_sha256, 'hex') ELSE convert_to(output_sha256, 'UTF8') END;

-- A run's records are few and always read together (recovery, recorded costs, a listing by run),
-- then sorted: keyed by the run alone, B-tree deduplication stores each run's id once with its rows
-- in one posting list, where (run_id, seq) made an entry of its own for every row.
DROP INDEX audit_events_run_seq;
CREATE INDEX audit_events_run ON audit_events (run_id) WHERE run_id IS NOT NULL;
