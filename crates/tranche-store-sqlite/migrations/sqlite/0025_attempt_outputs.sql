-- An attempt that succeeded keeps where its answer rests in the raw results (object, offset,
-- length), as the request it answered does. An ingest writes each success straight into
-- `attempts`, the row it is kept as, and fills its request from there in one pass in id
-- order; before, each was written to a temporary table first, and then from it to `attempts`
-- and to its request. Older attempts leave these empty.
ALTER TABLE attempts ADD COLUMN output_object TEXT;
ALTER TABLE attempts ADD COLUMN output_offset INTEGER;
ALTER TABLE attempts ADD COLUMN output_length INTEGER;
