//! The life cycles of jobs, requests and tranches, as closed enums with their stored names.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A stored state name that no variant has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} state `{value}`")]
pub struct UnknownState {
    kind: &'static str,
    value: String,
}

macro_rules! state_enum {
    ($(#[$meta:meta])* $name:ident, $kind:literal { $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = UnknownState;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok($name::$variant),)+
                    other => Err(UnknownState { kind: $kind, value: other.to_owned() }),
                }
            }
        }
    };
}

state_enum!(
    /// A job as a whole.
    JobState, "job" {
        /// Accepted; no request has gone out yet.
        Pending => "pending",
        /// Some requests are in flight or waiting.
        Running => "running",
        /// Every request reached a terminal state (and the answers were approved, when the job
        /// asked for review).
        Done => "done",
        /// Every request is answered; the answers wait for a person to approve or reject them.
        NeedsReview => "needs_review",
        /// An upstream failure stopped the job; its requests ended failed.
        Failed => "failed",
        /// The user cancelled the job.
        Cancelled => "cancelled",
    }
);

impl JobState {
    /// Whether no engine works on the job any more (one awaiting review waits for a person).
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Done | Self::NeedsReview | Self::Failed | Self::Cancelled)
    }
}

state_enum!(
    /// One request.
    RequestState, "request" {
        /// Waiting to be planned into a tranche.
        Pending => "pending",
        /// Planned into a tranche that has not ended.
        Queued => "queued",
        Succeeded => "succeeded",
        Failed => "failed",
        Cancelled => "cancelled",
    }
);

impl RequestState {
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
}

state_enum!(
    /// One provider batch. Each side effect has an "-ing" state recorded before it happens
    /// and a following state recorded after it succeeded.
    TrancheState, "tranche" {
        /// Requests are claimed; the input file is not uploaded yet.
        Planned => "planned",
        /// The upload is about to happen (or happened without being recorded).
        Uploading => "uploading",
        /// The input file is at the provider.
        Uploaded => "uploaded",
        /// The batch create is about to happen.
        Creating => "creating",
        /// The batch exists at the provider; it is polled until it ends.
        Submitted => "submitted",
        /// The batch ended; its result files are being copied to raw storage.
        Collecting => "collecting",
        /// Raw results are safe; they are being ingested line by line.
        Ingesting => "ingesting",
        /// Results are recorded; provider files are being deleted.
        Cleaning => "cleaning",
        /// Nothing left to do.
        Done => "done",
        /// The tranche could not be submitted; its requests ended failed.
        Failed => "failed",
    }
);

impl TrancheState {
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Done | Self::Failed)
    }
}

/// How one attempt of a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    Succeeded,
    Errored,
    Expired,
    Cancelled,
    /// The batch ended without a line for the request.
    Missing,
}

impl AttemptOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Errored => "errored",
            Self::Expired => "expired",
            Self::Cancelled => "cancelled",
            Self::Missing => "missing",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in JobState::ALL {
            assert_eq!(s.as_str().parse::<JobState>().unwrap(), *s);
        }
        for s in RequestState::ALL {
            assert_eq!(s.as_str().parse::<RequestState>().unwrap(), *s);
        }
        for s in TrancheState::ALL {
            assert_eq!(s.as_str().parse::<TrancheState>().unwrap(), *s);
        }
        assert!("nope".parse::<TrancheState>().is_err());
    }

    #[test]
    fn serde_uses_the_stored_names() {
        assert_eq!(serde_json::to_string(&JobState::Running).unwrap(), "\"running\"");
        assert_eq!(serde_json::to_string(&TrancheState::Collecting).unwrap(), "\"collecting\"");
    }
}
