//! Many rows read a page at a time, each page one JSON value: SQLite builds the page as a
//! `json_group_array` of row arrays, so that it crosses from the connection's worker thread
//! as one message holding one string, instead of one message (and a copy of every column, each
//! its own allocation) per row. Rows read one by one that way cost more than SQLite's own work
//! on them: `tranche results` at 100,000 requests spent most of its CPU time there.
//!
//! A page's statement orders its rows in the subquery it aggregates (`ORDER BY id LIMIT`),
//! not in the aggregate: `json_group_array(... ORDER BY id)` copies every row into a temporary
//! B-tree to sort it again (the 98 pages of a 100,000-request export: 0.16-0.26 s against 0.10
//! without). SQLite does not promise to aggregate rows in the order its subquery gives them, so
//! [`Page::from_row`] checks the order and sorts a page that comes back out of it.

use std::cell::{Cell, RefCell};

use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use serde::de;
use serde_json::Value;
use sqlx::{Sqlite, Transaction};
use tranche_store::rows::StoredRow;
use tranche_store::{StoreError, StoreResult};

/// Rows a page holds (written into its statement as `page_rows!`): large enough that a
/// statement's fixed cost is paid rarely, small enough that a page (about 200 bytes a row of
/// results) stays well under a MiB.
pub(crate) const PAGE_ROWS: i64 = 1024;

/// A page as its statement gives it: the rows and the largest request id among them (where
/// the next page starts).
#[derive(Debug)]
pub(crate) struct Page {
    pub rows: Vec<JsonRow>,
    pub last_id: Option<i64>,
}

impl Page {
    /// The page of a row `(json_group_array(...), MAX(id), COUNT(*))` whose row arrays hold
    /// their request's id at `id_at`, its rows in id order.
    pub(crate) fn from_row(row: &sqlx::sqlite::SqliteRow, id_at: usize) -> StoreResult<Self> {
        use sqlx::Row;
        let text: Option<String> = row.try_get(0)?;
        let last_id: Option<i64> = row.try_get(1)?;
        let count: i64 = row.try_get(2)?;
        let mut rows = match text {
            Some(text) => parse_sized(&text, usize::try_from(count).unwrap_or(0))?,
            None => Vec::new(),
        };
        in_id_order(&mut rows, id_at)?;
        if usize::try_from(count).ok() != Some(rows.len()) {
            return Err(StoreError::Corrupt(format!(
                "a page of {count} rows came back holding {}",
                rows.len()
            )));
        }
        Ok(Self { rows, last_id })
    }

    /// Whether the page holds [`PAGE_ROWS`] rows: a page short of that is the last.
    pub(crate) fn is_full(&self) -> bool {
        i64::try_from(self.rows.len()).is_ok_and(|n| n >= PAGE_ROWS)
    }
}

