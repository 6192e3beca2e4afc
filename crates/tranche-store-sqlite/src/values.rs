//! Statements that write many rows at once from a `VALUES` list: their text written once for a
//! full batch of rows, their values bound straight into sqlx's arguments.
//!
//! sqlx's `QueryBuilder` writes a statement's text as it binds, a placeholder and a separator
//! for each value through `fmt::Write`, for every batch again: at 10,000 requests under
//! callgrind, 109 M instructions of a run's 2.9 G (SHA-256 left out), for the requests'
//! insert and the successes' staging alone.

use std::sync::OnceLock;

use sqlx::query::Query;
use sqlx::sqlite::SqliteArguments;
use sqlx::{Arguments, Encode, Sqlite, Type};
use tranche_store::StoreResult;

/// A statement that writes a batch of rows from its `VALUES` list: what comes before the list,
/// how many values a row binds, how many rows a full batch holds, and what comes after.
#[derive(Debug)]
pub(crate) struct Batch {
    head: &'static str,
    columns: usize,
    full_rows: usize,
    tail: &'static str,
    /// The text for a full batch, written the first time one is run.
    full: OnceLock<String>,
}

impl Batch {
    pub(crate) const fn new(
        head: &'static str,
        columns: usize,
        full_rows: usize,
        tail: &'static str,
    ) -> Self {
        Self { head, columns, full_rows, tail, full: OnceLock::new() }
    }

    /// The statement's text for `rows` rows.
    pub(crate) fn text(&self, rows: usize) -> String {
        values_statement(self.head, self.columns, rows, self.tail)
    }

    /// The statement for `rows` rows with `binds`. A full batch's is the same text every
    /// time, kept prepared: parsed once a connection, not once a batch. A shorter one (a
    /// job's or a call's last) would only crowd the connection's statement cache.
    pub(crate) fn query(
        &'static self,
        rows: usize,
        binds: Binds,
    ) -> Query<'static, Sqlite, SqliteArguments> {
        if rows == self.full_rows {
            let text = self.full.get_or_init(|| self.text(rows));
            sqlx::query_with(text.as_str(), binds.0)
        } else {
            sqlx::query_with(sqlx::AssertSqlSafe(self.text(rows)), binds.0).persistent(false)
        }
    }
}

/// A statement's text: what comes before its `VALUES` list, the list of `rows` rows of
/// `columns` placeholders each, and what comes after.
fn values_statement(head: &str, columns: usize, rows: usize, tail: &str) -> String {
    let mut row = String::with_capacity(columns * 3 + 2);
    row.push('(');
    for column in 0..columns {
        row.push_str(if column == 0 { "?" } else { ", ?" });
    }
    row.push(')');
    let mut text = String::with_capacity(head.len() + rows * (row.len() + 2) + tail.len());
    text.push_str(head);
    for i in 0..rows {
        if i > 0 {
            text.push_str(", ");
        }
        text.push_str(&row);
    }
    text.push_str(tail);
    text
}

/// The values of a statement, bound in the order of its placeholders.
#[derive(Debug, Default)]
pub(crate) struct Binds(SqliteArguments);

impl Binds {
    pub(crate) fn with_capacity(values: usize) -> Self {
        let mut arguments = SqliteArguments::default();
        arguments.reserve(values, 0);
        Self(arguments)
    }

    /// Binds `value` to the next placeholder.
    pub(crate) fn add<'q, T: Encode<'q, Sqlite> + Type<Sqlite> + 'q>(
        &mut self,
        value: T,
    ) -> StoreResult<&mut Self> {
        self.0.add(value).map_err(sqlx::Error::Encode)?;
        Ok(self)
    }

    #[cfg(test)]
    pub(crate) fn into_arguments(self) -> SqliteArguments {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use sqlx::Row;
    use sqlx::sqlite::SqlitePoolOptions;

    use super::*;

    /// A statement's list holds its rows, each of its columns, and its values land in the
    /// order bound, the head's and the tail's placeholders included.
    #[tokio::test]
    async fn a_values_statement_takes_its_rows_in_the_order_bound() {
        assert_eq!(values_statement("V ", 2, 3, " T"), "V (?, ?), (?, ?), (?, ?) T");
        assert_eq!(values_statement("", 1, 1, ""), "(?)");
        let pool = SqlitePoolOptions::new().connect("sqlite::memory:").await.unwrap();
        let text = values_statement(
            "SELECT group_concat(? || l.column1 || '=' || l.column2, ' ') FROM (VALUES ",
            2,
            3,
            ") AS l WHERE l.column1 <> ?",
        );
        let mut binds = Binds::with_capacity(8);
        binds.add("<").unwrap();
        for (key, value) in [("a", 1i64), ("b", 2), ("c", 3)] {
            binds.add(key).unwrap().add(value).unwrap();
        }
        binds.add("b").unwrap();
        let row = sqlx::query_with(sqlx::AssertSqlSafe(text), binds.into_arguments())
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(row.get::<String, _>(0), "<a=1 <c=3");
    }
}
