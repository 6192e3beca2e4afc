//! tranche's domain: identities, fingerprints, input parsing and tranche planning; does no IO.

pub mod codec;
pub mod hash;
pub mod ids;
pub mod input;
pub mod plan;
pub mod provider;
pub mod state;
pub mod tokens;

pub use hash::InputHash;
pub use ids::{CustomId, CustomIdError, EngineId, JobId, LeaseToken, TrancheId};
pub use provider::{Endpoint, ProviderKind};
pub use state::{JobState, RequestState, TrancheState};