/// The rows `read` gives page after page, from the snapshot of `tx` (committed after the last
/// page), each made a record by `record`. `read(tx, after)` reads the page of ids past `after`
/// and hands `tx` back; the stream starts past `after` and ends at the first page not full.
pub(crate) fn read_pages<T, F, Fut, R>(
    tx: Transaction<'static, Sqlite>,
    after: i64,
    read: F,
    record: R,
) -> BoxStream<'static, StoreResult<T>>
where
    T: Send + 'static,
    F: Fn(Transaction<'static, Sqlite>, i64) -> Fut + Send + 'static,
    Fut: Future<Output = StoreResult<(Transaction<'static, Sqlite>, Page)>> + Send,
    R: Fn(&JsonRow) -> StoreResult<T> + Send + 'static,
{
    let state = (Some((tx, after)), read, record);
    futures::stream::try_unfold(state, move |(state, read, record)| async move {
        let Some((tx, after)) = state else { return Ok::<_, StoreError>(None) };
        let (tx, page) = read(tx, after).await?;
        let records = page.rows.iter().map(&record).collect::<StoreResult<Vec<T>>>()?;
        let next = match (page.is_full(), page.last_id) {
            (true, Some(last_id)) => Some((tx, last_id)),
            _ => {
                tx.commit().await?;
                None
            }
        };
        Ok(Some((futures::stream::iter(records.into_iter().map(Ok)), (next, read, record))))
    })
    .try_flatten()
    .boxed()
}

/// The rows of a page's JSON array of row arrays.
#[cfg(test)]
pub(crate) fn parse(text: &str) -> StoreResult<Vec<JsonRow>> {
    parse_sized(text, 0)
}

/// The rows of a page's JSON array of row arrays, the page said to hold `count` rows: the
/// rows' vector is made that large at once, and each row's cells as many as the row before had. (Grown as serde grows a vector of unknown
/// length, from nothing by doubling, a results page's rows took 3 reallocations each, and the
/// page 10 more: 30,000 in an export of 10,000 results, 2.7% of its instructions.)
fn parse_sized(text: &str, count: usize) -> StoreResult<Vec<JsonRow>> {
    let mut de = serde_json::Deserializer::from_str(text);
    let rows = de::DeserializeSeed::deserialize(Rows { count }, &mut de)
        .and_then(|rows| de.end().map(|()| rows))
        .map_err(|e| StoreError::Corrupt(format!("a page of rows is not a JSON array: {e}")))?;
    Ok(rows)
}

/// Reads a page's array of rows, `count` of them expected.
struct Rows {
    count: usize,
}

impl<'de> de::DeserializeSeed<'de> for Rows {
    type Value = Vec<JsonRow>;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> de::Visitor<'de> for Rows {
    type Value = Vec<JsonRow>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an array of row arrays")
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        // The count only sizes the vector (never past a full page): the rows are what the text
        // holds, and `from_row` refuses a page whose rows and count disagree.
        let capacity = usize::try_from(PAGE_ROWS).unwrap_or(0);
        let mut rows = Vec::with_capacity(self.count.min(capacity));
        let mut width = 0;
        while let Some(cells) = seq.next_element_seed(Cells { width })? {
            width = cells.len();
            rows.push(JsonRow { cells: RefCell::new(cells), read: Cell::new(0) });
        }
        Ok(rows)
    }
}

/// Reads one row array, `width` cells expected.
struct Cells {
    width: usize,
}

impl<'de> de::DeserializeSeed<'de> for Cells {
    type Value = Vec<Value>;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> de::Visitor<'de> for Cells {
    type Value = Vec<Value>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a row array")
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut cells = Vec::with_capacity(self.width);
        while let Some(cell) = seq.next_element()? {
            cells.push(cell);
        }
        Ok(cells)
    }
}

/// Sorts `rows` by the id at column `id_at`, unless they are in that order already (as SQLite
/// gives them: only checked, in one pass).
fn in_id_order(rows: &mut Vec<JsonRow>, id_at: usize) -> StoreResult<()> {
    let ids = rows.iter().map(|row| row.peek_int(id_at)).collect::<StoreResult<Vec<i64>>>()?;
    if ids.is_sorted() {
        return Ok(());
    }
    let mut keyed: Vec<(i64, JsonRow)> = ids.into_iter().zip(rows.drain(..)).collect();
    keyed.sort_by_key(|(id, _)| *id);
    rows.extend(keyed.into_iter().map(|(_, row)| row));
    Ok(())
}

/// One row of a page, its columns by position (SQLite's text, integers and NULLs as JSON
/// strings, numbers and nulls). Each column is read once: reading it hands its value over
/// without a copy, and a second read of it is an error.
#[derive(Debug)]
pub(crate) struct JsonRow {
    cells: RefCell<Vec<Value>>,
    /// The columns read already, a bit each.
    read: Cell<u64>,
}

impl JsonRow {
    fn take(&self, index: usize) -> StoreResult<Value> {
        let mut cells = self.cells.borrow_mut();
        let cell = cells
            .get_mut(index)
            .filter(|_| index < 64)
            .ok_or_else(|| StoreError::Corrupt(format!("a page row has no column {index}")))?;
        let bit = 1u64 << index;
        if self.read.get() & bit != 0 {
            return Err(StoreError::Corrupt(format!(
                "column {index} of a page row was read twice"
            )));
        }
        self.read.set(self.read.get() | bit);
        Ok(std::mem::take(cell))
    }

    /// The integer at column `index`, left unread.
    fn peek_int(&self, index: usize) -> StoreResult<i64> {
        self.peek_opt_int(index)?.ok_or_else(|| not_a("an integer", index))
    }

    /// The integer or NULL at column `index`, left unread.
    pub(crate) fn peek_opt_int(&self, index: usize) -> StoreResult<Option<i64>> {
        opt_int_of(self.cells.borrow().get(index), index)
    }

