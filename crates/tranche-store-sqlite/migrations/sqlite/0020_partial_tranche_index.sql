-- `requests_by_tranche` finds a tranche's requests (by wire id at ingest). A waiting request
-- belongs to no tranche, yet each was indexed under NULL when its job was accepted, at a
-- random place in wire-id order, and moved again when it was claimed. Only requests in a
-- tranche are indexed now: accepting a job no longer touches this index, and a claim only
-- adds to it. Every query that uses it names a tranche (`tranche_id = ...`), which implies
-- the index's condition.
DROP INDEX requests_by_tranche;
CREATE INDEX requests_by_tranche ON requests (tranche_id, wire_id) WHERE tranche_id IS NOT NULL;
