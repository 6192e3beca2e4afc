//! Waiting requests in keyset pages, earlier answers, enqueued tokens, and claims.

use sqlx::{Row, SqliteConnection};
use tranche_core::{JobId, LeaseToken, ProviderKind, Usd};
use tranche_store::rows::{StoredRow, day_of, parse, tenant_load_from_row, to_i64, to_u64};
use tranche_store::*;

use crate::SqliteStore;
use crate::keys_off::WriteTx;
use crate::pages::Page;

#[async_trait::async_trait]
impl PlanStore for SqliteStore {
    async fn pending_groups(
        &self,
        provider: ProviderKind,
        now: i64,
    ) -> StoreResult<Vec<PendingGroup>> {
        let mut conn = self.pool.acquire().await?;
        crate::groups::pending_groups(&mut conn, provider, now).await
    }

    async fn pending_page(
        &self,
        provider: ProviderKind,
        group: Pool<'_>,
        now: i64,
        after: i64,
        limit: u32,
    ) -> StoreResult<Vec<PendingItem>> {
        // The page comes back as one JSON value (`pages`), not row by row. See [`PENDING_PAGE`].
        let row = sqlx::query(PENDING_PAGE)
            .bind(provider.as_str())
            .bind(group.endpoint.as_str())
            .bind(group.model)
            .bind(after)
            .bind(now)
            .bind(group.answer_check)
            .bind(group.tenant)
            .bind(i64::from(limit))
            .fetch_one(&self.pool)
            .await?;
        Page::from_row(&row, 0)?
            .rows
            .iter()
            .map(|row| {
                Ok(PendingItem {
                    request_id: row.int_at(0)?,
                    wire_bytes: to_u64(row.int_at(1)?),
                    wire_id: row.text_at(2)?,
                    est_tokens: to_u64(row.int_at(3)?),
                    job_id: parse("job id", &row.text_at(4)?)?,
                    max_cost: row.opt_int_at(5)?.map(|c| Usd::from_nanos(to_u64(c))),
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
        // Each waiting request looks its custom id up in the unique key `(custom_id, job_id)`,
        // checking the input hash on the rows it finds; the outer query pages in request id
        // order. Only an answer that passed the same check and is not waiting for review is
        // given. An answer is another job's (in its own job a custom id names the waiting
        // request itself): said in the key's own column, a request whose custom id no other
        // job holds is passed over in the key, without reading its row (100,000 waiting
        // requests of a new database looked up in 0.09 s against 0.13, Python's sqlite3 on a
        // copy of a run's database, 3 alternating pairs). See [`EARLIER_ANSWERS`].
        let rows = sqlx::query(EARLIER_ANSWERS)
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
        let pairs: Vec<[i64; 2]> = answers.iter().map(|a| [a.request_id, a.answered_by]).collect();
        let pairs = crate::json_list("answer pairs", &pairs)?;
        let mut tx = self.begin_write().await?;
        // A waiting request has no output yet (success is terminal), so the outputs copied
        // here mark exactly the requests answered.
        sqlx::query(
            "INSERT INTO request_outputs (request_id, output)
             SELECT t.id, o.output FROM json_each(?) AS j
             JOIN requests AS t ON t.id = json_extract(j.value, '$[0]') AND t.state = 'pending'
             JOIN request_outputs AS o ON o.request_id = json_extract(j.value, '$[1]')",
        )
        .bind(&pairs)
        .execute(&mut *tx)
        .await?;
        // An output by reference is shared: the answered request points at the same range.
        for answer in answers {
            sqlx::query(
                "UPDATE requests AS t SET output_object = p.output_object,
                        output_offset = p.output_offset, output_length = p.output_length
                 FROM requests AS p
                 WHERE t.id = ? AND p.id = ? AND t.state = 'pending' AND p.output_object IS NOT NULL",
            )
            .bind(answer.request_id)
            .bind(answer.answered_by)
            .execute(&mut *tx)
            .await?;
        }
        // What each answer cost where it was first billed counts as saved for the job that
        // reuses it: the answering request's last attempt, the one that answered. The same
        // requests as the update below (waiting, with an answer copied).
        sqlx::query(concat!(
            "INSERT INTO usage_totals
                (job_id, kind, provider, model, day, requests, input_tokens, cached_input_tokens,
                 cache_write_5m_tokens, cache_write_1h_tokens, output_tokens, reasoning_tokens)
             SELECT t.job_id, 'reused', tr.provider, a.model, ?, COUNT(*), SUM(a.input_tokens),
                    SUM(a.cached_input_tokens), SUM(a.cache_write_5m_tokens),
                    SUM(a.cache_write_1h_tokens), SUM(a.output_tokens), SUM(a.reasoning_tokens)
             FROM json_each(?) AS j
             JOIN requests AS t ON t.id = json_extract(j.value, '$[0]') AND t.state = 'pending'
             JOIN requests AS p ON p.id = json_extract(j.value, '$[1]')
             JOIN attempts AS a ON a.request_id = p.id AND a.tranche_seq = p.tranche_seq
             JOIN tranches AS tr ON tr.seq = a.tranche_seq
             WHERE a.model IS NOT NULL
               AND (t.output_object IS NOT NULL
                    OR EXISTS (SELECT 1 FROM request_outputs AS o WHERE o.request_id = t.id))
             GROUP BY t.job_id, tr.provider, a.model
             ON CONFLICT (job_id, kind, provider, model, day) DO UPDATE SET ",
            usage_add!()
        ))
        .bind(day_of(at))
        .bind(&pairs)
        .execute(&mut *tx)
        .await?;
        let done = sqlx::query(
            "UPDATE requests SET recount = 0,
                state = 'succeeded', cached = 1, finished_at = ?, error = NULL,
                input_tokens = NULL, output_tokens = NULL
             WHERE state = 'pending'
               AND id IN (SELECT json_extract(value, '$[0]') FROM json_each(?))
               AND (output_object IS NOT NULL
                    OR EXISTS (SELECT 1 FROM request_outputs AS o WHERE o.request_id = requests.id))",
        )
        .bind(at)
        .bind(&pairs)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected())
    }

    async fn enqueued_tokens(&self, provider: ProviderKind) -> StoreResult<Vec<(String, u64)>> {
        let rows = sqlx::query(
            "SELECT model, COALESCE(SUM(est_tokens), 0) FROM tranches
             WHERE provider = ? AND state IN ('planned', 'uploading', 'uploaded', 'creating', 'submitted')
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
                                      THEN est_tokens ELSE 0 END), 0),
                    COUNT(*)
             FROM tranches WHERE provider = ? AND state NOT IN ('done', 'failed')
             GROUP BY tenant, account, model ORDER BY tenant, account, model",
        )
        .bind(provider.as_str())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(tenant_load_from_row).collect()
    }

    async fn job_queued_cost(&self, job: JobId) -> StoreResult<Usd> {
        let nanos: i64 = sqlx::query_scalar(
            // A queued request rests in a live tranche: the job's live tranches are searched
            // through `requests_by_tranche`, not all of the job's requests.
            "SELECT COALESCE(SUM(r.max_cost), 0)
             FROM job_tranches AS j JOIN tranches AS t ON t.id = j.tranche_id
                  CROSS JOIN requests AS r ON r.tranche_seq = t.seq
             WHERE j.job_id = ?1 AND t.state NOT IN ('done', 'failed')
               AND r.job_id = ?1 AND r.state = 'queued'",
        )
        .bind(job.to_string())
        .fetch_one(&self.pool)
        .await?;
        Ok(Usd::from_nanos(to_u64(nanos)))
    }

    async fn end_waiting(&self, job: JobId, error: &str, at: i64) -> StoreResult<u64> {
        let mut tx = self.begin_write().await?;
        if !crate::has_pending(&mut tx, job).await? {
            return Ok(0);
        }
        let done = sqlx::query(concat!(
            "UPDATE requests SET recount = 0, state = 'cancelled', error = ?2, finished_at = ?3,
                    tranche_seq = NULL
             WHERE state = 'pending'
               AND NOT EXISTS (
                   SELECT 1 FROM requests AS t
                   WHERE t.custom_id = requests.custom_id AND t.input_hash = requests.input_hash
                     AND t.answer_check IS requests.answer_check AND t.job_id != requests.job_id
                     AND t.state IN ('queued', 'pending'))
               AND ",
            job_rows!()
        ))
        .bind(job.to_string())
        .bind(error)
        .bind(at)
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
        // Every key this transaction writes holds by construction: its requests are claimed
        // into the tranche it inserts, and its jobs are read from `jobs`. Checked row by row,
        // the keys took 40% of a claim's time (`keys_off.rs`).
        let mut tx = WriteTx::begin_unchecked(&self.pool, self.in_memory).await?;
        let claimed = claim_into(tx.conn(), tranche, request_ids, duty).await?;
        // A refused or empty claim leaves nothing behind, not even its tranche.
        match claimed {
            Some(n) if n > 0 => tx.commit().await?,
            _ => tx.rollback().await?,
        }
        Ok(claimed)
    }
}

/// [`PlanStore::create_tranche`]'s writes, inside the write transaction of `tx`: `None` when
/// the planner's lease is not held, else how many requests it claimed (none: it is to be
/// rolled back).
async fn claim_into(
    tx: &mut SqliteConnection,
    tranche: &NewTranche,
    request_ids: &[i64],
    duty: (&str, LeaseToken),
) -> StoreResult<Option<u64>> {
    let held = sqlx::query("SELECT 1 FROM leases WHERE name = ? AND token = ?")
        .bind(duty.0)
        .bind(duty.1.to_string())
        .fetch_optional(&mut *tx)
        .await?;
    if held.is_none() {
        return Ok(None);
    }
    let id = tranche.id.to_string();
    // The tranche's number, by which its requests and attempts name it: one past the
    // highest, taken under the write lock.
    let seq: i64 = sqlx::query_scalar(
        "INSERT INTO tranches (id, seq, provider, account, endpoint, model, answer_check,
                               tenant, state, request_count, bytes, est_tokens, created_at,
                               updated_at)
         VALUES (?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM tranches), ?, ?, ?, ?, ?, ?,
                 'planned', 0, ?, ?, ?, ?)
         RETURNING seq",
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
    .fetch_one(&mut *tx)
    .await?;
    // The claimed requests' jobs are counted once each below, not once per request: the
    // claim does not set `recount`, so the counter trigger is not part of it.
    let claimed = claim(tx, seq, request_ids).await?;
    if claimed == 0 {
        return Ok(Some(0));
    }
    let jobs = match sole_job(tx, request_ids).await? {
        Some(job) => {
            sqlx::query(
                "UPDATE jobs SET n_pending = n_pending - ?1, n_queued = n_queued + ?1
                 WHERE id = ?2",
            )
            .bind(to_i64(claimed))
            .bind(&job)
            .execute(&mut *tx)
            .await?;
            vec![job]
        }
        None => count_by_job(tx, seq).await?,
    };
    sqlx::query("UPDATE tranches SET request_count = ? WHERE id = ?")
        .bind(to_i64(claimed))
        .bind(&id)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT OR IGNORE INTO job_tranches (job_id, tranche_id)
         SELECT value, ? FROM json_each(?)",
    )
    .bind(&id)
    .bind(crate::json_list("job ids", &jobs)?)
    .execute(&mut *tx)
    .await?;
    Ok(Some(claimed))
}

