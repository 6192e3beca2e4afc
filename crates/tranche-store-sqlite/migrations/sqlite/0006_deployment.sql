-- Facts every engine of a deployment must agree on, recorded by the first engine: the blob
-- store its bytes rest in. An engine started with another refuses to run.

CREATE TABLE deployment (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;
