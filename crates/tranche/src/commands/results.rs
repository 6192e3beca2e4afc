//! `tranche results JOB [--out FILE]`.

use std::process::ExitCode;

use tranche_app::App;

use crate::args::ResultsArgs;
use crate::exit::CmdResult;

pub async fn run(app: App, args: ResultsArgs) -> CmdResult {
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
