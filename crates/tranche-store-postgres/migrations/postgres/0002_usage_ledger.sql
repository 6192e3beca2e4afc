-- The usage ledger (SQLite's migration 0015). Each attempt keeps what the provider billed it
-- for, by kind; an attempt is one row keyed by request and tranche, written in the ingest's
-- transaction, so re-ingesting or a crash during ingest never counts it twice.
ALTER TABLE attempts ADD COLUMN model TEXT;
ALTER TABLE attempts ADD COLUMN input_tokens BIGINT;
ALTER TABLE attempts ADD COLUMN cached_input_tokens BIGINT;
ALTER TABLE attempts ADD COLUMN cache_write_5m_tokens BIGINT;
ALTER TABLE attempts ADD COLUMN cache_write_1h_tokens BIGINT;
ALTER TABLE attempts ADD COLUMN output_tokens BIGINT;
ALTER TABLE attempts ADD COLUMN reasoning_tokens BIGINT;

-- The same sums by job, kind, provider, model and day (unix seconds of its UTC midnight), kept
-- in the transaction that records the attempts; they survive pruning. `billed` rows count what
-- providers billed; `reused` rows what requests answered from earlier results would have cost.
CREATE TABLE usage_totals (
    job_id                TEXT   NOT NULL REFERENCES jobs (id),
    kind                  TEXT   NOT NULL CHECK (kind IN ('billed', 'reused')),
    provider              TEXT   NOT NULL,
    model                 TEXT   NOT NULL,
    day                   BIGINT NOT NULL,
    requests              BIGINT NOT NULL,
    input_tokens          BIGINT NOT NULL,
    cached_input_tokens   BIGINT NOT NULL,
    cache_write_5m_tokens BIGINT NOT NULL,
    cache_write_1h_tokens BIGINT NOT NULL,
    output_tokens         BIGINT NOT NULL,
    reasoning_tokens      BIGINT NOT NULL,
    PRIMARY KEY (job_id, kind, provider, model, day)
);

CREATE INDEX usage_totals_by_day ON usage_totals (day);

-- The most each request of a job with a budget may cost, in nanodollars.
ALTER TABLE requests ADD COLUMN max_cost BIGINT;

-- Answers recorded before the ledger: their requests' totals, under their tranche's model.
INSERT INTO usage_totals
SELECT r.job_id, 'billed', t.provider, t.model, r.finished_at - (r.finished_at % 86400),
       COUNT(*), SUM(COALESCE(r.input_tokens, 0)), 0, 0, 0, SUM(COALESCE(r.output_tokens, 0)), 0
FROM requests AS r JOIN tranches AS t ON t.id = r.tranche_id
WHERE NOT r.cached AND r.finished_at IS NOT NULL
  AND (r.input_tokens IS NOT NULL OR r.output_tokens IS NOT NULL)
GROUP BY r.job_id, t.provider, t.model, r.finished_at - (r.finished_at % 86400);
