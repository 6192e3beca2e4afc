-- The checks on every request and attempt written cost about what the writes themselves do;
-- the same rules, checked more cheaply.
--
-- A request's state and an attempt's outcome are checked by comparisons (`state = 'pending' OR
-- state = 'queued' OR ...`) instead of `IN (...)`. SQLite checks a constant `IN` list of more
-- than two values against a small table it builds; in a query it builds that table once, but
-- in a CHECK constraint it builds it again for every row written (the code of a constraint
-- cannot run once ahead of the rows). Every request is written three times on its way
-- (accepted, claimed, answered) and every answer once more as its attempt. Measured with
-- SQLite's shell (3.40; the bundled 3.51 builds the list the same way), 500,000 rows: an
-- insert 0.63 s of CPU against 0.15, an update of the state 0.70 s against 0.12.
--
-- The foreign keys of requests, attempts, bodies and outputs are checked at the commit
-- (`DEFERRABLE INITIALLY DEFERRED`), not after each statement. A statement that writes many
-- rows and may stop halfway makes SQLite copy every page it changes to a statement journal
-- first, so that it can undo just that statement; an immediate foreign key makes every such
-- statement one, whatever its `OR` clause says (`PRAGMA defer_foreign_keys` does not change
-- that: the journal is decided when the statement is compiled, from how the key is declared).
-- A 100,000-request run wrote 346 MB of statement journals to temporary files, more than it
-- wrote to the log (203 MB): the inserts at submit 136 MB, each claim 85 MB. The rule holds as
-- before: a transaction that leaves a request or attempt pointing at nothing fails to commit,
-- and every write of these rows is inside one.
--
-- The counter trigger asks whether it is paused first: a bulk statement (a claim, an ingest)
-- moves every row it counts itself, and now each of its rows costs one lookup in the trigger,
-- not the comparison of six columns and then the lookup.
--
-- SQLite cannot change a CHECK constraint or a foreign key in place: `requests` is rebuilt,
-- with the tables that point at it, as in `0024` (children dropped first, so that no row points
-- at a dropped request). Nothing else changes: every column, key, index and trigger comes back
-- as it was.
CREATE TABLE requests_new (
    id            INTEGER PRIMARY KEY,
    job_id        TEXT NOT NULL REFERENCES jobs (id) DEFERRABLE INITIALLY DEFERRED,
    line          INTEGER NOT NULL,
    custom_id     TEXT NOT NULL,
    wire_id       TEXT NOT NULL,
    provider      TEXT NOT NULL,
    endpoint      TEXT NOT NULL,
    model         TEXT NOT NULL,
    wire_bytes    INTEGER NOT NULL,
    input_hash    TEXT NOT NULL,
    state         TEXT NOT NULL
        CHECK (state = 'pending' OR state = 'queued' OR state = 'succeeded' OR state = 'failed'
               OR state = 'cancelled'),
    tranche_seq   INTEGER REFERENCES tranches (seq) DEFERRABLE INITIALLY DEFERRED,
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
    request_id            INTEGER NOT NULL
        REFERENCES requests_new (id) DEFERRABLE INITIALLY DEFERRED,
    attempt               INTEGER NOT NULL,
    tranche_seq           INTEGER NOT NULL
        REFERENCES tranches (seq) DEFERRABLE INITIALLY DEFERRED,
    outcome               TEXT NOT NULL
        CHECK (outcome = 'succeeded' OR outcome = 'errored' OR outcome = 'expired'
               OR outcome = 'cancelled' OR outcome = 'missing'),
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
    -- Where a successful attempt's answer rests in the raw results (see `0025`).
    output_object         TEXT,
    output_offset         INTEGER,
    output_length         INTEGER,
    -- A request is in a tranche at most once; a whole-batch return does not spend an attempt,
    -- so one attempt number can appear for several tranches.
    PRIMARY KEY (request_id, tranche_seq)
) STRICT, WITHOUT ROWID;

INSERT INTO attempts_new
    (request_id, attempt, tranche_seq, outcome, status_code, error, created_at, model,
     input_tokens, cached_input_tokens, cache_write_5m_tokens, cache_write_1h_tokens,
     output_tokens, reasoning_tokens, output_object, output_offset, output_length)
SELECT request_id, attempt, tranche_seq, outcome, status_code, error, created_at, model,
     input_tokens, cached_input_tokens, cache_write_5m_tokens, cache_write_1h_tokens,
     output_tokens, reasoning_tokens, output_object, output_offset, output_length
FROM attempts
ORDER BY request_id, tranche_seq;

CREATE TABLE request_bodies_new (
    request_id INTEGER PRIMARY KEY REFERENCES requests_new (id) DEFERRABLE INITIALLY DEFERRED,
    body       TEXT NOT NULL
) STRICT;
INSERT INTO request_bodies_new (request_id, body)
    SELECT request_id, body FROM request_bodies ORDER BY request_id;

CREATE TABLE request_outputs_new (
    id         INTEGER PRIMARY KEY,
    request_id INTEGER NOT NULL UNIQUE
        REFERENCES requests_new (id) DEFERRABLE INITIALLY DEFERRED,
    output     TEXT NOT NULL
) STRICT;
INSERT INTO request_outputs_new (id, request_id, output)
    SELECT id, request_id, output FROM request_outputs ORDER BY id;

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
WHEN (SELECT paused FROM counter_pause) = 0
  AND (old.state IS NOT new.state OR old.cached IS NOT new.cached
    OR (old.attempts > 1) IS NOT (new.attempts > 1)
    OR old.input_tokens IS NOT new.input_tokens OR old.output_tokens IS NOT new.output_tokens)
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
