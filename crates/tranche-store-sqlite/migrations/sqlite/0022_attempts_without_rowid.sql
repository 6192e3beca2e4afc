-- `attempts` is found only by its key (request, tranche), so it is stored in the key's order
-- without a rowid: one B-tree written per attempt, not a table and its key's index (an
-- ingest of 50,000 successes: 0.14 s to 0.07 s for this insert).
CREATE TABLE attempts_by_key (
    request_id            INTEGER NOT NULL REFERENCES requests (id),
    attempt               INTEGER NOT NULL,
    tranche_id            TEXT NOT NULL REFERENCES tranches (id),
    outcome               TEXT NOT NULL
        CHECK (outcome IN ('succeeded', 'errored', 'expired', 'cancelled', 'missing')),
    status_code           INTEGER,
    error                 TEXT,
    created_at            INTEGER NOT NULL,
    model                 TEXT,
    input_tokens          INTEGER,
    cached_input_tokens   INTEGER,
    cache_write_5m_tokens INTEGER,
    cache_write_1h_tokens INTEGER,
    output_tokens         INTEGER,
    reasoning_tokens      INTEGER,
    -- A request is in a tranche at most once; a whole-batch return does not spend an attempt,
    -- so one attempt number can appear for several tranches.
    PRIMARY KEY (request_id, tranche_id)
) STRICT, WITHOUT ROWID;

INSERT INTO attempts_by_key
    (request_id, attempt, tranche_id, outcome, status_code, error, created_at, model,
     input_tokens, cached_input_tokens, cache_write_5m_tokens, cache_write_1h_tokens,
     output_tokens, reasoning_tokens)
SELECT request_id, attempt, tranche_id, outcome, status_code, error, created_at, model,
       input_tokens, cached_input_tokens, cache_write_5m_tokens, cache_write_1h_tokens,
       output_tokens, reasoning_tokens
FROM attempts
ORDER BY request_id, tranche_id;
DROP TABLE attempts;
ALTER TABLE attempts_by_key RENAME TO attempts;
