-- tranche's schema on PostgreSQL: the schema the SQLite migrations 0001 to 0014 arrive at, in
-- PostgreSQL's types. Integers are BIGINT (unix seconds, counts, byte offsets), flags are
-- BOOLEAN, and JSON is kept as TEXT, exactly as written, so that it reads back unchanged.
-- The comments of the SQLite migrations say why each part exists; what differs is said here.

-- Jobs, with their requests' counts by state and token totals kept by the trigger at the end,
-- so that `status` reads one row instead of scanning a job's requests.
CREATE TABLE jobs (
    id               TEXT PRIMARY KEY,
    provider         TEXT NOT NULL,
    state            TEXT NOT NULL CHECK (state IN ('pending', 'running', 'done', 'needs_review',
                                                    'failed', 'cancelled')),
    source           TEXT,
    settings         TEXT NOT NULL,
    accepted         BIGINT NOT NULL,
    last_error       TEXT,
    cancel_requested BOOLEAN NOT NULL DEFAULT false,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    finished_at      BIGINT,
    n_pending        BIGINT NOT NULL DEFAULT 0,
    n_queued         BIGINT NOT NULL DEFAULT 0,
    n_succeeded      BIGINT NOT NULL DEFAULT 0,
    n_failed         BIGINT NOT NULL DEFAULT 0,
    n_cancelled      BIGINT NOT NULL DEFAULT 0,
    n_cached         BIGINT NOT NULL DEFAULT 0,
    n_retried        BIGINT NOT NULL DEFAULT 0,
    input_tokens     BIGINT NOT NULL DEFAULT 0,
    output_tokens    BIGINT NOT NULL DEFAULT 0,
    -- The tenant that submitted the job (the HTTP server's tenants and `--tenant`).
    tenant           TEXT,
    -- The blob-store object holding the job's canonical bodies, one a line.
    body_object      TEXT,
    -- Retention: set once the request rows are gone, then once the bytes are.
    pruned_at        BIGINT,
    bytes_pruned_at  BIGINT,
    -- True while the job's answers are unreviewed: none of them is reused for another job.
    awaits_review    BOOLEAN NOT NULL DEFAULT false,
    -- Who approved or rejected the answers, when, and which.
    review_verdict   TEXT CHECK (review_verdict IN ('approved', 'rejected')),
    reviewed_by      TEXT,
    reviewed_at      BIGINT,
    -- Why the job is paused (a full file storage), until an upload succeeds again.
    paused_error     TEXT
);

CREATE INDEX jobs_by_tenant ON jobs (tenant, created_at) WHERE tenant IS NOT NULL;
CREATE INDEX jobs_prunable ON jobs (finished_at) WHERE bytes_pruned_at IS NULL;

CREATE TABLE tranches (
    id               TEXT PRIMARY KEY,
    provider         TEXT NOT NULL,
    endpoint         TEXT NOT NULL,
    model            TEXT NOT NULL,
    state            TEXT NOT NULL CHECK (state IN ('planned', 'uploading', 'uploaded', 'creating',
                         'submitted', 'collecting', 'ingesting', 'cleaning', 'done', 'failed')),
    request_count    BIGINT NOT NULL,
    bytes            BIGINT NOT NULL,
    input_file_id    TEXT,
    batch_id         TEXT,
    batch_status     TEXT,
    output_file_id   TEXT,
    error_file_id    TEXT,
    results_url      TEXT,
    batch_errors     TEXT,
    last_error       TEXT,
    not_before       BIGINT NOT NULL DEFAULT 0,
    est_tokens       BIGINT NOT NULL DEFAULT 0,
    cancel_requested BOOLEAN NOT NULL DEFAULT false,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    -- The engine holding the tranche's lease, the token of that one acquisition (transitions
    -- compare it) and when it lapses, in milliseconds of the database's own clock.
    lease_owner      TEXT,
    lease_token      TEXT,
    lease_expires_at BIGINT NOT NULL DEFAULT 0,
    -- The provider account the batch lives on (provider and base URL, never a key).
    account          TEXT,
    answer_check     TEXT
);

CREATE INDEX tranches_live ON tranches (state, not_before) WHERE state NOT IN ('done', 'failed');
CREATE INDEX tranches_by_batch ON tranches (provider, batch_id) WHERE batch_id IS NOT NULL;

