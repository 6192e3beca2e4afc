-- `requests_by_tranche` holds only the requests waiting in a tranche (`state = 'queued'`), with
-- their attempt count: ingest finds a result line's request, and the attempt it is, from the
-- index alone. Before, staging read each line's request row too, in wire-id order a call at a
-- time, so every call of 4,096 shuffled lines read the rows of the whole tranche again. A
-- request leaves the index when its result is recorded, so the index stays the size of what is
-- in flight. Every query that uses it names a tranche and `state = 'queued'`, which implies
-- the index's condition.
DROP INDEX requests_by_tranche;
CREATE INDEX requests_by_tranche ON requests (tranche_seq, wire_id, attempts)
    WHERE state = 'queued';
