-- A tranche holds one tenant's requests (NULL: jobs recorded without a tenant), so tenants
-- take turns when planning and each tenant's share of an account's files and enqueued
-- tokens can be capped. A tranche planned before took its requests in id order across
-- tenants; it is given the tenant of its first job.
ALTER TABLE tranches ADD COLUMN tenant TEXT;
UPDATE tranches SET tenant = (
    SELECT j.tenant FROM job_tranches AS jt JOIN jobs AS j ON j.id = jt.job_id
    WHERE jt.tranche_id = tranches.id ORDER BY j.created_at, j.id LIMIT 1);