-- Request ids are taken from this sequence when a job's writer flushes, a chunk at a time, so
-- that they ascend in input order within a job. (SQLite assigns them after the largest id
-- under its single write lock; here jobs are written concurrently.)
CREATE SEQUENCE request_ids AS BIGINT;

CREATE TABLE requests (
    id            BIGINT PRIMARY KEY,
    job_id        TEXT NOT NULL REFERENCES jobs (id),
    line          BIGINT NOT NULL,
    custom_id     TEXT NOT NULL,
    wire_id       TEXT NOT NULL,
    provider      TEXT NOT NULL,
    endpoint      TEXT NOT NULL,
    model         TEXT NOT NULL,
    wire_bytes    BIGINT NOT NULL,
    input_hash    TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('pending', 'queued', 'succeeded', 'failed', 'cancelled')),
    tranche_id    TEXT REFERENCES tranches (id),
    attempts      BIGINT NOT NULL DEFAULT 0,
    max_attempts  BIGINT NOT NULL,
    -- Times a whole-batch failure returned the request to the pool without spending an attempt.
    batch_returns BIGINT NOT NULL DEFAULT 0,
    -- True when answered from an earlier succeeded result with the same custom_id and input_hash.
    cached        BOOLEAN NOT NULL DEFAULT false,
    est_tokens    BIGINT NOT NULL,
    accepted_at   BIGINT NOT NULL,
    not_before    BIGINT NOT NULL DEFAULT 0,
    error         TEXT,
    input_tokens  BIGINT,
    output_tokens BIGINT,
    finished_at   BIGINT,
    -- The body's byte range in the job's body object (bodies of older jobs: `request_bodies`).
    body_offset   BIGINT,
    body_length   BIGINT,
    -- The answer's byte range in the batch's raw output file (text answers: `request_outputs`).
    output_object TEXT,
    output_offset BIGINT,
    output_length BIGINT,
    -- The job's answer check: an answer is reused only under the same one.
    answer_check  TEXT,
    UNIQUE (job_id, custom_id)
);

ALTER SEQUENCE request_ids OWNED BY requests.id;

CREATE INDEX requests_pending ON requests (provider, endpoint, model, id) WHERE state = 'pending';
CREATE INDEX requests_by_tranche ON requests (tranche_id, wire_id);
CREATE INDEX requests_by_job_state ON requests (job_id, state);
-- Identity look-ups in every state: an earlier answer to reuse, or a twin in flight to wait for.
CREATE INDEX requests_identity ON requests (custom_id, input_hash);
-- Answers reused from earlier requests, found by the raw file they point into.
CREATE INDEX requests_reused_outputs ON requests (output_object) WHERE cached;

CREATE TABLE request_bodies (
    request_id BIGINT PRIMARY KEY REFERENCES requests (id),
    body       TEXT NOT NULL
);

CREATE TABLE request_outputs (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    request_id BIGINT NOT NULL UNIQUE REFERENCES requests (id),
    output     TEXT NOT NULL
);

CREATE TABLE attempts (
    request_id  BIGINT NOT NULL REFERENCES requests (id),
    attempt     BIGINT NOT NULL,
    tranche_id  TEXT NOT NULL REFERENCES tranches (id),
    outcome     TEXT NOT NULL CHECK (outcome IN ('succeeded', 'errored', 'expired', 'cancelled', 'missing')),
    status_code BIGINT,
    error       TEXT,
    created_at  BIGINT NOT NULL,
    -- A request is in a tranche at most once; a whole-batch return does not spend an attempt,
    -- so one attempt number can appear for several tranches.
    PRIMARY KEY (request_id, tranche_id)
);

CREATE TABLE provider_files (
    provider   TEXT NOT NULL,
    file_id    TEXT NOT NULL,
    purpose    TEXT NOT NULL CHECK (purpose IN ('batch_input', 'batch_output', 'batch_error')),
    tranche_id TEXT NOT NULL REFERENCES tranches (id),
    filename   TEXT,
    bytes      BIGINT,
    expires_at BIGINT,
    created_at BIGINT NOT NULL,
    deleted_at BIGINT,
    PRIMARY KEY (provider, file_id)
);

CREATE INDEX provider_files_by_tranche ON provider_files (tranche_id);

-- Every tranche that held a request of a job (a job waits for them to end; status counts them).
CREATE TABLE job_tranches (
    job_id     TEXT NOT NULL REFERENCES jobs (id),
    tranche_id TEXT NOT NULL REFERENCES tranches (id),
    PRIMARY KEY (job_id, tranche_id)
);