    /// Puts `value` at column `index` in place of what is there, which is left unread.
    pub(crate) fn put(&self, index: usize, value: Value) -> StoreResult<()> {
        let mut cells = self.cells.borrow_mut();
        let cell = cells
            .get_mut(index)
            .filter(|_| index < 64 && self.read.get() & (1u64 << index) == 0)
            .ok_or_else(|| StoreError::Corrupt(format!("column {index} of a page row was read")))?;
        *cell = value;
        Ok(())
    }

    fn opt_int(&self, index: usize) -> StoreResult<Option<i64>> {
        opt_int_of(Some(&self.take(index)?), index)
    }
}

/// The integer or NULL a page row's column `index` holds.
fn opt_int_of(cell: Option<&Value>, index: usize) -> StoreResult<Option<i64>> {
    match cell {
        Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n.as_i64().map(Some).ok_or_else(|| not_a("an integer", index)),
        _ => Err(not_a("an integer", index)),
    }
}

fn not_a(what: &str, index: usize) -> StoreError {
    StoreError::Corrupt(format!("column {index} of a page row is not {what}"))
}

fn by_name(column: &str) -> StoreError {
    StoreError::Corrupt(format!("column `{column}` asked by name of a page row (by position only)"))
}

impl StoredRow for JsonRow {
    fn text(&self, column: &str) -> StoreResult<String> {
        Err(by_name(column))
    }
    fn opt_text(&self, column: &str) -> StoreResult<Option<String>> {
        Err(by_name(column))
    }
    fn int(&self, column: &str) -> StoreResult<i64> {
        Err(by_name(column))
    }
    fn opt_int(&self, column: &str) -> StoreResult<Option<i64>> {
        Err(by_name(column))
    }
    fn flag(&self, column: &str) -> StoreResult<bool> {
        Err(by_name(column))
    }
    fn text_at(&self, index: usize) -> StoreResult<String> {
        self.opt_text_at(index)?.ok_or_else(|| not_a("text", index))
    }
    fn opt_text_at(&self, index: usize) -> StoreResult<Option<String>> {
        match self.take(index)? {
            Value::Null => Ok(None),
            Value::String(text) => Ok(Some(text)),
            _ => Err(not_a("text", index)),
        }
    }
    fn int_at(&self, index: usize) -> StoreResult<i64> {
        JsonRow::opt_int(self, index)?.ok_or_else(|| not_a("an integer", index))
    }
    fn opt_int_at(&self, index: usize) -> StoreResult<Option<i64>> {
        JsonRow::opt_int(self, index)
    }
    fn flag_at(&self, index: usize) -> StoreResult<bool> {
        Ok(self.int_at(index)? != 0)
    }
}

#[cfg(test)]
mod tests {
    use sqlx::sqlite::SqlitePoolOptions;

    use super::*;

    /// The `LIMIT` written into a page's statement is the page's size.
    #[test]
    fn a_pages_written_limit_is_its_size() {
        assert_eq!(page_rows!().parse::<i64>().ok(), Some(PAGE_ROWS));
    }