/// A page of a group's waiting requests after an id, in id order, as one JSON value (binds:
/// provider, endpoint, model, the id, now, answer check, tenant, how many).
///
/// A request whose twin (another job's request with the same custom id, input hash and answer
/// check) is in flight, or waits with a lower id, is held back: it is answered from the twin's
/// result, or sent once the twin has failed. That is a lookup in the custom-id key a request.
/// While fewer than two jobs have a request waiting or in a batch (`jobs_in_flight`, migration
/// `0030`, asked once a statement), no request has a twin to wait for and the lookups are
/// skipped: 100,000 waiting requests of one job in 0.10 s against 0.16 (Python's sqlite3 on a
/// copy of a run's database, 3 alternating runs).
const PENDING_PAGE: &str = concat!(
    "SELECT json_group_array(json_array(id, wire_bytes, wire_id, est_tokens, job_id,
                                        max_cost)),
           MAX(id), COUNT(*)
    FROM (SELECT id, wire_bytes, wire_id, est_tokens, job_id, max_cost FROM requests
          WHERE state = 'pending' AND provider = ? AND endpoint = ? AND model = ?
            AND id > ? AND not_before <= ? AND answer_check IS ?
            AND job_id IN (SELECT id FROM jobs WHERE tenant IS ?)
            AND ((SELECT COUNT(*) FROM (SELECT 1 FROM jobs WHERE ",
    jobs_in_flight!(),
    " LIMIT 2)) < 2
                 OR NOT EXISTS (
                     SELECT 1 FROM requests AS t
                     WHERE t.custom_id = requests.custom_id
                       AND t.input_hash = requests.input_hash
                       AND t.answer_check IS requests.answer_check
                       AND t.job_id != requests.job_id
                       AND (t.state = 'queued' OR (t.state = 'pending' AND t.id < requests.id))))
          ORDER BY id LIMIT ?)"
);

/// The waiting requests of a provider (after an id) that an earlier answer of another job can
/// answer, each with that answer's request, in id order (binds: the provider, the id, how many).
///
/// No answer is looked for while no job has a success (the counters follow every committed
/// change), so a store's first job does not look its requests up one by one: 10,000 waiting
/// requests in 1 ms against 10 (SQLite's shell). The test is a scalar subquery, which SQLite
/// evaluates once: written as `EXISTS`, the bundled SQLite walked every request by rowid
/// instead of the waiting ones through `requests_pending`, and a 100,000-request run spent 0.81
/// s in this statement against 0.14 (`earlier_answers_walk_only_waiting_requests` holds the
/// plan).
const EARLIER_ANSWERS: &str = "SELECT id, answered_by FROM (
        SELECT r.id AS id,
               (SELECT p.id FROM requests AS p
                WHERE p.custom_id = r.custom_id AND p.job_id != r.job_id
                  AND p.input_hash = r.input_hash
                  AND p.state = 'succeeded' AND p.cached = 0
                  AND p.answer_check IS r.answer_check
                  AND (SELECT j.awaits_review FROM jobs AS j WHERE j.id = p.job_id) = 0
                ORDER BY p.finished_at DESC, p.id DESC LIMIT 1) AS answered_by
        FROM requests AS r
        WHERE r.state = 'pending' AND r.provider = ? AND r.id > ?
          AND (SELECT 1 FROM jobs WHERE n_succeeded > 0 LIMIT 1) IS NOT NULL
        ORDER BY r.id)
     WHERE answered_by IS NOT NULL LIMIT ?";

