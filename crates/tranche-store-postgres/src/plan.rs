//! Waiting requests in keyset pages, earlier answers, enqueued tokens, and claims.

use sqlx::Row;
use tranche_core::{JobId, LeaseToken, ProviderKind, Usd};
use tranche_store::rows::{
    day_of, parse, pending_group_from_row, tenant_load_from_row, to_i64, to_u64,
};
use tranche_store::*;

use crate::PgStore;

// Waiting requests are found through `requests_pending`, a partial index (`state =
// 'pending'`). In PostgreSQL a claimed request leaves its entry there, dead, until a vacuum
// removes it, and a scan walks the dead entries to find no live one: after a 100,000-request
// run, reading the groups of waiting requests, with none waiting, touched 829 index pages in
// 28 ms (`EXPLAIN (ANALYZE, BUFFERS)`), and a planning round reads them once and looks for
// earlier answers once more. So both first ask the jobs' counters (which follow every
// committed change) whether any request waits: an uncorrelated `EXISTS`, evaluated once.
#[async_trait::async_trait]
impl PlanStore for PgStore {
    async fn pending_groups(
        &self,
        provider: ProviderKind,
        now: i64,
    ) -> StoreResult<Vec<PendingGroup>> {
        // No check sorts first, as SQLite sorts NULL (PostgreSQL sorts it last by default).
        // Nothing is read while no job has a waiting request (see the note above this `impl`).
        let rows = sqlx::query(
            // Grouped by job first (one pass over the pending index), then by the jobs'
            // tenant: a join per job, not per request. No tenant sorts first too.
            "SELECT g.endpoint, g.model, g.answer_check, j.tenant, SUM(g.n)::bigint, MIN(g.oldest)
             FROM (SELECT job_id, endpoint, model, answer_check, COUNT(*) AS n,
                          MIN(accepted_at) AS oldest
                   FROM requests WHERE state = 'pending' AND provider = $1 AND not_before <= $2
                     AND EXISTS (SELECT 1 FROM jobs WHERE n_pending > 0)
                   GROUP BY job_id, endpoint, model, answer_check) AS g
             JOIN jobs AS j ON j.id = g.job_id
             GROUP BY g.endpoint, g.model, g.answer_check, j.tenant
             ORDER BY g.endpoint, g.model, g.answer_check NULLS FIRST, j.tenant NULLS FIRST",
        )
        .bind(provider.as_str())
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(pending_group_from_row).collect()
    }

