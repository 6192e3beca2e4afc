-- Each job keeps its requests' counts by state, cached and retried requests, and token totals,
-- so that `status` reads one row instead of scanning a job's requests (1.6 s and 5.4 s per call
-- at 1,000,000 requests). A trigger keeps them true on every change of a request; a new job's
-- requests are all pending, which its writer records when it commits.

ALTER TABLE jobs ADD COLUMN n_pending INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN n_queued INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN n_succeeded INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN n_failed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN n_cancelled INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN n_cached INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN n_retried INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN input_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN output_tokens INTEGER NOT NULL DEFAULT 0;

UPDATE jobs SET
    n_pending = (SELECT COUNT(*) FROM requests AS r WHERE r.job_id = jobs.id AND r.state = 'pending'),
    n_queued = (SELECT COUNT(*) FROM requests AS r WHERE r.job_id = jobs.id AND r.state = 'queued'),
    n_succeeded = (SELECT COUNT(*) FROM requests AS r WHERE r.job_id = jobs.id AND r.state = 'succeeded'),
    n_failed = (SELECT COUNT(*) FROM requests AS r WHERE r.job_id = jobs.id AND r.state = 'failed'),
    n_cancelled = (SELECT COUNT(*) FROM requests AS r WHERE r.job_id = jobs.id AND r.state = 'cancelled'),
    n_cached = (SELECT COUNT(*) FROM requests AS r WHERE r.job_id = jobs.id AND r.cached = 1),
    n_retried = (SELECT COUNT(*) FROM requests AS r WHERE r.job_id = jobs.id AND r.attempts > 1),
    input_tokens = (SELECT COALESCE(SUM(input_tokens), 0) FROM requests AS r WHERE r.job_id = jobs.id),
    output_tokens = (SELECT COALESCE(SUM(output_tokens), 0) FROM requests AS r WHERE r.job_id = jobs.id);

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