/// Most runs of consecutive ids a claim takes one range at a time; more, and it takes the ids
/// as one list.
const CLAIM_RUNS: usize = 32;

/// Moves the waiting requests among `ids` into the tranche numbered `seq`; returns how many.
///
/// A tranche's ids nearly always form a few runs of consecutive ids (a plan takes waiting
/// requests in id order), and each run is claimed as a range of rowids: every id of a run is
/// one of `ids`, so that is the same set. Taking 50,000 ids from a JSON list instead builds
/// them into a temporary index first (SQLite's shell: 0.32 s of CPU against 0.19). Scattered
/// ids (requests sent again) go as the list.
///
/// `OR FAIL`: a claim that stops halfway fails with its transaction, so SQLite need not keep a
/// statement journal to undo it alone (85 MB a tranche of 50,000; see migration `0026`).
async fn claim(tx: &mut SqliteConnection, seq: i64, ids: &[i64]) -> StoreResult<u64> {
    let runs = id_runs(ids);
    if runs.len() > CLAIM_RUNS {
        let ids = crate::json_list("request ids", ids)?;
        let claimed = sqlx::query(
            "UPDATE OR FAIL requests SET state = 'queued', tranche_seq = ?
             WHERE state = 'pending' AND id IN (SELECT value FROM json_each(?))",
        )
        .bind(seq)
        .bind(ids)
        .execute(&mut *tx)
        .await?;
        return Ok(claimed.rows_affected());
    }
    let mut claimed = 0;
    for (first, last) in runs {
        claimed += sqlx::query(
            "UPDATE OR FAIL requests SET state = 'queued', tranche_seq = ?
             WHERE state = 'pending' AND id BETWEEN ? AND ?",
        )
        .bind(seq)
        .bind(first)
        .bind(last)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    }
    Ok(claimed)
}

