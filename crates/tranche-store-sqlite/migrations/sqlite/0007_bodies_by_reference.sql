-- Request bodies leave the database: a job's canonical bodies rest in one blob-store object
-- (`jobs.body_object`, one body a line) and each request points at its byte range in it. Jobs
-- accepted before keep their bodies in `request_bodies`.

ALTER TABLE jobs ADD COLUMN body_object TEXT;
ALTER TABLE requests ADD COLUMN body_offset INTEGER;
ALTER TABLE requests ADD COLUMN body_length INTEGER;
