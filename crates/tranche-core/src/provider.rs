//! Which provider a request goes to, and the endpoints tranche knows for each.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A batch API tranche can drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    Openai,
    Azure,
    Anthropic,
}

impl ProviderKind {
    pub const ALL: [ProviderKind; 3] = [Self::Openai, Self::Azure, Self::Anthropic];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Openai => "openai",
            Self::Azure => "azure",
            Self::Anthropic => "anthropic",
        }
    }

    /// The endpoints this provider's batch API accepts.
    pub fn endpoints(self) -> &'static [Endpoint] {
        match self {
            Self::Openai => &[
                Endpoint::ChatCompletions,
                Endpoint::Embeddings,
                Endpoint::Responses,
                Endpoint::Completions,
                Endpoint::Moderations,
            ],
            Self::Azure => &[Endpoint::ChatCompletions, Endpoint::Responses],
            Self::Anthropic => &[Endpoint::AnthropicMessages],
        }
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A provider name that tranche does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown provider `{0}` (expected openai, azure or anthropic)")]
pub struct UnknownProvider(String);

impl FromStr for ProviderKind {
    type Err = UnknownProvider;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "openai" => Ok(Self::Openai),
            "azure" => Ok(Self::Azure),
            "anthropic" => Ok(Self::Anthropic),
            other => Err(UnknownProvider(other.to_owned())),
        }
    }
}

/// An API endpoint a batched request is sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Endpoint {
    #[serde(rename = "/v1/chat/completions")]
    ChatCompletions,
    #[serde(rename = "/v1/embeddings")]
    Embeddings,
    #[serde(rename = "/v1/responses")]
    Responses,
    #[serde(rename = "/v1/completions")]
    Completions,
    #[serde(rename = "/v1/moderations")]
    Moderations,
    #[serde(rename = "/v1/messages")]
    AnthropicMessages,
}

impl Endpoint {
    pub const ALL: [Endpoint; 6] = [
        Self::ChatCompletions,
        Self::Embeddings,
        Self::Responses,
        Self::Completions,
        Self::Moderations,
        Self::AnthropicMessages,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::ChatCompletions => "/v1/chat/completions",
            Self::Embeddings => "/v1/embeddings",
            Self::Responses => "/v1/responses",
            Self::Completions => "/v1/completions",
            Self::Moderations => "/v1/moderations",
            Self::AnthropicMessages => "/v1/messages",
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An endpoint path tranche does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown endpoint `{0}`")]
pub struct UnknownEndpoint(pub String);

impl FromStr for Endpoint {
    type Err = UnknownEndpoint;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|e| e.as_str() == s).ok_or_else(|| UnknownEndpoint(s.to_owned()))
    }
}
