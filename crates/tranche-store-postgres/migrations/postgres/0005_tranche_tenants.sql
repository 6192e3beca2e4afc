-- A tranche holds one tenant's requests (SQLite's migration 0018): NULL for jobs recorded
-- without a tenant. A tranche planned before is given the tenant of its first job.
ALTER TABLE tranches ADD COLUMN tenant TEXT;
UPDATE tranches SET tenant = (
    SELECT j.tenant FROM job_tranches AS jt JOIN jobs AS j ON j.id = jt.job_id
    WHERE jt.tranche_id = tranches.id ORDER BY j.created_at, j.id LIMIT 1);
