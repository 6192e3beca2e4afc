-- A request's unique key leads with its custom id, `(custom_id, job_id)`, and serves the lookups
-- of a custom id with an input hash too (`requests_identity`, on `(custom_id, input_hash)`, is
-- gone; the hash is checked on the row). A job's requests are found through `requests_by_job`.
-- Both keys that began with the custom id took an insert at a random place for every request
-- whose key does not follow input order (keys that are hashes or UUIDs), and with a cache far
-- smaller than those indexes each such insert read and wrote a page: accepting 100,000 such
-- requests spent 2.25 s in that insert against 0.39 for keys in input order. One such index
-- remains; `requests_by_job` grows at its end, as a job's ids rise. `requests` is rebuilt (a
-- table's unique key cannot be dropped), with the tables that point at it, as in `0023`.
--
-- `requests_by_tranche` comes back holding only the requests waiting in a tranche (`state =
-- 'queued'`), with their attempt count and size on the wire: ingest finds a result line's
-- request, and the attempt it is, from the index alone, and a tranche's input size is summed
-- from it. Before, staging read each line's request row too, in wire-id order a call at a
-- time, so with keys in random order every call of 4,096 shuffled lines read the rows of the
-- whole tranche again. A request leaves the index when its result is recorded, so the index
-- stays the size of what is in flight. Every query that uses it names a tranche and
-- `state = 'queued'`, which implies the index's condition.
CREATE TABLE requests_new (
    id            INTEGER PRIMARY KEY,
    job_id        TEXT NOT NULL REFERENCES jobs (id),
    line          INTEGER NOT NULL,
    custom_id     TEXT NOT NULL,
    wire_id       TEXT NOT NULL,
    provider      TEXT NOT NULL,
    endpoint      TEXT NOT NULL,
    model         TEXT NOT NULL,
    wire_bytes    INTEGER NOT NULL,
    input_hash    TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('pending', 'queued', 'succeeded', 'failed', 'cancelled')),
    tranche_seq   INTEGER REFERENCES tranches (seq),
    attempts      INTEGER NOT NULL DEFAULT 0,
    max_attempts  INTEGER NOT NULL,
    -- Times a whole-batch failure returned the request to the pool without spending an attempt.
    batch_returns INTEGER NOT NULL DEFAULT 0,
    -- 1 when answered from an earlier succeeded result with the same custom_id and input_hash.
    cached        INTEGER NOT NULL DEFAULT 0,
    est_tokens    INTEGER NOT NULL,
    accepted_at   INTEGER NOT NULL,
    not_before    INTEGER NOT NULL DEFAULT 0,
    error         TEXT,
    input_tokens  INTEGER,
    output_tokens INTEGER,
    finished_at   INTEGER,
    body_offset   INTEGER,
    body_length   INTEGER,
    output_object TEXT,
    output_offset INTEGER,
    output_length INTEGER,
    answer_check  TEXT,
    max_cost      INTEGER,
    UNIQUE (custom_id, job_id)
) STRICT;

INSERT INTO requests_new
    (id, job_id, line, custom_id, wire_id, provider, endpoint, model, wire_bytes, input_hash,
     state, tranche_seq, attempts, max_attempts, batch_returns, cached, est_tokens, accepted_at,
     not_before, error, input_tokens, output_tokens, finished_at, body_offset, body_length,
     output_object, output_offset, output_length, answer_check, max_cost)
SELECT id, job_id, line, custom_id, wire_id, provider, endpoint, model, wire_bytes, input_hash,
     state, tranche_seq, attempts, max_attempts, batch_returns, cached, est_tokens, accepted_at,
     not_before, error, input_tokens, output_tokens, finished_at, body_offset, body_length,
     output_object, output_offset, output_length, answer_check, max_cost
FROM requests
ORDER BY id;

