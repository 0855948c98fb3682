-- Records appended from now on are linked by the database (hash_scheme 2: seq, prev_hash and the
-- content's hash); earlier ones keep the hash over the whole record (1). A constant default is
-- stored in the catalog, so existing partitions are not rewritten.
ALTER TABLE audit_events ADD COLUMN hash_scheme smallint NOT NULL DEFAULT 1;
ALTER TABLE audit_events ADD CONSTRAINT audit_events_hash_scheme_known CHECK (hash_scheme IN (1, 2)) NOT VALID;
