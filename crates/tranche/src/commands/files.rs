//! `tranche files audit|cleanup`: what each provider account's file storage holds and whose
//! it is, and deleting what no batch needs.

use std::process::ExitCode;

use serde::Serialize;
use tranche_app::{App, CleanupOptions, Engine, FilesError};

use crate::args::{
    EngineArgs, FilesArgs, FilesAuditArgs, FilesCleanupArgs, FilesCommand, FilesTarget, Global,
};
use crate::context;
use crate::exit::{CmdResult, Exit, UPSTREAM};
use crate::render;

pub async fn run(app: App, global: &Global, args: FilesArgs) -> CmdResult {
    match args.command {
        FilesCommand::Audit(args) => audit(&app, global, args).await,
        FilesCommand::Cleanup(args) => cleanup(&app, global, args).await,
    }
}

/// `{"accounts": [...]}`, the shape both commands print.
#[derive(Serialize)]
struct Accounts<T> {
    accounts: Vec<T>,
}

async fn audit(app: &App, global: &Global, args: FilesAuditArgs) -> CmdResult {
    let engine = file_engine(app, global, &args.target).await?;
    let mut accounts = Vec::new();
    for provider in engine.file_accounts() {
        accounts.push(engine.audit_files(provider.kind()).await.map_err(files_exit)?);
    }
    if args.json {
        print_json(&Accounts { accounts })?;
        return Ok(ExitCode::SUCCESS);
    }
    for a in &accounts {
        let f = &a.files;
        render::println(&format!(
            "{} {}: {} file(s), {} with expiry and {} without; {} owned, {} orphaned, {} foreign",
            a.provider,
            a.endpoint,
            f.total,
            f.with_expiry,
            f.without_expiry,
            f.owned,
            f.orphaned,
            f.foreign
        ));
        let purposes: Vec<String> = f.by_purpose.iter().map(|(p, n)| format!("{p} {n}")).collect();
        if !purposes.is_empty() {
            render::println(&format!("  by purpose: {}", purposes.join(", ")));
        }
        render::println(&format!(
            "  limits (batch input files): {} with expiry, {} without; days left at the recent growth: {}, {}",
            count_or_none(a.limits.with_expiry),
            count_or_none(a.limits.without_expiry),
            days_or_none(a.days_to_limit.with_expiry),
            days_or_none(a.days_to_limit.without_expiry),
        ));
        render::println(&format!(
            "  uploaded by tranche: {} in 7 days, {} in 30 days",
            a.uploads_7d, a.uploads_30d
        ));
    }
    Ok(ExitCode::SUCCESS)
}

async fn cleanup(app: &App, global: &Global, args: FilesCleanupArgs) -> CmdResult {
    let engine = file_engine(app, global, &args.target).await?;
    let options = CleanupOptions { dry_run: args.dry_run, include_foreign: args.include_foreign };
    let mut accounts = Vec::new();
    for provider in engine.file_accounts() {
        accounts.push(engine.clean_files(provider.kind(), options).await.map_err(files_exit)?);
    }
    let failed = accounts.iter().any(|a| !a.failed.is_empty());
    if args.json {
        print_json(&Accounts { accounts })?;
    } else {
        for a in &accounts {
            let verb = if a.dry_run { "would delete" } else { "deleted" };
            render::println(&format!(
                "{} {}: {verb} {} file(s); {} live batch(es) at the provider, {} file(s) kept for them",
                a.provider,
                a.endpoint,
                a.deleted.len(),
                a.live_batches,
                a.held_by_live_batches
            ));
            for f in &a.deleted {
                let class = serde_json::to_value(f.class).unwrap_or_default();
                let class = class.as_str().unwrap_or_default();
                render::println(&format!("  {}  {}  {}  {class}", f.id, f.filename, f.purpose));
            }
            for f in &a.failed {
                render::println(&format!("  not deleted: {}: {}", f.id, f.error));
            }
        }
    }
    // Files the provider would not delete are reported above; the command failed its task.
    Ok(if failed { ExitCode::from(UPSTREAM) } else { ExitCode::SUCCESS })
}

/// An engine over the accounts the command names; an error when none of them has files.
async fn file_engine(app: &App, global: &Global, target: &FilesTarget) -> Result<Engine, Exit> {
    let engine =
        context::engine(app, global, &target.provider, target.kind, &EngineArgs::default()).await?;
    if engine.file_accounts().is_empty() {
        return Err(Exit::usage(anyhow::anyhow!(
            "no provider account with files is configured (Anthropic batches carry their requests inline); set OPENAI_API_KEY or AZURE_OPENAI_API_KEY, or pass --provider openai|azure"
        )));
    }
    Ok(engine)
}

/// An upstream refusal exits 3 with the provider's error verbatim.
fn files_exit(error: FilesError) -> Exit {
    match error {
        FilesError::Upstream(e) => Exit { code: UPSTREAM, error: e.into() },
        FilesError::Engine(e) => e.into(),
    }
}

fn print_json(value: &impl Serialize) -> Result<(), Exit> {
    let text = serde_json::to_string(value).map_err(|e| Exit::from(anyhow::Error::from(e)))?;
    render::println(&text);
    Ok(())
}

fn count_or_none(limit: Option<u64>) -> String {
    limit.map_or_else(|| "none".to_owned(), |n| n.to_string())
}

fn days_or_none(days: Option<f64>) -> String {
    days.map_or_else(|| "unknown".to_owned(), |d| format!("{d}"))
}
