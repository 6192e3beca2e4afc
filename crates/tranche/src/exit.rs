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
        let _ = writeln!(stderr, "error: {}", message(&self.error));
        ExitCode::from(self.code)
    }
}

/// The error and its causes, each after a `: `, leaving out a cause the text already holds:
/// many of tranche's errors say their cause in their own message (`cannot open the database
/// at ...: {source}`) and also give it as their source, which would otherwise be said twice or
/// three times.
fn message(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let cause = cause.to_string();
        if text.is_empty() {
            text = cause;
        } else if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An error that says its cause in its message and gives it as its source too.
    #[derive(Debug)]
    struct Open {
        source: std::io::Error,
    }

    impl std::fmt::Display for Open {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "cannot open `db`: {}", self.source)
        }
    }

    impl std::error::Error for Open {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    #[test]
    fn each_cause_is_said_once() {
        let io = || std::io::Error::other("database \"x\" does not exist");
        let said_in_message = anyhow::Error::from(Open { source: io() });
        assert_eq!(message(&said_in_message), "cannot open `db`: database \"x\" does not exist");
        let given_as_context = anyhow::Error::from(io()).context("cannot start");
        assert_eq!(message(&given_as_context), "cannot start: database \"x\" does not exist");
        let both = anyhow::Error::from(Open { source: io() }).context("submit failed");
        assert_eq!(
            message(&both),
            "submit failed: cannot open `db`: database \"x\" does not exist"
        );
    }
}
