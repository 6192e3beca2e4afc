//! Moving a SQLite store into an empty PostgreSQL database (`tranche migrate`): every table is
//! copied in one transaction; the blob store stays where it is, and the copied rows keep naming
//! its objects.

use std::collections::BTreeMap;
use std::path::Path;

use tranche_store::Store;
use tranche_store_postgres::{ImportError, PgStore};
use tranche_store_sqlite::SqliteStore;

use crate::database::Database;
use crate::error::AppError;

/// What a migration copied: rows per table. Printed as JSON: add, never rename.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct MigrationReport {
    pub tables: BTreeMap<String, u64>,
}

/// Copies the SQLite store at `source` (a path or `sqlite:` URL) into the PostgreSQL database
/// at `target` (a `postgres://` or `postgresql://` URL), which must hold no job, no tranche and
/// no tenant. Refused, as bad usage, when the source is not SQLite, the target not PostgreSQL,
/// or the target not empty.
pub async fn migrate_sqlite_to_postgres(
    source: &str,
    target: &str,
) -> Result<MigrationReport, AppError> {
    let Database::Sqlite(location) = Database::parse(source)? else {
        return Err(AppError::Config(
            "the store to migrate from (--db) is already PostgreSQL; migrate moves a SQLite store into PostgreSQL".to_owned(),
        ));
    };
    let Database::Postgres(url) = Database::parse(target).map_err(|_| not_postgres())? else {
        return Err(not_postgres());
    };
    let path = location
        .strip_prefix("sqlite://")
        .or_else(|| location.strip_prefix("sqlite:"))
        .unwrap_or(location);
    if path.is_empty() || path == ":memory:" || !Path::new(path).is_file() {
        return Err(AppError::Config(format!(
            "there is no SQLite store at `{path}` to migrate (set --db or --data-dir)"
        )));
    }
    // Opening brings the source's schema up to the one the copier reads.
    let sqlite = SqliteStore::open(path).await?;
    sqlite.close().await;
    let pg = PgStore::open(url).await?;
    let imported = pg.import_sqlite(Path::new(path)).await;
    pg.close().await;
    match imported {
        Ok(report) => Ok(MigrationReport {
            tables: report.tables.into_iter().map(|(t, n)| (t.to_owned(), n)).collect(),
        }),
        Err(ImportError::Store(e)) => Err(AppError::Store(e)),
        Err(e) => Err(AppError::Config(e.to_string())),
    }
}

fn not_postgres() -> AppError {
    AppError::Config("--to must be a postgres:// or postgresql:// URL".to_owned())
}
