-- Nothing looks a record up by event_id, and seq (handed out under the chain head's lock) is what
-- identifies a record in the chain: the unique index on (event_id, occurred_at) only cost every append.
ALTER TABLE audit_events DROP CONSTRAINT audit_events_event_id_occurred_at_key;

-- A tool call's intent and outcome records are most of the log: a listing by those types finds
-- them densely in seq order without an index. Rarer types (denials, failures, control events)
-- keep theirs.
DROP INDEX audit_events_type_seq;
CREATE INDEX audit_events_type_seq ON audit_events (event_type, seq)
  WHERE event_type NOT IN ('run.step.dispatching', 'run.step.completed');
