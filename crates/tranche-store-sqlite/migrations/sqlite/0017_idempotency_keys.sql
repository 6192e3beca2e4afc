-- Idempotency keys of HTTP submissions, per tenant. A key is claimed before its job is
-- accepted (job_id and body_sha256 NULL) and completed with them once the job is committed; a
-- later submission with the same key and body gets the same job, another body a conflict. A
-- claim never completed (the server died mid-submission) may be taken over once stale.
CREATE TABLE idempotency_keys (
    tenant      TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    body_sha256 TEXT,
    job_id      TEXT    REFERENCES jobs (id),
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (tenant, key)
) STRICT;
