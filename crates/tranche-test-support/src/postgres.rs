//! A scratch PostgreSQL database per test, created on the server `TRANCHE_TEST_POSTGRES` names
//! (default: the local one, `postgres://postgres@127.0.0.1:5432/test`) and dropped, with
//! whatever still connects to it, when its guard drops.

use std::sync::Arc;

use sqlx::{AssertSqlSafe, Connection, PgConnection};
use tranche_store::Store;

/// The server the checks run on, as a URL of a database that exists (any will do: it is only
/// used to create and drop the scratch ones).
fn admin_url() -> String {
    std::env::var("TRANCHE_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// `url` with its database replaced by `database`.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, None), |(b, q)| (b, Some(q)));
    let (scheme, rest) = base.split_once("://").expect("a postgres:// URL");
    let host = rest.split_once('/').map_or(rest, |(host, _)| host);
    match query {
        Some(query) => format!("{scheme}://{host}/{database}?{query}"),
        None => format!("{scheme}://{host}/{database}"),
    }
}

/// A scratch database: dropped (with whatever still connects to it) when the test ends.
#[derive(Debug)]
pub struct Scratch {
    name: String,
    /// The URL of the database.
    pub url: String,
    /// Stores open on it, closed before it is dropped.
    pub stores: Vec<Arc<dyn Store>>,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Drop cannot await: the store's pool is closed on the check's own runtime (its
        // connections belong to it), and the database dropped from a thread with a runtime of
        // its own.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            for store in &self.stores {
                tokio::task::block_in_place(|| handle.block_on(store.close()));
            }
        }
        let name = self.name.clone();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async {
                let mut admin = PgConnection::connect(&admin_url()).await?;
                // The name is ours, made of [a-z0-9_] only (see `scratch`); PostgreSQL cannot
                // bind an identifier.
                let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                sqlx::query(AssertSqlSafe(sql)).execute(&mut admin).await?;
                admin.close().await
            })?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            warn_left_behind(&self.name);
        }
    }
}

/// A scratch database that could not be dropped is left behind; the check itself stands.
fn warn_left_behind(name: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "could not drop the scratch database {name}");
}

/// A new, empty scratch database, with no store open on it yet.
pub async fn scratch() -> Scratch {
    let name = format!("tranche_t_{}", uuid::Uuid::now_v7().simple());
    assert!(name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
    let admin = admin_url();
    let mut conn = PgConnection::connect(&admin).await.unwrap();
    sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut conn).await.unwrap();
    conn.close().await.unwrap();
    let url = with_database(&admin, &name);
    Scratch { name, url, stores: Vec::new() }
}
