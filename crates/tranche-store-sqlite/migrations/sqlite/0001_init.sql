-- tranche's schema: jobs, their requests, the tranches (provider batches) requests travel in,
-- every attempt of every request, and every file uploaded to or created at a provider.

CREATE TABLE jobs (
    id          TEXT PRIMARY KEY,
    provider    TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('pending', 'running', 'done', 'failed', 'cancelled')),
    source      TEXT,
    settings    TEXT NOT NULL,
    accepted    INTEGER NOT NULL,
    last_error  TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    finished_at INTEGER
) STRICT;

CREATE TABLE tranches (
    id             TEXT PRIMARY KEY,
    provider       TEXT NOT NULL,
    endpoint       TEXT NOT NULL,
    model          TEXT NOT NULL,
    state          TEXT NOT NULL CHECK (state IN ('planned', 'uploading', 'uploaded', 'creating',
                       'submitted', 'collecting', 'ingesting', 'cleaning', 'done', 'failed')),
    request_count  INTEGER NOT NULL,
    bytes          INTEGER NOT NULL,
    input_file_id  TEXT,
    batch_id       TEXT,
    batch_status   TEXT,
    output_file_id TEXT,
    error_file_id  TEXT,
    results_url    TEXT,
    batch_errors   TEXT,
    last_error     TEXT,
    not_before     INTEGER NOT NULL DEFAULT 0,
    est_tokens     INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL
) STRICT;

CREATE INDEX tranches_live ON tranches (state, not_before) WHERE state NOT IN ('done', 'failed');

CREATE TABLE requests (
    id            INTEGER PRIMARY KEY,
    job_id        TEXT NOT NULL REFERENCES jobs (id),
    line          INTEGER NOT NULL,
    custom_id     TEXT NOT NULL,
    wire_id       TEXT NOT NULL,
    provider      TEXT NOT NULL,
    endpoint      TEXT NOT NULL,
    model         TEXT NOT NULL,
    body          TEXT NOT NULL,
    wire_bytes    INTEGER NOT NULL,
    input_hash    TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('pending', 'queued', 'succeeded', 'failed', 'cancelled')),
    tranche_id    TEXT REFERENCES tranches (id),
    attempts      INTEGER NOT NULL DEFAULT 0,
    max_attempts  INTEGER NOT NULL,
    -- Times a whole-batch failure returned the request to the pool without spending an attempt.
    batch_returns INTEGER NOT NULL DEFAULT 0,
    -- 1 when answered from an earlier succeeded result with the same custom_id and input_hash.
    cached        INTEGER NOT NULL DEFAULT 0,
    est_tokens    INTEGER NOT NULL,
    accepted_at   INTEGER NOT NULL,
    not_before    INTEGER NOT NULL DEFAULT 0,
    output        TEXT,
    error         TEXT,
    input_tokens  INTEGER,
    output_tokens INTEGER,
    finished_at   INTEGER,
    UNIQUE (job_id, custom_id)
) STRICT;

CREATE INDEX requests_pending ON requests (provider, endpoint, model, id) WHERE state = 'pending';
CREATE INDEX requests_by_tranche ON requests (tranche_id, wire_id);
CREATE INDEX requests_by_job_state ON requests (job_id, state);
CREATE INDEX requests_answers ON requests (custom_id, input_hash) WHERE state = 'succeeded' AND cached = 0;

CREATE TABLE attempts (
    request_id  INTEGER NOT NULL REFERENCES requests (id),
    attempt     INTEGER NOT NULL,
    tranche_id  TEXT NOT NULL REFERENCES tranches (id),
    outcome     TEXT NOT NULL CHECK (outcome IN ('succeeded', 'errored', 'expired', 'cancelled', 'missing')),
    status_code INTEGER,
    error       TEXT,
    created_at  INTEGER NOT NULL,
    -- A request is in a tranche at most once; a whole-batch return does not spend an attempt,
    -- so one attempt number can appear for several tranches.
    PRIMARY KEY (request_id, tranche_id)
) STRICT;

CREATE TABLE provider_files (
    provider   TEXT NOT NULL,
    file_id    TEXT NOT NULL,
    purpose    TEXT NOT NULL CHECK (purpose IN ('batch_input', 'batch_output', 'batch_error')),
    tranche_id TEXT NOT NULL REFERENCES tranches (id),
    filename   TEXT,
    bytes      INTEGER,
    expires_at INTEGER,
    created_at INTEGER NOT NULL,
    deleted_at INTEGER,
    PRIMARY KEY (provider, file_id)
) STRICT;
