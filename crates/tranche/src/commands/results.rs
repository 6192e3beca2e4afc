//! `tranche results JOB [--out FILE]`.

use std::process::ExitCode;

use crate::args::{Global, ResultsArgs};
use crate::context;
use crate::exit::CmdResult;

pub async fn run(global: &Global, args: ResultsArgs) -> CmdResult {
    let app = context::open_app(global).await?;
    let job = app.find_job(&args.job).await?;
    match &args.out {
        Some(out) => {
            app.export_to(job.id, out).await?;
        }
        None => {
            let stdout = std::io::stdout();
            let mut lock = std::io::BufWriter::new(stdout.lock());
            app.export(job.id, &mut lock).await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
