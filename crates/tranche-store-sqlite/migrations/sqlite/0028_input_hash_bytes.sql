-- no-transaction
-- A request's input hash is kept as its 32 bytes, not as 64 hex digits: every request row is
-- 32 bytes shorter (about a tenth of it), and every claim and answer rewrites the row. Compared
-- only with another request's (an earlier answer, an identical request in flight), never read
-- back. A 100,000-request run's `requests` took 26.8 MB against 30.3, and an update of every
-- row's state (SQLite 3.40, 1 MiB of cache) 0.29-0.30 s of CPU against 0.31.
--
-- A value that is not hex (none that tranche wrote) keeps its bytes as they are, so that equal
-- hashes stay equal. SQLite cannot change a column's type in place: `requests` is rebuilt with
-- foreign keys off for the swap (they cannot be turned off inside a transaction, hence
-- `no-transaction` and the explicit one below); the tables that point at it point at the new
-- one by its name. Run twice (two engines migrating at once), the second rebuild changes
-- nothing: a hash already kept as bytes is copied as it is.

PRAGMA foreign_keys = OFF;

BEGIN IMMEDIATE;

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
    -- SHA-256 of the canonical request (`InputHash`), its 32 bytes.
    input_hash    BLOB NOT NULL,
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
    -- Set (to 0) by a statement whose rows the counter trigger counts (see `0027`).
    recount       INTEGER NOT NULL DEFAULT 0,
    UNIQUE (custom_id, job_id)
) STRICT;

INSERT INTO requests_new
    (id, job_id, line, custom_id, wire_id, provider, endpoint, model, wire_bytes, input_hash,
     state, tranche_seq, attempts, max_attempts, batch_returns, cached, est_tokens, accepted_at,
     not_before, error, input_tokens, output_tokens, finished_at, body_offset, body_length,
     output_object, output_offset, output_length, answer_check, max_cost, recount)
SELECT id, job_id, line, custom_id, wire_id, provider, endpoint, model, wire_bytes,
     CASE WHEN typeof(input_hash) = 'text'
          THEN COALESCE(unhex(input_hash), CAST(input_hash AS BLOB))
          ELSE input_hash END,
     state, tranche_seq, attempts, max_attempts, batch_returns, cached, est_tokens, accepted_at,
     not_before, error, input_tokens, output_tokens, finished_at, body_offset, body_length,
     output_object, output_offset, output_length, answer_check, max_cost, recount
FROM requests
ORDER BY id;

DROP TABLE requests;
ALTER TABLE requests_new RENAME TO requests;

CREATE INDEX requests_pending ON requests (provider, endpoint, model, id) WHERE state = 'pending';
CREATE INDEX requests_reused_outputs ON requests (output_object) WHERE cached = 1;
CREATE INDEX requests_by_job ON requests (job_id);
CREATE INDEX requests_by_tranche ON requests (tranche_seq, wire_id, attempts, wire_bytes)
    WHERE state = 'queued';

CREATE TRIGGER requests_keep_job_counters
AFTER UPDATE OF recount ON requests
WHEN old.state IS NOT new.state OR old.cached IS NOT new.cached
  OR (old.attempts > 1) IS NOT (new.attempts > 1)
  OR old.input_tokens IS NOT new.input_tokens OR old.output_tokens IS NOT new.output_tokens
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

COMMIT;

PRAGMA foreign_keys = ON;