CREATE INDEX job_tranches_by_tranche ON job_tranches (tranche_id);

-- Duties that one engine at a time carries out (planning a provider's pool) hold a named lease.
CREATE TABLE leases (
    name       TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    token      TEXT NOT NULL,
    expires_at BIGINT NOT NULL
);

-- Facts every engine of a deployment must agree on, recorded by the first engine.
CREATE TABLE deployment (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- The blob store's objects as recorded once whole: key, size and SHA-256.
CREATE TABLE blob_objects (
    key        TEXT PRIMARY KEY,
    size       BIGINT NOT NULL,
    sha256     TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

-- Answers checked against a job's JSON Schema.
CREATE TABLE answer_checks (
    id           TEXT PRIMARY KEY,
    schema       TEXT NOT NULL,
    lenient_json BOOLEAN NOT NULL,
    created_at   BIGINT NOT NULL
);

-- What each audit of an account's provider files counted.
CREATE TABLE file_audits (
    account               TEXT   NOT NULL,
    at                    BIGINT NOT NULL,
    total                 BIGINT NOT NULL,
    inputs_with_expiry    BIGINT NOT NULL,
    inputs_without_expiry BIGINT NOT NULL
);

CREATE INDEX file_audits_by_account ON file_audits (account, at);

-- Keeps each job's counters true on every change of its requests. Where SQLite runs a trigger
-- per row, this one runs once per statement over the statement's old and new rows, so that a
-- bulk update (a claim, an ingest chunk) touches each job's row once, not once per request.
-- The jobs' rows are locked in id order first, so that two statements touching the same jobs
-- wait for each other instead of deadlocking. Inserts (a new job's requests are all pending,
-- which its writer records when it commits) and deletes (pruning) are not counted.
CREATE FUNCTION requests_keep_job_counters() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM jobs
    WHERE id IN (SELECT n.job_id FROM new_rows AS n JOIN old_rows AS o ON o.id = n.id
                 WHERE n.state IS DISTINCT FROM o.state OR n.cached IS DISTINCT FROM o.cached
                    OR (n.attempts > 1) IS DISTINCT FROM (o.attempts > 1)
                    OR n.input_tokens IS DISTINCT FROM o.input_tokens
                    OR n.output_tokens IS DISTINCT FROM o.output_tokens)
    ORDER BY id FOR NO KEY UPDATE;
    UPDATE jobs AS j SET
        n_pending = j.n_pending + c.pending,
        n_queued = j.n_queued + c.queued,
        n_succeeded = j.n_succeeded + c.succeeded,
        n_failed = j.n_failed + c.failed,
        n_cancelled = j.n_cancelled + c.cancelled,
        n_cached = j.n_cached + c.cached,
        n_retried = j.n_retried + c.retried,
        input_tokens = j.input_tokens + c.input_tokens,
        output_tokens = j.output_tokens + c.output_tokens
    FROM (
        SELECT n.job_id,
               SUM((n.state = 'pending')::int - (o.state = 'pending')::int) AS pending,
               SUM((n.state = 'queued')::int - (o.state = 'queued')::int) AS queued,
               SUM((n.state = 'succeeded')::int - (o.state = 'succeeded')::int) AS succeeded,
               SUM((n.state = 'failed')::int - (o.state = 'failed')::int) AS failed,
               SUM((n.state = 'cancelled')::int - (o.state = 'cancelled')::int) AS cancelled,
               SUM(n.cached::int - o.cached::int) AS cached,
               SUM((n.attempts > 1)::int - (o.attempts > 1)::int) AS retried,
               SUM(COALESCE(n.input_tokens, 0) - COALESCE(o.input_tokens, 0)) AS input_tokens,
               SUM(COALESCE(n.output_tokens, 0) - COALESCE(o.output_tokens, 0)) AS output_tokens
        FROM new_rows AS n JOIN old_rows AS o ON o.id = n.id
        WHERE n.state IS DISTINCT FROM o.state OR n.cached IS DISTINCT FROM o.cached
           OR (n.attempts > 1) IS DISTINCT FROM (o.attempts > 1)
           OR n.input_tokens IS DISTINCT FROM o.input_tokens
           OR n.output_tokens IS DISTINCT FROM o.output_tokens
        GROUP BY n.job_id
    ) AS c
    WHERE j.id = c.job_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER requests_keep_job_counters
AFTER UPDATE ON requests
REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION requests_keep_job_counters();
