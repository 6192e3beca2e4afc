-- A job records its tenant (the HTTP server's tenants and the CLI's `--tenant` are one
-- namespace); a tranche records the provider account its batch lives on (provider and base URL,
-- never a key), so that an engine steps only tranches of accounts it has credentials for.
-- Tranches made before this migration have no account: any engine of their provider steps them.

ALTER TABLE jobs ADD COLUMN tenant TEXT;
UPDATE jobs SET tenant = json_extract(settings, '$.tenant') WHERE json_valid(settings);
CREATE INDEX jobs_by_tenant ON jobs (tenant, created_at) WHERE tenant IS NOT NULL;

ALTER TABLE tranches ADD COLUMN account TEXT;
