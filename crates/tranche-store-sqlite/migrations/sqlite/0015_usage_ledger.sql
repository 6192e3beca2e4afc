-- The usage ledger. Each attempt keeps what the provider billed it for, by kind (the model the
-- answer names; every input token, the part read from the prompt cache, the parts written to it
-- for 5 minutes and 1 hour; every output token and the part spent reasoning). An attempt is one
-- row, keyed by request and tranche, written in the ingest's transaction: re-ingesting or a
-- crash during ingest never counts it twice.
ALTER TABLE attempts ADD COLUMN model TEXT;
ALTER TABLE attempts ADD COLUMN input_tokens INTEGER;
ALTER TABLE attempts ADD COLUMN cached_input_tokens INTEGER;
ALTER TABLE attempts ADD COLUMN cache_write_5m_tokens INTEGER;
ALTER TABLE attempts ADD COLUMN cache_write_1h_tokens INTEGER;
ALTER TABLE attempts ADD COLUMN output_tokens INTEGER;
ALTER TABLE attempts ADD COLUMN reasoning_tokens INTEGER;

-- The same sums by job, kind, provider, model and day (unix seconds of its UTC midnight), kept
-- in the transaction that records the attempts, so that a cost report reads a few rows instead
-- of a job's attempts, and survives pruning. `billed` rows count what providers billed;
-- `reused` rows what requests answered from earlier results would have cost.
CREATE TABLE usage_totals (
    job_id                TEXT    NOT NULL REFERENCES jobs (id),
    kind                  TEXT    NOT NULL CHECK (kind IN ('billed', 'reused')),
    provider              TEXT    NOT NULL,
    model                 TEXT    NOT NULL,
    day                   INTEGER NOT NULL,
    requests              INTEGER NOT NULL,
    input_tokens          INTEGER NOT NULL,
    cached_input_tokens   INTEGER NOT NULL,
    cache_write_5m_tokens INTEGER NOT NULL,
    cache_write_1h_tokens INTEGER NOT NULL,
    output_tokens         INTEGER NOT NULL,
    reasoning_tokens      INTEGER NOT NULL,
    PRIMARY KEY (job_id, kind, provider, model, day)
) STRICT;

CREATE INDEX usage_totals_by_day ON usage_totals (day);

-- The most each request of a job with a budget may cost, in nanodollars: planning admits a
-- request only while the job's bill, its requests in flight and this stay within the budget.
ALTER TABLE requests ADD COLUMN max_cost INTEGER;

-- Answers recorded before the ledger: their requests' totals, under their tranche's model,
-- with no cache split (none was read then).
INSERT INTO usage_totals
SELECT r.job_id, 'billed', t.provider, t.model, r.finished_at - (r.finished_at % 86400),
       COUNT(*), SUM(COALESCE(r.input_tokens, 0)), 0, 0, 0, SUM(COALESCE(r.output_tokens, 0)), 0
FROM requests AS r JOIN tranches AS t ON t.id = r.tranche_id
WHERE r.cached = 0 AND r.finished_at IS NOT NULL
  AND (r.input_tokens IS NOT NULL OR r.output_tokens IS NOT NULL)
GROUP BY r.job_id, t.provider, t.model, r.finished_at - (r.finished_at % 86400);
