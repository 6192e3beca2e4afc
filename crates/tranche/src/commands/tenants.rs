//! `tranche tenants add NAME [--admin]`, `tranche tenants list [--json]` and `tranche tenants
//! revoke NAME`: the HTTP server's tenants and their bearer tokens.

use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use tranche_app::App;

use crate::args::{TenantAddArgs, TenantListArgs, TenantRevokeArgs, TenantsArgs, TenantsCommand};
use crate::exit::{CmdResult, Exit};
use crate::render;

pub async fn run(app: App, args: TenantsArgs) -> CmdResult {
    match args.command {
        TenantsCommand::Add(args) => add(&app, args).await,
        TenantsCommand::List(args) => list(&app, args).await,
        TenantsCommand::Revoke(args) => revoke(&app, args).await,
    }
}

async fn add(app: &App, args: TenantAddArgs) -> CmdResult {
    let token = app.add_tenant(&args.name, args.admin).await?;
    let kind = if args.admin { "admin tenant" } else { "tenant" };
    render::println(&format!(
        "{kind} {} added; its bearer token, shown only this once (tranche keeps its SHA-256 alone):",
        args.name
    ));
    render::println(&token);
    Ok(ExitCode::SUCCESS)
}

async fn list(app: &App, args: TenantListArgs) -> CmdResult {
    let tenants = app.tenants().await?;
    if args.json {
        let text =
            serde_json::to_string(&tenants).map_err(|e| Exit::from(anyhow::Error::from(e)))?;
        render::println(&text);
        return Ok(ExitCode::SUCCESS);
    }
    if tenants.is_empty() {
        render::println("no tenants (add one with: tranche tenants add NAME)");
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(vec!["name", "admin", "created", "revoked"]);
    for t in &tenants {
        table.add_row(vec![
            t.name.clone(),
            if t.admin { "yes" } else { "no" }.to_owned(),
            time(t.created_at),
            t.revoked_at.map(time).unwrap_or_default(),
        ]);
    }
    render::println(&table.to_string());
    Ok(ExitCode::SUCCESS)
}

async fn revoke(app: &App, args: TenantRevokeArgs) -> CmdResult {
    app.revoke_tenant(&args.name).await?;
    render::println(&format!("tenant {} revoked; its token authenticates no more", args.name));
    Ok(ExitCode::SUCCESS)
}

/// Unix seconds as an RFC 3339 time in UTC.
fn time(at: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_secs(u64::try_from(at).unwrap_or(0));
    humantime::format_rfc3339_seconds(at).to_string()
}
