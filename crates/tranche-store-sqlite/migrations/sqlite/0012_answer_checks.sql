-- Answers checked against a job's JSON Schema. A check is a schema and whether JSON inside a
-- Markdown fence passes it; a request carries its job's check (an answer is reused only under
-- the same one), and a tranche holds requests of one check, so ingest compiles one schema.

CREATE TABLE answer_checks (
    id           TEXT PRIMARY KEY,
    schema       TEXT NOT NULL,
    lenient_json INTEGER NOT NULL,
    created_at   INTEGER NOT NULL
) STRICT;

ALTER TABLE requests ADD COLUMN answer_check TEXT;
ALTER TABLE tranches ADD COLUMN answer_check TEXT;

-- Requests are looked up by identity (custom id + input hash) in every state: an earlier
-- answer to reuse, or an identical request in flight to wait for. One full index serves both
-- and replaces the partial one on uncached successes.
DROP INDEX requests_answers;
CREATE INDEX requests_identity ON requests (custom_id, input_hash);