/// The job every one of `ids` belongs to, when one job's id range holds them all and that
/// range holds its requests alone (as many ids as the job accepted: a job's writer numbers
/// its requests in one run, migration `0029`); `None` when the ids span jobs, or the job's
/// range may hold another's (a job accepted before its range was kept, whose ids interleaved).
/// A tranche nearly always takes one job's requests: it is then counted from the ids planned,
/// not from its rows read again (14 VM steps and a read of the tranche's row pages a request).
async fn sole_job(tx: &mut SqliteConnection, ids: &[i64]) -> StoreResult<Option<String>> {
    let (Some(&first), Some(&last)) = (ids.iter().min(), ids.iter().max()) else {
        return Ok(None);
    };
    Ok(sqlx::query_scalar(
        "SELECT j.id FROM requests AS r JOIN jobs AS j ON j.id = r.job_id
         WHERE r.id = ?1 AND j.first_request <= ?1 AND j.last_request >= ?2
           AND j.last_request - j.first_request + 1 = j.accepted",
    )
    .bind(first)
    .bind(last)
    .fetch_optional(&mut *tx)
    .await?)
}

/// Counts the requests claimed into the tranche numbered `seq` by job, moving each job's
/// counters; returns the jobs.
///
/// The claimed rows are found again through `requests_by_tranche`, once, to count them by
/// job; the jobs counted are the tranche's, linked to it without a second walk of its rows
/// (which read 25 MB of a 100,000-request run's pages again). In wire-id order, so at random
/// among the rows when keys do not follow input order (0.45 s of a 100,000-request run with
/// such keys). Read by id instead, in id order, they took 0.04 s, but those runs peaked about
/// 2 MB higher, at 10,000 requests as at 100,000; one binary's peak has since been seen to
/// move as much between sittings, so that wants measuring again over many interleaved runs.
async fn count_by_job(tx: &mut SqliteConnection, seq: i64) -> StoreResult<Vec<String>> {
    Ok(sqlx::query_scalar(
        "UPDATE jobs SET n_pending = n_pending - c.n, n_queued = n_queued + c.n
         FROM (SELECT job_id, COUNT(*) AS n FROM requests
               WHERE tranche_seq = ? AND state = 'queued' GROUP BY job_id) AS c
         WHERE jobs.id = c.job_id
         RETURNING jobs.id",
    )
    .bind(seq)
    .fetch_all(&mut *tx)
    .await?)
}

