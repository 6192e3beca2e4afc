//! Which store a database location names: a SQLite file (a path or a `sqlite:` URL) or a
//! PostgreSQL server (`postgres://`, `postgresql://`). Any other scheme is refused by name.

use crate::error::AppError;

/// A database location, by the store it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Database<'a> {
    /// A file path, `sqlite:path` or `sqlite://path`.
    Sqlite(&'a str),
    /// A `postgres://` or `postgresql://` URL.
    Postgres(&'a str),
}

/// The schemes tranche knows, as an error names them.
const KNOWN: &str = "a file path or sqlite:PATH (SQLite), postgres://USER@HOST/DB (PostgreSQL)";

impl<'a> Database<'a> {
    /// Reads `location` (from `--db` or `TRANCHE_DATABASE_URL`).
    pub fn parse(location: &'a str) -> Result<Self, AppError> {
        let scheme = location.split_once("://").map(|(scheme, _)| scheme).filter(|scheme| {
            scheme.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
        });
        match scheme.map(str::to_ascii_lowercase).as_deref() {
            None | Some("sqlite") => Ok(Self::Sqlite(location)),
            Some("postgres" | "postgresql") => Ok(Self::Postgres(location)),
            Some(other) => Err(AppError::Config(format!(
                "the database `{other}://…` is not one tranche knows; use {KNOWN}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_name_their_store_and_unknown_schemes_are_refused() {
        for sqlite in ["state/tranche.db", "/abs/t.db", "sqlite:t.db", "sqlite://t.db", ":memory:"]
        {
            assert_eq!(Database::parse(sqlite).unwrap(), Database::Sqlite(sqlite), "{sqlite}");
        }
        for pg in ["postgres://postgres@127.0.0.1/test", "postgresql://u:p@h:5432/db"] {
            assert_eq!(Database::parse(pg).unwrap(), Database::Postgres(pg));
        }
        let err = Database::parse("mysql://root@127.0.0.1/test").unwrap_err().to_string();
        assert!(err.contains("`mysql://…`") && err.contains("postgres://"), "{err}");
        assert!(err.contains("sqlite:"), "{err}");
    }
}
