//! tranche's domain: identities, fingerprints, input parsing, tranche planning, provider line
//! codecs, shared-prompt cache marks, prices and offline token counts for cost estimates, and
//! the clock the engine reads; does no IO.

pub mod cache_marks;
pub mod canon;
pub mod clock;
pub mod codec;
pub mod count;
pub mod estimate;
pub mod extract;
pub mod hash;
pub mod ids;
pub mod input;
pub mod money;
pub mod plan;
pub mod price;
pub mod provider;
pub mod settings;
pub mod state;
pub mod tokens;
pub mod usage;
pub mod validate;

pub use clock::{Clock, ManualClock, SystemClock};
pub use estimate::Estimate;
pub use hash::InputHash;
pub use ids::{AccountId, CustomId, CustomIdError, EngineId, JobId, LeaseToken, TrancheId};
pub use money::Usd;
pub use price::{Costs, ModelPrice, PriceError, PriceRules, PriceTable};
pub use provider::{Endpoint, ProviderKind};
pub use settings::{CacheSharedPrompt, JobSettings, OnInvalid};
pub use state::{AttemptOutcome, JobState, RequestState, TrancheState};
pub use usage::TokenUsage;