CREATE TABLE attempts_new (
    request_id            INTEGER NOT NULL REFERENCES requests_new (id),
    attempt               INTEGER NOT NULL,
    tranche_seq           INTEGER NOT NULL REFERENCES tranches (seq),
    outcome               TEXT NOT NULL
        CHECK (outcome IN ('succeeded', 'errored', 'expired', 'cancelled', 'missing')),
    status_code           INTEGER,
    error                 TEXT,
    created_at            INTEGER NOT NULL,
    model                 TEXT,
    input_tokens          INTEGER,
    cached_input_tokens   INTEGER,
    cache_write_5m_tokens INTEGER,
    cache_write_1h_tokens INTEGER,
    output_tokens         INTEGER,
    reasoning_tokens      INTEGER,
    -- A request is in a tranche at most once; a whole-batch return does not spend an attempt,
    -- so one attempt number can appear for several tranches.
    PRIMARY KEY (request_id, tranche_seq)
) STRICT, WITHOUT ROWID;

INSERT INTO attempts_new
    (request_id, attempt, tranche_seq, outcome, status_code, error, created_at, model,
     input_tokens, cached_input_tokens, cache_write_5m_tokens, cache_write_1h_tokens,
     output_tokens, reasoning_tokens)
SELECT request_id, attempt, tranche_seq, outcome, status_code, error, created_at, model,
     input_tokens, cached_input_tokens, cache_write_5m_tokens, cache_write_1h_tokens,
     output_tokens, reasoning_tokens
FROM attempts
ORDER BY request_id, tranche_seq;

CREATE TABLE request_bodies_new (
    request_id INTEGER PRIMARY KEY REFERENCES requests_new (id),
    body       TEXT NOT NULL
) STRICT;
INSERT INTO request_bodies_new (request_id, body)
    SELECT request_id, body FROM request_bodies ORDER BY request_id;

CREATE TABLE request_outputs_new (
    id         INTEGER PRIMARY KEY,
    request_id INTEGER NOT NULL UNIQUE REFERENCES requests_new (id),
    output     TEXT NOT NULL
) STRICT;
INSERT INTO request_outputs_new (id, request_id, output)
    SELECT id, request_id, output FROM request_outputs ORDER BY id;

-- The old tables go children first, so that no row points at a dropped request.
DROP TABLE attempts;
DROP TABLE request_bodies;
DROP TABLE request_outputs;
DROP TABLE requests;
ALTER TABLE requests_new RENAME TO requests;
ALTER TABLE attempts_new RENAME TO attempts;
ALTER TABLE request_bodies_new RENAME TO request_bodies;
ALTER TABLE request_outputs_new RENAME TO request_outputs;

CREATE INDEX requests_pending ON requests (provider, endpoint, model, id) WHERE state = 'pending';
CREATE INDEX requests_reused_outputs ON requests (output_object) WHERE cached = 1;
CREATE INDEX requests_by_job ON requests (job_id);
CREATE INDEX requests_by_tranche ON requests (tranche_seq, wire_id, attempts, wire_bytes)
    WHERE state = 'queued';

CREATE TRIGGER requests_keep_job_counters
AFTER UPDATE OF state, cached, attempts, input_tokens, output_tokens ON requests
WHEN (old.state IS NOT new.state OR old.cached IS NOT new.cached
  OR (old.attempts > 1) IS NOT (new.attempts > 1)
  OR old.input_tokens IS NOT new.input_tokens OR old.output_tokens IS NOT new.output_tokens)
  AND (SELECT paused FROM counter_pause) = 0
BEGIN
    UPDATE jobs SET
        n_pending = n_pending + (new.state = 'pending') - (old.state = 'pending'),
        n_queued = n_queued + (new.state = 'queued') - (old.state = 'queued'),
        n_succeeded = n_succeeded + (new.state = 'succeeded') - (old.state = 'succeeded'),
        n_failed = n_failed + (new.state = 'failed') - (old.state = 'failed'),
        n_cancelled = n_cancelled + (new.state = 'cancelled') - (old.state = 'cancelled'),
        n_cached = n_cached + new.cached - old.cached,
        n_retried = n_retried + (new.attempts > 1) - (old.attempts > 1),
        input_tokens = input_tokens + COALESCE(new.input_tokens, 0) - COALESCE(old.input_tokens, 0),
        output_tokens = output_tokens + COALESCE(new.output_tokens, 0) - COALESCE(old.output_tokens, 0)
    WHERE id = new.job_id;
END;
