-- The counter trigger fires only for the statements that ask it to: those that set `recount`
-- (to 0: its value means nothing, its place in a statement's SET list does). The two bulk
-- statements, a claim and the apply of a tranche's successes, count their rows themselves and
-- do not set it, so SQLite compiles no trigger into them at all.
--
-- Before, the trigger fired for every row those statements moved and asked `counter_pause`
-- whether to stand aside (set around each bulk statement, `0019`). Asking cost a sub-program
-- run and a lookup per row: an update of 100,000 requests' state (Python's sqlite3 module, in
-- a table of this shape) took 0.115 s of CPU with a paused trigger against 0.092 without one (a
-- claim), 0.117 against 0.081 (an answer); with a trigger whose condition reads only the row,
-- 0.105 and 0.108. A 10,000-request `tranche run` executed 1.7% fewer instructions besides
-- SHA-256's with the trigger dropped (callgrind).
--
-- A statement that moves a request's state, `cached`, attempts or tokens without being one of
-- the two must set `recount = 0`; the rule is checked per statement by the store's tests of
-- each path's counters.
ALTER TABLE requests ADD COLUMN recount INTEGER NOT NULL DEFAULT 0;

DROP TRIGGER requests_keep_job_counters;
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

DROP TABLE counter_pause;
