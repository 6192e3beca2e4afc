-- Many engines on one store take turns through leases. A tranche's lease names the engine that
-- holds it (`lease_owner`, shown by `status`), a token unique to that one acquisition
-- (`lease_token`: transitions of the tranche compare it, so a step whose lease passed to another
-- engine changes nothing) and when it lapses, in milliseconds of the database's own clock.
-- Duties that one engine at a time carries out (planning a provider's pool into tranches) hold
-- a named lease in `leases`.

ALTER TABLE tranches ADD COLUMN lease_owner TEXT;
ALTER TABLE tranches ADD COLUMN lease_token TEXT;
ALTER TABLE tranches ADD COLUMN lease_expires_at INTEGER NOT NULL DEFAULT 0;

CREATE TABLE leases (
    name       TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    token      TEXT NOT NULL,
    expires_at INTEGER NOT NULL
) STRICT;
