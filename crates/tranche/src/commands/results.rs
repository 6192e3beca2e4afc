//! `tranche results JOB [--out FILE | --to-blob-store] [--status S] [--staged] [--format F] [--raw]`.

use std::process::ExitCode;

use tranche_app::App;

use crate::args::ResultsArgs;
use crate::exit::{CmdResult, Exit};
use crate::render;

pub async fn run(app: App, args: ResultsArgs) -> CmdResult {
    let job = app.find_job(&args.job).await?;
    if args.to_blob_store {
        let exported = app.export_to_blob_store(&job, args.options()).await?;
        let text =
            serde_json::to_string(&exported).map_err(|e| Exit::from(anyhow::Error::from(e)))?;
        render::println(&text);
        return Ok(ExitCode::SUCCESS);
    }
    match &args.out {
        Some(out) => {
            app.export_to(&job, args.options(), out).await?;
        }
        None => {
            let stdout = std::io::stdout();
            let mut lock = std::io::BufWriter::new(stdout.lock());
            app.export(&job, args.options(), &mut lock).await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
