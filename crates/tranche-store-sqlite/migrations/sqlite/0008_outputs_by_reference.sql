-- Outputs leave the database too: a succeeded request points at its answer's byte range in the
-- batch's raw output file in the blob store (the provider's response body, exactly as returned).
-- Requests answered before keep their outputs in `request_outputs`.

ALTER TABLE requests ADD COLUMN output_object TEXT;
ALTER TABLE requests ADD COLUMN output_offset INTEGER;
ALTER TABLE requests ADD COLUMN output_length INTEGER;
