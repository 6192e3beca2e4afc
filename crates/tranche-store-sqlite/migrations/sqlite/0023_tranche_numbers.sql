-- A request and an attempt name their tranche by a small number (`tranches.seq`) instead of its
-- 36-character id. The id grew every request row at its claim (pages split across the tranche's
-- range) and stood in every entry of `requests_by_tranche` and of `attempts`' key, compared at
-- every lookup of a result line. The tables that point at `requests` are rebuilt with it, so
-- that `requests` can be replaced with foreign keys on: each new table points at the new
-- `requests`, and renaming it carries their references along.
ALTER TABLE tranches ADD COLUMN seq INTEGER;
UPDATE tranches SET seq = rowid;
CREATE UNIQUE INDEX tranches_by_seq ON tranches (seq);

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
    UNIQUE (job_id, custom_id)
) STRICT;

INSERT INTO requests_new
    (id, job_id, line, custom_id, wire_id, provider, endpoint, model, wire_bytes, input_hash,
     state, tranche_seq, attempts, max_attempts, batch_returns, cached, est_tokens, accepted_at,
     not_before, error, input_tokens, output_tokens, finished_at, body_offset, body_length,
     output_object, output_offset, output_length, answer_check, max_cost)
SELECT r.id, r.job_id, r.line, r.custom_id, r.wire_id, r.provider, r.endpoint, r.model,
       r.wire_bytes, r.input_hash, r.state, t.seq, r.attempts, r.max_attempts, r.batch_returns,
       r.cached, r.est_tokens, r.accepted_at, r.not_before, r.error, r.input_tokens,
       r.output_tokens, r.finished_at, r.body_offset, r.body_length, r.output_object,
       r.output_offset, r.output_length, r.answer_check, r.max_cost
FROM requests AS r LEFT JOIN tranches AS t ON t.id = r.tranche_id
ORDER BY r.id;

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
SELECT a.request_id, a.attempt, t.seq, a.outcome, a.status_code, a.error, a.created_at, a.model,
       a.input_tokens, a.cached_input_tokens, a.cache_write_5m_tokens, a.cache_write_1h_tokens,
       a.output_tokens, a.reasoning_tokens
FROM attempts AS a JOIN tranches AS t ON t.id = a.tranche_id
ORDER BY a.request_id, t.seq;

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
CREATE INDEX requests_identity ON requests (custom_id, input_hash);
CREATE INDEX requests_by_tranche ON requests (tranche_seq, wire_id) WHERE tranche_seq IS NOT NULL;

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
