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
}

pub type StoreResult<T> = Result<T, StoreError>;
