-- The blob store's objects as recorded once whole: key, size and SHA-256. An object is recorded
-- only after it is complete (a job's body object in the job's own transaction), so a reference
-- never points at a partial object, and a raw file is read only while it still has the size it
-- was recorded with.

CREATE TABLE blob_objects (
    key        TEXT PRIMARY KEY,
    size       INTEGER NOT NULL,
    sha256     TEXT NOT NULL,
    created_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
