-- The HTTP server's tenants: a name (the same namespace as a job's `tenant`, which jobs
-- already record) and the token it authenticates with, kept only as the SHA-256 hex of the
-- token, never the token itself. A name has at most one unrevoked token; revoking keeps the row
-- (who had access, and until when), and the name may then be added again with a new token.
CREATE TABLE tenants (
    token_hash TEXT    PRIMARY KEY,
    name       TEXT    NOT NULL,
    admin      INTEGER NOT NULL CHECK (admin IN (0, 1)),
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
) STRICT;

CREATE UNIQUE INDEX tenants_live_name ON tenants (name) WHERE revoked_at IS NULL;

-- Lists of jobs page newest first by (created_at, id), a tenant's or every job's: one index
-- for each, whose last column breaks ties so that a page starts exactly after its cursor.
DROP INDEX jobs_by_tenant;
CREATE INDEX jobs_by_tenant ON jobs (tenant, created_at, id) WHERE tenant IS NOT NULL;
CREATE INDEX jobs_by_created ON jobs (created_at, id);