/// `ids` as runs of consecutive ids, each its first and last, in id order (repeats ignored).
fn id_runs(ids: &[i64]) -> Vec<(i64, i64)> {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut runs: Vec<(i64, i64)> = Vec::new();
    for id in sorted {
        match runs.last_mut() {
            Some((_, last)) if *last + 1 == id => *last = id,
            _ => runs.push((id, id)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The earlier-answer lookup walks the waiting requests of a provider through
    /// `requests_pending`, never every request by rowid, and looks each custom id up in the
    /// unique key.
    #[tokio::test]
    async fn earlier_answers_walk_only_waiting_requests() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("t.db").to_string_lossy()).await.unwrap();
        let plan = crate::query_plans::plan_of(&store, EARLIER_ANSWERS, &[1, 0, 10]).await;
        let walks: Vec<&String> = plan.iter().filter(|step| step.contains(" r ")).collect();
        assert_eq!(walks, ["SEARCH r USING INDEX requests_pending (provider=?)"], "{plan:?}");
        assert!(
            plan.iter().any(
                |step| step == "SEARCH p USING INDEX sqlite_autoindex_requests_1 (custom_id=?)"
            ),
            "{plan:?}"
        );
    }

    /// A page of waiting requests asks `jobs_in_flight` whether a second job has a request in
    /// flight (a few index entries, not every job the store keeps) before it looks a request's
    /// twin up in the custom-id key.
    #[tokio::test]
    async fn a_page_asks_the_jobs_in_flight_before_looking_for_twins() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("t.db").to_string_lossy()).await.unwrap();
        let plan = crate::query_plans::plan_of(&store, PENDING_PAGE, &[1, 1, 1, 0, 0, 1, 1, 10]);
        let plan = plan.await;
        assert!(plan.iter().any(|step| step == "SCAN jobs USING INDEX jobs_in_flight"), "{plan:?}");
        assert!(
            plan.iter().any(
                |step| step == "SEARCH t USING INDEX sqlite_autoindex_requests_1 (custom_id=?)"
            ),
            "{plan:?}"
        );
    }

    /// A claim's ids are one job's when that job's range holds them all and holds its requests
    /// alone; ids of two jobs, or a range that may hold another job's requests (more ids than
    /// the job accepted, as a job accepted before ranges were kept may have), are counted from
    /// the rows instead.
    #[tokio::test]
    async fn a_claim_is_one_jobs_only_when_its_range_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("t.db").to_string_lossy()).await.unwrap();
        let a = conformance::add_job(&store, 3, "m").await.to_string();
        let b = conformance::add_job(&store, 2, "m").await.to_string();
        let sole = |ids: &'static [i64]| {
            let store = &store;
            async move {
                let mut tx = store.begin_write().await.unwrap();
                sole_job(&mut tx, ids).await.unwrap()
            }
        };
        assert_eq!(sole(&[1, 2, 3]).await, Some(a.clone()));
        assert_eq!(sole(&[3, 1]).await, Some(a.clone()), "in any order");
        assert_eq!(sole(&[4, 5]).await, Some(b.clone()));
        assert_eq!(sole(&[2, 3, 4]).await, None, "two jobs");
        assert_eq!(sole(&[]).await, None);
        sqlx::query("UPDATE jobs SET last_request = 5 WHERE id = ?")
            .bind(&a)
            .execute(&store.pool)
            .await
            .unwrap();
        assert_eq!(sole(&[1, 2]).await, None, "a range wider than the job's requests");
    }

    /// Consecutive ids make one run; a gap starts another; order and repeats do not matter.
    #[test]
    fn ids_fall_into_runs_of_consecutive_ids() {
        assert_eq!(id_runs(&[]), []);
        assert_eq!(id_runs(&[7]), [(7, 7)]);
        assert_eq!(id_runs(&[1, 2, 3, 4]), [(1, 4)]);
        assert_eq!(id_runs(&[9, 3, 1, 2, 2, 10, 5]), [(1, 3), (5, 5), (9, 10)]);
    }
}
