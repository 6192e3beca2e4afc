-- The HTTP server's tenants (SQLite's migration 0016): a name and the token it authenticates
-- with, kept only as the token's SHA-256 hex. A name has at most one unrevoked token; revoking
-- keeps the row, and the name may then be added again with a new token.
CREATE TABLE tenants (
    token_hash TEXT    PRIMARY KEY,
    name       TEXT    NOT NULL,
    admin      BOOLEAN NOT NULL,
    created_at BIGINT  NOT NULL,
    revoked_at BIGINT
);

CREATE UNIQUE INDEX tenants_live_name ON tenants (name) WHERE revoked_at IS NULL;

-- Lists of jobs page newest first by (created_at, id), a tenant's or every job's.
DROP INDEX jobs_by_tenant;
CREATE INDEX jobs_by_tenant ON jobs (tenant, created_at, id) WHERE tenant IS NOT NULL;
CREATE INDEX jobs_by_created ON jobs (created_at, id);
