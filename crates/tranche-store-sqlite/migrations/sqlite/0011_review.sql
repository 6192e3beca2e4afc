-- no-transaction
-- Jobs whose answers wait for review: `jobs.state` gains `needs_review`. SQLite cannot change a CHECK constraint in place, so the
-- table is rebuilt, with foreign keys off for the swap (they cannot be turned off inside a
-- transaction, hence `no-transaction` and the explicit one below). Run twice (two engines
-- migrating at once), every statement succeeds again and the second rebuild changes nothing.

PRAGMA foreign_keys = OFF;

BEGIN IMMEDIATE;

CREATE TABLE jobs_new (
    id          TEXT PRIMARY KEY,
    provider    TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('pending', 'running', 'done', 'needs_review',
                                               'failed', 'cancelled')),
    source      TEXT,
    settings    TEXT NOT NULL,
    accepted    INTEGER NOT NULL,
    last_error  TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    finished_at INTEGER,
    n_pending INTEGER NOT NULL DEFAULT 0,
    n_queued INTEGER NOT NULL DEFAULT 0,
    n_succeeded INTEGER NOT NULL DEFAULT 0,
    n_failed INTEGER NOT NULL DEFAULT 0,
    n_cancelled INTEGER NOT NULL DEFAULT 0,
    n_cached INTEGER NOT NULL DEFAULT 0,
    n_retried INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    tenant TEXT,
    body_object TEXT,
    pruned_at INTEGER,
    bytes_pruned_at INTEGER,
    -- 1 while the job's answers are unreviewed: none of them is reused for another job.
    awaits_review INTEGER NOT NULL DEFAULT 0,
    -- Who approved or rejected the answers, when, and which.
    review_verdict TEXT CHECK (review_verdict IN ('approved', 'rejected')),
    reviewed_by TEXT,
    reviewed_at INTEGER
) STRICT;

INSERT INTO jobs_new (id, provider, state, source, settings, accepted, last_error,
                      cancel_requested, created_at, updated_at, finished_at, n_pending, n_queued,
                      n_succeeded, n_failed, n_cancelled, n_cached, n_retried, input_tokens,
                      output_tokens, tenant, body_object, pruned_at, bytes_pruned_at)
    SELECT id, provider, state, source, settings, accepted, last_error, cancel_requested,
           created_at, updated_at, finished_at, n_pending, n_queued, n_succeeded, n_failed,
           n_cancelled, n_cached, n_retried, input_tokens, output_tokens, tenant, body_object,
           pruned_at, bytes_pruned_at
    FROM jobs;

-- The counters' trigger names `jobs`: it goes while the name is away, and comes back.
DROP TRIGGER requests_keep_job_counters;
DROP TABLE jobs;
ALTER TABLE jobs_new RENAME TO jobs;

CREATE INDEX jobs_by_tenant ON jobs (tenant, created_at) WHERE tenant IS NOT NULL;
CREATE INDEX jobs_prunable ON jobs (finished_at) WHERE bytes_pruned_at IS NULL;

CREATE TRIGGER requests_keep_job_counters
AFTER UPDATE OF state, cached, attempts, input_tokens, output_tokens ON requests
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
