-- Two costs of every claim and every ingest, cut.
--
-- The job counters' trigger read the statement's old and new rows once to lock the jobs and
-- again to add up their changes, each time joining the two by id: over a claim of 50,000
-- requests, two sorts of wide rows that spilled to disk: 0.17-0.18 s and 0.10-0.11 s of the
-- server's time (with `jit = off`, as tranche's connections run). A job's change is the sum of
-- its new rows less the sum of its old ones, so no join is needed: one pass adds both up by
-- job (0.05-0.06 s for that claim), and the jobs whose counts moved are updated one at a time
-- in id order, so that two statements touching the same jobs still take their rows' locks in
-- one order and wait for each other instead of deadlocking. A row whose counted values did not
-- change adds nothing either way.
CREATE OR REPLACE FUNCTION requests_keep_job_counters() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    c record;
BEGIN
    FOR c IN
        SELECT job_id, SUM(pending) AS pending, SUM(queued) AS queued,
               SUM(succeeded) AS succeeded, SUM(failed) AS failed,
               SUM(cancelled) AS cancelled, SUM(cached) AS cached, SUM(retried) AS retried,
               SUM(input_tokens) AS input_tokens, SUM(output_tokens) AS output_tokens
        FROM (SELECT job_id, (state = 'pending')::int AS pending,
                     (state = 'queued')::int AS queued, (state = 'succeeded')::int AS succeeded,
                     (state = 'failed')::int AS failed, (state = 'cancelled')::int AS cancelled,
                     cached::int AS cached, (attempts > 1)::int AS retried,
                     COALESCE(input_tokens, 0) AS input_tokens,
                     COALESCE(output_tokens, 0) AS output_tokens
              FROM new_rows
              UNION ALL
              SELECT job_id, -(state = 'pending')::int, -(state = 'queued')::int,
                     -(state = 'succeeded')::int, -(state = 'failed')::int,
                     -(state = 'cancelled')::int, -cached::int, -(attempts > 1)::int,
                     -COALESCE(input_tokens, 0), -COALESCE(output_tokens, 0)
              FROM old_rows) AS changes
        GROUP BY job_id
        HAVING SUM(pending) <> 0 OR SUM(queued) <> 0 OR SUM(succeeded) <> 0
            OR SUM(failed) <> 0 OR SUM(cancelled) <> 0 OR SUM(cached) <> 0
            OR SUM(retried) <> 0 OR SUM(input_tokens) <> 0 OR SUM(output_tokens) <> 0
        ORDER BY job_id
    LOOP
        UPDATE jobs SET
            n_pending = n_pending + c.pending,
            n_queued = n_queued + c.queued,
            n_succeeded = n_succeeded + c.succeeded,
            n_failed = n_failed + c.failed,
            n_cancelled = n_cancelled + c.cancelled,
            n_cached = n_cached + c.cached,
            n_retried = n_retried + c.retried,
            input_tokens = input_tokens + c.input_tokens,
            output_tokens = output_tokens + c.output_tokens
        WHERE id = c.job_id;
    END LOOP;
    RETURN NULL;
END
$$;

-- `requests_by_tranche` holds only the requests queued in a tranche, which is what every
-- look-up through it asks for (as SQLite's index of the same name, migration 0020). Before,
-- every version of every request had an entry, the waiting one (under a NULL tranche) and the
-- answered one included: two of the sixteen index entries a request's three versions wrote.
--
-- Together, a claim's update of 50,000 requests took 1.37-1.53 s of the server against
-- 2.00-2.01 s (`auto_explain`, two runs each).
DROP INDEX requests_by_tranche;
CREATE INDEX requests_by_tranche ON requests (tranche_id, wire_id) WHERE state = 'queued';
