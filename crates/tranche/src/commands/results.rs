//! `tranche results JOB [--out FILE]`.

use std::process::ExitCode;

use crate::args::{Global, ResultsArgs};
use crate::commands::run::write_results_file;
use crate::commands::status::find_job;
use crate::context;
use crate::exit::CmdResult;
use crate::render;

pub async fn run(global: &Global, args: ResultsArgs) -> CmdResult {
    let store = context::open_store(global).await?;
    let job = find_job(&*store, &args.job).await?;
    match &args.out {
        Some(out) => {
            write_results_file(&*store, &job, out).await?;
        }
        None => {
            let stdout = std::io::stdout();
            let mut lock = std::io::BufWriter::new(stdout.lock());
            render::write_results(&*store, job.id, &mut lock).await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
