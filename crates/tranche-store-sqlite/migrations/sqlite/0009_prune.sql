-- Retention: a pruned job keeps its row (counts, token totals, settings) and loses its requests.
-- `pruned_at` is set once its request rows are gone, `bytes_pruned_at` once the bytes no other
-- job needs are gone from the blob store (a prune that stopped between the two is finished by
-- the next). Answers reused from earlier requests are found by the object they point into, so
-- that a raw file is kept while any job still reads from it; only reused rows are indexed.

ALTER TABLE jobs ADD COLUMN pruned_at INTEGER;
ALTER TABLE jobs ADD COLUMN bytes_pruned_at INTEGER;

CREATE INDEX jobs_prunable ON jobs (finished_at) WHERE bytes_pruned_at IS NULL;
CREATE INDEX requests_reused_outputs ON requests (output_object) WHERE cached = 1;