    async fn pending_page(
        &self,
        provider: ProviderKind,
        group: Pool<'_>,
        now: i64,
        after: i64,
        limit: u32,
    ) -> StoreResult<Vec<PendingItem>> {
        // Ids are taken from a sequence as jobs are written, several at once: a job that
        // commits after a page passed its ids is found by the next planning round.
        let rows = sqlx::query(
            "SELECT id, wire_bytes, wire_id, est_tokens, job_id, max_cost FROM requests
             WHERE state = 'pending' AND provider = $1 AND endpoint = $2 AND model = $3
               AND id > $4 AND not_before <= $5 AND answer_check IS NOT DISTINCT FROM $6
               AND job_id IN (SELECT id FROM jobs WHERE tenant IS NOT DISTINCT FROM $7)
               AND NOT EXISTS (
                   SELECT 1 FROM requests AS t
                   WHERE t.custom_id = requests.custom_id AND t.input_hash = requests.input_hash
                     AND t.answer_check IS NOT DISTINCT FROM requests.answer_check
                     AND t.job_id <> requests.job_id
                     AND (t.state = 'queued' OR (t.state = 'pending' AND t.id < requests.id)))
             ORDER BY id LIMIT $8",
        )
        .bind(provider.as_str())
        .bind(group.endpoint.as_str())
        .bind(group.model)
        .bind(after)
        .bind(now)
        .bind(group.answer_check)
        .bind(group.tenant)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(PendingItem {
                    request_id: row.try_get(0)?,
                    wire_bytes: to_u64(row.try_get(1)?),
                    wire_id: row.try_get(2)?,
                    est_tokens: to_u64(row.try_get(3)?),
                    job_id: parse("job id", row.try_get(4)?)?,
                    max_cost: row.try_get::<Option<i64>, _>(5)?.map(|c| Usd::from_nanos(to_u64(c))),
                })
            })
            .collect()
    }

    async fn earlier_answers(
        &self,
        provider: ProviderKind,
        after: i64,
        limit: u32,
    ) -> StoreResult<Vec<EarlierAnswer>> {
        // Each waiting request looks its identity up in `requests_identity`; the outer query
        // pages in request id order. Only an answer that passed the same check and is not
        // waiting for review is given. (`NULLS LAST`: SQLite's order of a descending NULL.)
        // Nothing is read while no job has a waiting request (see the note above this `impl`).
        let rows = sqlx::query(
            "SELECT id, answered_by FROM (
                SELECT r.id AS id,
                       (SELECT p.id FROM requests AS p
                        WHERE p.custom_id = r.custom_id AND p.input_hash = r.input_hash
                          AND p.state = 'succeeded' AND NOT p.cached
                          AND p.answer_check IS NOT DISTINCT FROM r.answer_check
                          AND NOT (SELECT j.awaits_review FROM jobs AS j WHERE j.id = p.job_id)
                        ORDER BY p.finished_at DESC NULLS LAST, p.id DESC LIMIT 1) AS answered_by
                FROM requests AS r
                WHERE r.state = 'pending' AND r.provider = $1 AND r.id > $2
                  AND EXISTS (SELECT 1 FROM jobs WHERE n_pending > 0)
                ORDER BY r.id) AS waiting
             WHERE answered_by IS NOT NULL ORDER BY id LIMIT $3",
        )
        .bind(provider.as_str())
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(EarlierAnswer { request_id: row.try_get(0)?, answered_by: row.try_get(1)? })
            })
            .collect()
    }

    async fn answer_from(&self, answers: &[EarlierAnswer], at: i64) -> StoreResult<u64> {
        if answers.is_empty() {
            return Ok(0);
        }
        let (waiting, earlier): (Vec<i64>, Vec<i64>) =
            answers.iter().map(|a| (a.request_id, a.answered_by)).unzip();
        let mut tx = self.begin_write().await?;
        // The waiting requests are locked first (in id order), so that no planner claims one
        // between the statements below: each is answered whole, or left waiting whole.
        sqlx::query(
            "SELECT id FROM requests WHERE id = ANY($1) AND state = 'pending'
             ORDER BY id FOR UPDATE",
        )
        .bind(&waiting)
        .fetch_all(&mut *tx)
        .await?;
        // A waiting request has no output yet (success is terminal), so the outputs copied
        // here mark exactly the requests answered.
        sqlx::query(
            "INSERT INTO request_outputs (request_id, output)
             SELECT t.id, o.output FROM UNNEST($1::bigint[], $2::bigint[]) AS a(waiting, earlier)
             JOIN requests AS t ON t.id = a.waiting AND t.state = 'pending'
             JOIN request_outputs AS o ON o.request_id = a.earlier",
        )
        .bind(&waiting)
        .bind(&earlier)
        .execute(&mut *tx)
        .await?;
        // An output by reference is shared: the answered request points at the same range.
        sqlx::query(
            "UPDATE requests AS t SET output_object = p.output_object,
                    output_offset = p.output_offset, output_length = p.output_length
             FROM UNNEST($1::bigint[], $2::bigint[]) AS a(waiting, earlier)
             JOIN requests AS p ON p.id = a.earlier
             WHERE t.id = a.waiting AND t.state = 'pending' AND p.output_object IS NOT NULL",
        )
        .bind(&waiting)
        .bind(&earlier)
        .execute(&mut *tx)
        .await?;
        // What each answer cost where it was first billed counts as saved for the job that
        // reuses it: the answering request's last attempt, the one that answered. The same
        // requests as the update below (waiting, with an answer copied).
        sqlx::query(concat!(
            "INSERT INTO usage_totals
                (job_id, kind, provider, model, day, requests, input_tokens, cached_input_tokens,
                 cache_write_5m_tokens, cache_write_1h_tokens, output_tokens, reasoning_tokens)
             SELECT t.job_id, 'reused', tr.provider, pa.model, $3, COUNT(*), SUM(pa.input_tokens),
                    SUM(pa.cached_input_tokens), SUM(pa.cache_write_5m_tokens),
                    SUM(pa.cache_write_1h_tokens), SUM(pa.output_tokens), SUM(pa.reasoning_tokens)
             FROM UNNEST($1::bigint[], $2::bigint[]) AS a(waiting, earlier)
             JOIN requests AS t ON t.id = a.waiting AND t.state = 'pending'
             JOIN requests AS p ON p.id = a.earlier
             JOIN attempts AS pa ON pa.request_id = p.id AND pa.tranche_id = p.tranche_id
             JOIN tranches AS tr ON tr.id = pa.tranche_id
             WHERE pa.model IS NOT NULL
               AND (t.output_object IS NOT NULL
                    OR EXISTS (SELECT 1 FROM request_outputs AS o WHERE o.request_id = t.id))
             GROUP BY t.job_id, tr.provider, pa.model
             ON CONFLICT (job_id, kind, provider, model, day) DO UPDATE SET ",
            usage_add!()
        ))
        .bind(&waiting)
        .bind(&earlier)
        .bind(day_of(at))
        .execute(&mut *tx)
        .await?;
        let done = sqlx::query(
            "UPDATE requests SET
                state = 'succeeded', cached = true, finished_at = $1, error = NULL,
                input_tokens = NULL, output_tokens = NULL
             WHERE state = 'pending' AND id = ANY($2)
               AND (output_object IS NOT NULL
                    OR EXISTS (SELECT 1 FROM request_outputs AS o WHERE o.request_id = requests.id))",
        )
        .bind(at)
        .bind(&waiting)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected())
    }

    async fn enqueued_tokens(&self, provider: ProviderKind) -> StoreResult<Vec<(String, u64)>> {
        let rows = sqlx::query(
            "SELECT model, COALESCE(SUM(est_tokens), 0)::bigint FROM tranches
             WHERE provider = $1 AND state IN ('planned', 'uploading', 'uploaded', 'creating', 'submitted')
             GROUP BY model ORDER BY model",
        )
        .bind(provider.as_str())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|row| Ok((row.try_get(0)?, to_u64(row.try_get(1)?)))).collect()
    }

    async fn tenant_loads(&self, provider: ProviderKind) -> StoreResult<Vec<TenantLoad>> {
        let rows = sqlx::query(
            "SELECT tenant, account, model,
                    COALESCE(SUM(CASE WHEN state IN ('planned', 'uploading', 'uploaded', 'creating',
                                                     'submitted')
                                      THEN est_tokens ELSE 0 END), 0)::bigint,
                    COUNT(*)
             FROM tranches WHERE provider = $1 AND state NOT IN ('done', 'failed')
             GROUP BY tenant, account, model
             ORDER BY tenant NULLS FIRST, account, model",
        )
        .bind(provider.as_str())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(tenant_load_from_row).collect()
    }

    async fn job_queued_cost(&self, job: JobId) -> StoreResult<Usd> {
        let nanos: i64 = sqlx::query_scalar(
            "SELECT COALESCE(SUM(max_cost), 0)::bigint FROM requests
             WHERE job_id = $1 AND state = 'queued'",
        )
        .bind(job.to_string())
        .fetch_one(&self.pool)
        .await?;
        Ok(Usd::from_nanos(to_u64(nanos)))
    }

    async fn end_waiting(&self, job: JobId, error: &str, at: i64) -> StoreResult<u64> {
        let mut tx = self.begin_write().await?;
        let done = sqlx::query(
            "UPDATE requests SET state = 'cancelled', error = $1, finished_at = $2,
                    tranche_id = NULL
             WHERE job_id = $3 AND state = 'pending'
               AND NOT EXISTS (
                   SELECT 1 FROM requests AS t
                   WHERE t.custom_id = requests.custom_id AND t.input_hash = requests.input_hash
                     AND t.answer_check IS NOT DISTINCT FROM requests.answer_check
                     AND t.job_id != requests.job_id AND t.state IN ('queued', 'pending'))",
        )
        .bind(error)
        .bind(at)
        .bind(job.to_string())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected())
    }

    async fn create_tranche(
        &self,
        tranche: &NewTranche,
        request_ids: &[i64],
        duty: (&str, LeaseToken),
    ) -> StoreResult<Option<u64>> {
        let mut tx = self.begin_write().await?;
        // The duty's row is share-locked until the claim commits: another engine taking the
        // duty over (an update of that row) waits for it, as it would for SQLite's write lock.
        let held = sqlx::query("SELECT 1 FROM leases WHERE name = $1 AND token = $2 FOR SHARE")
            .bind(duty.0)
            .bind(duty.1.to_string())
            .fetch_optional(&mut *tx)
            .await?;
        if held.is_none() {
            return Ok(None);
        }
        let id = tranche.id.to_string();
        sqlx::query(
            "INSERT INTO tranches (id, provider, account, endpoint, model, answer_check, tenant,
                                   state, request_count, bytes, est_tokens, created_at,
                                   updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'planned', 0, $8, $9, $10, $11)",
        )
        .bind(&id)
        .bind(tranche.provider.as_str())
        .bind(tranche.account.as_str())
        .bind(tranche.endpoint.as_str())
        .bind(&tranche.model)
        .bind(tranche.answer_check.as_deref())
        .bind(tranche.tenant.as_deref())
        .bind(to_i64(tranche.bytes))
        .bind(to_i64(tranche.est_tokens))
        .bind(tranche.created_at)
        .bind(tranche.created_at)
        .execute(&mut *tx)
        .await?;
        // Rows another engine is claiming (or cancelling) right now are skipped, not waited
        // for: they are not pending for this claim, and a request is never claimed twice.
        // `NO KEY UPDATE` is the lock the update takes anyway; unlike `UPDATE` it does not
        // collide with the key-share locks that rows referencing a request hold.
        let claimed = sqlx::query(
            "UPDATE requests SET state = 'queued', tranche_id = $1
             WHERE state = 'pending'
               AND id IN (SELECT id FROM requests WHERE id = ANY($2) AND state = 'pending'
                          ORDER BY id FOR NO KEY UPDATE SKIP LOCKED)",
        )
        .bind(&id)
        .bind(request_ids)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if claimed == 0 {
            // Dropping the transaction rolls the empty tranche back.
            return Ok(Some(0));
        }
        sqlx::query("UPDATE tranches SET request_count = $1 WHERE id = $2")
            .bind(to_i64(claimed))
            .bind(&id)
            .execute(&mut *tx)
            .await?;
        // The claimed requests, found as queued in `requests_by_tranche` (which holds no other).
        sqlx::query(
            "INSERT INTO job_tranches (job_id, tranche_id)
             SELECT DISTINCT job_id, tranche_id FROM requests
             WHERE tranche_id = $1 AND state = 'queued'
             ON CONFLICT DO NOTHING",
        )
        .bind(&id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(claimed))
    }
}
