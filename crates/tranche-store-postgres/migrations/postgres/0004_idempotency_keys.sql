-- Idempotency keys of HTTP submissions, per tenant (SQLite's migration 0017): claimed before
-- the job is accepted, completed with its id and the body's hash once it is committed.
CREATE TABLE idempotency_keys (
    tenant      TEXT   NOT NULL,
    key         TEXT   NOT NULL,
    body_sha256 TEXT,
    job_id      TEXT   REFERENCES jobs (id),
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (tenant, key)
);
