//! `tranche migrate --to postgres://...`: move the SQLite store into an empty PostgreSQL
//! database and print the rows copied per table.

use std::process::ExitCode;

use crate::args::{Global, MigrateArgs};
use crate::context;
use crate::exit::{CmdResult, Exit};
use crate::render;

pub async fn run(global: &Global, args: MigrateArgs) -> CmdResult {
    let source = context::db_location(global);
    let report = tranche_app::migrate_sqlite_to_postgres(&source, &args.to).await?;
    if args.json {
        let text =
            serde_json::to_string(&report).map_err(|e| Exit::from(anyhow::Error::from(e)))?;
        render::println(&text);
    } else {
        for (table, rows) in &report.tables {
            render::println(&format!("{table}: {rows} row(s) copied"));
        }
        render::println("migrated; use --db with the PostgreSQL URL from now on");
    }
    Ok(ExitCode::SUCCESS)
}
