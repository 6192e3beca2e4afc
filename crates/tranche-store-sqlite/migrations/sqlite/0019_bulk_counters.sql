-- A job's counters are kept by a trigger on each request row that changes, which rewrites
-- the job's row once per request. The two statements that move a whole tranche at once
-- (claiming its requests, applying its successes) count in one statement per job instead:
-- while they run, inside their own transaction, `counter_pause` holds 1 and the trigger
-- stands aside. No other connection ever sees 1 (it is set back before the commit).
CREATE TABLE counter_pause (paused INTEGER NOT NULL);
INSERT INTO counter_pause (paused) VALUES (0);

DROP TRIGGER requests_keep_job_counters;
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
