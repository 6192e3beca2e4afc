//! For tests: the plan SQLite takes for a statement, so that a test can hold a hot statement
//! to the index it must walk (the planner's choice can change with a new SQLite or a new
//! index, and a slow plan gives the same answers).

use sqlx::Row;

use crate::SqliteStore;

/// The steps of SQLite's plan for `statement` (`EXPLAIN QUERY PLAN`'s `detail` column), its
/// parameters bound with `binds`.
pub(crate) async fn plan_of(store: &SqliteStore, statement: &str, binds: &[i64]) -> Vec<String> {
    let explain = format!("EXPLAIN QUERY PLAN {statement}");
    let mut query = sqlx::query(sqlx::AssertSqlSafe(explain));
    for bind in binds {
        query = query.bind(*bind);
    }
    let rows = query.fetch_all(&store.pool).await.unwrap_or_else(|e| panic!("{e}: {statement}"));
    rows.iter().map(|row| row.get(3)).collect()
}