    /// What SQLite writes for text with quotes, escapes, newlines and characters past ASCII,
    /// for large integers, NULLs and flags, reads back as it was stored.
    #[tokio::test]
    async fn a_page_reads_back_every_kind_of_column_as_stored() {
        let pool = SqlitePoolOptions::new().connect("sqlite::memory:").await.unwrap();
        sqlx::query("CREATE TABLE t (id INTEGER PRIMARY KEY, s TEXT, n INTEGER, f INTEGER)")
            .execute(&pool)
            .await
            .unwrap();
        let texts = ["plain", "a \"quoted\" \\ back\\slash\nnew\tline", "é ✓ 🦀", "", "{\"j\":1}"];
        for (i, text) in texts.iter().enumerate() {
            sqlx::query("INSERT INTO t (id, s, n, f) VALUES (?, ?, ?, ?)")
                .bind(i as i64 + 1)
                .bind(text)
                .bind(i64::MAX - i as i64)
                .bind(i % 2 == 0)
                .execute(&pool)
                .await
                .unwrap();
        }
        sqlx::query("INSERT INTO t (id, s, n, f) VALUES (9, NULL, NULL, 0)")
            .execute(&pool)
            .await
            .unwrap();
        let row = sqlx::query(
            "SELECT json_group_array(json_array(id, s, n, f)), MAX(id), COUNT(*)
             FROM (SELECT * FROM t ORDER BY id)",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        let page = Page::from_row(&row, 0).unwrap();
        assert_eq!((page.rows.len(), page.last_id, page.is_full()), (6, Some(9), false));
        for (i, text) in texts.iter().enumerate() {
            let row = &page.rows[i];
            assert_eq!(row.int_at(0).unwrap(), i as i64 + 1);
            assert_eq!(row.text_at(1).unwrap(), *text);
            assert_eq!(row.int_at(2).unwrap(), i64::MAX - i as i64);
            assert_eq!(row.flag_at(3).unwrap(), i % 2 == 0);
        }
        let last = &page.rows[5];
        assert_eq!(last.opt_text_at(1).unwrap(), None);
        assert_eq!(last.opt_int_at(2).unwrap(), None);
        assert!(last.text_at(0).is_err(), "an integer is not text");
        assert!(last.int_at(0).is_err(), "a column is read once");
        assert!(last.text("s").is_err(), "by position only");
        assert!(last.int_at(7).is_err(), "no such column");
    }

    /// An empty page is a page of no rows, and the last.
    #[tokio::test]
    async fn an_empty_page_has_no_rows_and_is_the_last() {
        let pool = SqlitePoolOptions::new().connect("sqlite::memory:").await.unwrap();
        let row = sqlx::query(
            "SELECT json_group_array(json_array(x)), MAX(x), COUNT(*)
             FROM (SELECT 1 AS x WHERE 0)",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        let page = Page::from_row(&row, 0).unwrap();
        assert!(page.rows.is_empty());
        assert_eq!((page.last_id, page.is_full()), (None, false));
    }

    /// A page whose rows come back out of id order is put in order, each row whole; one
    /// whose id column is not an integer is corrupt.
    #[test]
    fn a_page_out_of_id_order_is_sorted_by_its_id_column() {
        let mut rows = parse(r#"[["c", 3], ["a", 1], ["b", 2]]"#).unwrap();
        in_id_order(&mut rows, 1).unwrap();
        let read: Vec<(String, i64)> =
            rows.iter().map(|r| (r.text_at(0).unwrap(), r.int_at(1).unwrap())).collect();
        assert_eq!(read, [("a".into(), 1), ("b".into(), 2), ("c".into(), 3)]);
        let mut rows = parse(r#"[["a", 1], ["b", null]]"#).unwrap();
        assert!(in_id_order(&mut rows, 1).is_err());
    }

    /// A column peeked at stays unread, and one put in place reads back as put; a column read
    /// already takes nothing in its place.
    #[test]
    fn a_column_is_peeked_at_and_replaced_until_it_is_read() {
        let rows = parse(r#"[[7, null, "x"]]"#).unwrap();
        let row = &rows[0];
        assert_eq!(row.peek_opt_int(0).unwrap(), Some(7));
        assert_eq!(row.peek_opt_int(1).unwrap(), None);
        assert!(row.peek_opt_int(2).is_err(), "text is not an integer");
        row.put(0, Value::String("seven".into())).unwrap();
        assert_eq!(row.text_at(0).unwrap(), "seven");
        assert!(row.put(0, Value::Null).is_err(), "read already");
        assert!(row.put(3, Value::Null).is_err(), "no such column");
    }

    #[test]
    fn a_page_that_is_not_an_array_of_rows_is_corrupt() {
        assert!(parse("{\"a\":1}").is_err());
        assert!(parse("[1, 2]").is_err());
        assert_eq!(parse("[[1], [\"x\", null]]").unwrap().len(), 2);
        assert!(parse("[[1]] [[2]]").is_err(), "text past the page");
        assert!(parse("[[1], [2]").is_err(), "a page cut short");
    }

    /// Whatever count a page is said to hold, and however wide each row, its rows and cells
    /// come back as the text has them.
    #[test]
    fn a_page_parses_the_same_whatever_its_count_says() {
        let text = r#"[[1, "a"], [2, "b", null, 4], [3], [], [5, "e"]]"#;
        let cells = |rows: Vec<JsonRow>| -> Vec<Vec<Value>> {
            rows.into_iter().map(|row| row.cells.into_inner()).collect()
        };
        let want = cells(parse(text).unwrap());
        assert_eq!(want.iter().map(Vec::len).collect::<Vec<_>>(), [2, 4, 1, 0, 2]);
        for count in [0, 1, 5, 9, usize::MAX] {
            assert_eq!(cells(parse_sized(text, count).unwrap()), want, "count {count}");
        }
    }
}
