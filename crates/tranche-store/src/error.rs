//! The store's error type.

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
    Migrate(#[from] sqlx::migrate::MigrateError),
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
        // SQLite's primary result codes SQLITE_BUSY (5) and SQLITE_LOCKED (6), whatever the
        // extended code (BUSY_SNAPSHOT, BUSY_TIMEOUT, ...) in the upper bits.
        e.code().and_then(|code| code.parse::<i32>().ok()).is_some_and(|code| {
            let primary = code & 0xff;
            primary == 5 || primary == 6
        })
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
