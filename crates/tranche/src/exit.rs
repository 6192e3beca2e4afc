//! Exit codes and how a failure is reported on stderr.

use std::io::Write;
use std::process::ExitCode;

/// Every request succeeded (or the command did what it was asked).
pub const SUCCESS: u8 = 0;
/// The job ended with failed requests.
pub const JOB_FAILED_REQUESTS: u8 = 1;
/// Bad input or usage.
pub const USAGE: u8 = 2;
/// An upstream failure stopped the job.
pub const UPSTREAM: u8 = 3;
/// The job's answers await review (`tranche approve` or `reject`).
pub const AWAITS_REVIEW: u8 = 4;

/// A failed command: what to print and which code to exit with.
#[derive(Debug)]
pub struct Exit {
    pub code: u8,
    pub error: anyhow::Error,
}

impl Exit {
    pub fn usage(error: impl Into<anyhow::Error>) -> Self {
        Self { code: USAGE, error: error.into() }
    }

    pub fn report(self) -> ExitCode {
        let mut stderr = std::io::stderr().lock();
        let _ = writeln!(stderr, "error: {:#}", self.error);
        ExitCode::from(self.code)
    }
}

impl From<anyhow::Error> for Exit {
    fn from(error: anyhow::Error) -> Self {
        Self { code: 1, error }
    }
}

impl From<tranche_app::AppError> for Exit {
    fn from(error: tranche_app::AppError) -> Self {
        let code = if error.is_usage() { USAGE } else { 1 };
        Self { code, error: error.into() }
    }
}

impl From<tranche_app::EngineError> for Exit {
    fn from(error: tranche_app::EngineError) -> Self {
        Self { code: 1, error: error.into() }
    }
}

pub type CmdResult = Result<ExitCode, Exit>;
