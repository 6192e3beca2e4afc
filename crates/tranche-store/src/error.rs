//! The store's error type, shared by every backend. Backends speak SQL through sqlx, so its
//! error type is carried as it is; which of its codes mean "another engine has the database"
//! is decided here for every backend.

/// What went wrong talking to the database.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("cannot open the database at `{location}`: {source}")]
    Open {
        location: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("cannot create the folder for the database at `{location}`: {source}")]
    CreateDir {
        location: String,
        #[source]
        source: std::io::Error,
    },
    #[error("database migration failed: {0}")]
    Migrate(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("the database holds a value tranche cannot read: {0}")]
    Corrupt(String),
    /// Requests of one job repeat a custom id (the store's unique key finds them, so that
    /// no list of every id seen has to be kept in memory).
    #[error("{} request(s) repeat a custom id of their job", .0.len())]
    DuplicateCustomIds(Vec<DuplicateCustomId>),
}

impl StoreError {
    /// Whether the database was busy or locked by another engine past the busy timeout: worth
    /// trying again later, never a reason for an engine to stop.
    pub fn is_contention(&self) -> bool {
        let Self::Database(sqlx::Error::Database(e)) = self else { return false };
        let Some(code) = e.code() else { return false };
        // PostgreSQL: serialization_failure, deadlock_detected, lock_not_available.
        if matches!(code.as_ref(), "40001" | "40P01" | "55P03") {
            return true;
        }
        // SQLite: the primary result codes SQLITE_BUSY (5) and SQLITE_LOCKED (6), whatever
        // the extended code (BUSY_SNAPSHOT, BUSY_TIMEOUT, ...) in the upper bits.
        code.parse::<i32>().is_ok_and(|code| matches!(code & 0xff, 5 | 6))
    }
}

/// A request whose custom id an earlier line of its job already used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DuplicateCustomId {
    pub line: u64,
    pub custom_id: String,
    pub first_line: u64,
}

pub type StoreResult<T> = Result<T, StoreError>;
