-- `requests_by_job_state` was written three times for every request (at acceptance, at its
-- claim, at its result), a third of what a claim cost (50,000 requests: 0.53 s with it,
-- 0.36 without). What it served is found otherwise: whether a job has open requests from its
-- counters, what a job has in flight from its live tranches; the statements over a job's
-- waiting requests (cancel, end of budget) run only when its counters say some wait, and then
-- find them through `UNIQUE (job_id, custom_id)`.
DROP INDEX requests_by_job_state;
