-- A job names the range of its request ids, and `requests_by_job` goes.
--
-- A job's writer numbers its requests in one run, inside one transaction that holds the write
-- lock (the ids after the largest one, in input order), so a job's requests are the rows of
-- one id range: `jobs.first_request` to `jobs.last_request` (both NULL for a job without
-- requests). The statements over a job's requests read that range in rowid order, with the
-- job's id checked on each row, instead of finding them through `requests_by_job (job_id)`:
-- an index every accepted request wrote an entry to (its 36-character job id and rowid), 5.1
-- MB of a 100,000-request run's 52.7 MB, and that no statement of a run's hot paths reads.
--
-- A job accepted before takes the least and greatest id of its requests: the range holds them
-- all whatever lies between, and the job's id is checked on every row read.
ALTER TABLE jobs ADD COLUMN first_request INTEGER;
ALTER TABLE jobs ADD COLUMN last_request INTEGER;

UPDATE jobs SET first_request = (SELECT MIN(r.id) FROM requests AS r WHERE r.job_id = jobs.id),
                last_request = (SELECT MAX(r.id) FROM requests AS r WHERE r.job_id = jobs.id);

DROP INDEX requests_by_job;
