-- A job whose uploads the provider refuses for a full file storage, with nothing of tranche's in
-- flight to free it, is paused (not failed): the upstream error is kept here until an upload of
-- one of its tranches succeeds again.
ALTER TABLE jobs ADD COLUMN paused_error TEXT;
