//! Identifier newtypes: job and tranche ids and lease tokens (UUIDv7), engine ids, and the
//! caller-facing `CustomId`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

macro_rules! uuid_id {
    ($(#[$meta:meta])* $name:ident, $prefix:literal) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(Uuid);

        impl $name {
            /// A new, time-ordered id.
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }

            /// The underlying UUID.
            pub fn as_uuid(&self) -> Uuid {
                self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}{}", $prefix, self.0.simple())
            }
        }

        impl FromStr for $name {
            type Err = IdParseError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let rest = s.strip_prefix($prefix).ok_or_else(|| IdParseError {
                    kind: stringify!($name),
                    value: s.to_owned(),
                })?;
                Uuid::try_parse(rest).map(Self).map_err(|_| IdParseError {
                    kind: stringify!($name),
                    value: s.to_owned(),
                })
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdParseError;

            fn try_from(s: String) -> Result<Self, Self::Error> {
                s.parse()
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.to_string()
            }
        }
    };
}

uuid_id!(
    /// One submission: a set of requests plus its settings. Printed as `job_<uuid>`.
    JobId,
    "job_"
);
uuid_id!(
    /// One provider batch. Printed as `tr_<uuid>`; also names the uploaded file `tranche-<id>.jsonl`.
    TrancheId,
    "tr_"
);

uuid_id!(
    /// One acquisition of a lease: a tranche's transitions compare it, and files a step writes
    /// carry it in their names, so a step whose lease passed on changes nothing. Printed as
    /// `ls_<uuid>`.
    LeaseToken,
    "ls_"
);

/// The engine that holds a lease, as `status` shows it: `host:pid:suffix`, unique per engine.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EngineId(String);

impl EngineId {
    /// An engine id from its parts; the suffix tells engines of one process apart.
    pub fn new(host: &str, pid: u32) -> Self {
        let suffix = Uuid::now_v7().simple().to_string();
        Self(format!("{host}:{pid}:{}", &suffix[suffix.len() - 6..]))
    }

    /// An id as stored.
    pub fn from_stored(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EngineId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The provider account a tranche's batch lives on: the provider and the base URL or endpoint
/// it is reached at, never a key. An engine steps only tranches of accounts it has
/// credentials for, so a worker pointed at one account never polls another's batches.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AccountId(String);

impl AccountId {
    /// `location` is where the account is reached, without credentials (the adapters strip
    /// user info, query and fragment from their base URL).
    pub fn new(provider: crate::ProviderKind, location: &str) -> Self {
        Self(format!("{provider} {}", location.trim_end_matches('/')))
    }

    /// An id as stored.
    pub fn from_stored(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AccountId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A string that is not a well-formed job or tranche id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{value}` is not a valid {kind}")]
pub struct IdParseError {
    kind: &'static str,
    value: String,
}

/// The longest custom id tranche accepts.
pub const MAX_CUSTOM_ID_LEN: usize = 512;

/// A request's identity: `key:task:version`, optionally prefixed by `tenant::`.
///
/// The key is the caller's domain id and may itself contain `:` (`ticket:84291`), so
/// the task and version are the last two `:`-separated parts. An id without any `:`
/// (as in plain OpenAI batch files, e.g. `request-17`) is kept as it is, and its key
/// is the whole id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CustomId(String);

/// Why a string is not a valid custom id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CustomIdError {
    #[error("custom_id is empty")]
    Empty,
    #[error("custom_id is longer than {MAX_CUSTOM_ID_LEN} bytes")]
    TooLong,
    #[error("custom_id contains a control character")]
    ControlCharacter,
    #[error("custom_id has an empty {0} part (expected `[tenant::]key:task:version`)")]
    EmptyPart(&'static str),
    #[error("{0} must not contain `:`")]
    ColonInPart(&'static str),
}

impl CustomId {
    /// Parses an id as written in an input file.
    pub fn parse(s: &str) -> Result<Self, CustomIdError> {
        Self::check(s)?;
        Ok(Self(s.to_owned()))
    }

    /// The key of `s` ([`CustomId::key`]) when `s` is a valid id, without making one: an
    /// export names the key of every line it writes.
    pub fn key_in(s: &str) -> Result<&str, CustomIdError> {
        Self::check(s)?;
        Ok(key_part(s))
    }

    /// Whether `s` is a valid id, and if not, why.
    fn check(s: &str) -> Result<(), CustomIdError> {
        if s.is_empty() {
            return Err(CustomIdError::Empty);
        }
        if s.len() > MAX_CUSTOM_ID_LEN {
            return Err(CustomIdError::TooLong);
        }
        // An ASCII id (nearly all) is checked byte by byte: its control characters are
        // exactly the ASCII ones, and `char::is_control` looks each up in Unicode's tables.
        let control = if s.is_ascii() {
            s.bytes().any(|b| b.is_ascii_control())
        } else {
            s.chars().any(char::is_control)
        };
        if control {
            return Err(CustomIdError::ControlCharacter);
        }
        let rest = match split_tenant(s) {
            Some((tenant, rest)) => {
                if tenant.is_empty() {
                    return Err(CustomIdError::EmptyPart("tenant"));
                }
                if tenant.contains(':') {
                    return Err(CustomIdError::ColonInPart("tenant"));
                }
                rest
            }
            None => s,
        };
        if rest.contains(':') {
            let mut parts = rest.rsplitn(3, ':');
            let version = parts.next().unwrap_or_default();
            let task = parts.next().unwrap_or_default();
            let key = parts.next().unwrap_or_default();
            if version.is_empty() {
                return Err(CustomIdError::EmptyPart("version"));
            }
            if task.is_empty() {
                return Err(CustomIdError::EmptyPart("task"));
            }
            if key.is_empty() || key.split(':').any(str::is_empty) {
                return Err(CustomIdError::EmptyPart("key"));
            }
        } else if rest.is_empty() {
            return Err(CustomIdError::EmptyPart("key"));
        }
        Ok(())
    }

    /// Builds `[tenant::]key:task:version` from its parts.
    pub fn compose(
        tenant: Option<&str>,
        key: &str,
        task: &str,
        version: &str,
    ) -> Result<Self, CustomIdError> {
        if task.contains(':') {
            return Err(CustomIdError::ColonInPart("task"));
        }
        if version.contains(':') {
            return Err(CustomIdError::ColonInPart("version"));
        }
        if task.is_empty() {
            return Err(CustomIdError::EmptyPart("task"));
        }
        if version.is_empty() {
            return Err(CustomIdError::EmptyPart("version"));
        }
        if key.is_empty() {
            return Err(CustomIdError::EmptyPart("key"));
        }
        if split_tenant(key).is_some() {
            return Err(CustomIdError::EmptyPart("key"));
        }
        if tenant.is_some_and(|tenant| tenant.contains(':')) {
            return Err(CustomIdError::ColonInPart("tenant"));
        }
        // Joined by hand: `format!` costs more than the id's own check (every accepted line
        // makes one).
        let tenant_len = tenant.map_or(0, |tenant| tenant.len() + 2);
        let mut id = String::with_capacity(tenant_len + key.len() + task.len() + version.len() + 2);
        if let Some(tenant) = tenant {
            id.push_str(tenant);
            id.push_str("::");
        }
        id.push_str(key);
        id.push(':');
        id.push_str(task);
        id.push(':');
        id.push_str(version);
        Self::check(&id)?;
        Ok(Self(id))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The tenant prefix, if any.
    pub fn tenant(&self) -> Option<&str> {
        split_tenant(&self.0).map(|(tenant, _)| tenant)
    }

    /// The caller's domain key: everything before `:task:version`, or the whole id.
    pub fn key(&self) -> &str {
        key_part(&self.0)
    }

    /// The task part, when the id is structured.
    pub fn task(&self) -> Option<&str> {
        let rest = without_tenant(&self.0);
        let mut parts = rest.rsplitn(3, ':');
        let _version = parts.next();
        let task = parts.next()?;
        parts.next().map(|_| task)
    }

    /// The version part, when the id is structured.
    pub fn version(&self) -> Option<&str> {
        let rest = without_tenant(&self.0);
        let mut parts = rest.rsplitn(3, ':');
        let version = parts.next()?;
        parts.next()?;
        parts.next().map(|_| version)
    }
}

impl fmt::Display for CustomId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for CustomId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for CustomId {
    type Error = CustomIdError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl From<CustomId> for String {
    fn from(id: CustomId) -> String {
        id.0
    }
}

/// An id split at its first `::`: the tenant and the rest. (`str::split_once("::")` says the
/// same, through a substring searcher whose setup costs more than these short ids' scan.)
fn split_tenant(id: &str) -> Option<(&str, &str)> {
    let bytes = id.as_bytes();
    let at = bytes.windows(2).position(|pair| pair == b"::")?;
    Some((&id[..at], &id[at + 2..]))
}

/// An id without its `tenant::` prefix.
fn without_tenant(id: &str) -> &str {
    split_tenant(id).map_or(id, |(_, rest)| rest)
}

/// The key of an id: everything before `:task:version` (after the tenant), or the whole id.
fn key_part(id: &str) -> &str {
    let rest = without_tenant(id);
    match rest.rsplitn(3, ':').nth(2) {
        Some(key) => key,
        None => rest,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structured_id_splits_from_the_right() {
        let id = CustomId::parse("ticket:84291:intent:v3").unwrap();
        assert_eq!(id.key(), "ticket:84291");
        assert_eq!(id.task(), Some("intent"));
        assert_eq!(id.version(), Some("v3"));
        assert_eq!(id.tenant(), None);
    }

    #[test]
    fn tenant_prefix() {
        let id = CustomId::compose(Some("acme"), "doc:7", "summary", "v1").unwrap();
        assert_eq!(id.as_str(), "acme::doc:7:summary:v1");
        assert_eq!(id.tenant(), Some("acme"));
        assert_eq!(id.key(), "doc:7");
        assert_eq!(id.task(), Some("summary"));
    }

    #[test]
    fn opaque_id_is_its_own_key() {
        let id = CustomId::parse("request-17").unwrap();
        assert_eq!(id.key(), "request-17");
        assert_eq!(id.task(), None);
        assert_eq!(id.version(), None);
    }

    #[test]
    fn rejects_empty_parts_and_control_characters() {
        assert_eq!(CustomId::parse(""), Err(CustomIdError::Empty));
        assert_eq!(CustomId::parse("a:b:"), Err(CustomIdError::EmptyPart("version")));
        assert_eq!(CustomId::parse("a:::b"), Err(CustomIdError::EmptyPart("task")));
        assert_eq!(CustomId::parse("k:t::v"), Err(CustomIdError::ColonInPart("tenant")));
        assert_eq!(CustomId::parse("acme::b").unwrap().key(), "b");
        assert_eq!(CustomId::parse(":b:c"), Err(CustomIdError::EmptyPart("key")));
        assert_eq!(CustomId::parse("a::b::c:d"), Err(CustomIdError::EmptyPart("key")));
        assert_eq!(CustomId::parse("::k:t:v"), Err(CustomIdError::EmptyPart("tenant")));
        assert_eq!(CustomId::parse("a\nb"), Err(CustomIdError::ControlCharacter));
        assert_eq!(CustomId::compose(None, "k", "", "v1"), Err(CustomIdError::EmptyPart("task")));
        assert_eq!(
            CustomId::compose(None, "a::b", "t", "v1"),
            Err(CustomIdError::EmptyPart("key"))
        );
        assert_eq!(
            CustomId::compose(Some("a:b"), "k", "t", "v1"),
            Err(CustomIdError::ColonInPart("tenant"))
        );
        assert_eq!(CustomId::compose(None, "k", "t", "v1").unwrap().as_str(), "k:t:v1");
        assert_eq!(
            CustomId::compose(None, "k", "t:x", "v1"),
            Err(CustomIdError::ColonInPart("task"))
        );
        assert_eq!(CustomId::parse(&"x".repeat(513)), Err(CustomIdError::TooLong));
    }

    /// `key_in` gives what parsing and `key` give, and refuses what parsing refuses.
    #[test]
    fn key_in_agrees_with_parse_and_key() {
        for s in [
            "ticket:84291:intent:v3",
            "acme::doc:7:t:v1",
            "request-17",
            "acme::b",
            "a:b:c",
            "café:t:v1",
            "a::b:c:d",
        ] {
            assert_eq!(CustomId::key_in(s), Ok(CustomId::parse(s).unwrap().key()), "{s}");
        }
        assert_eq!(CustomId::key_in("acme::doc:7:t:v1"), Ok("doc:7"));
        // Control characters, ASCII and not (U+0085 is one of C1's).
        for s in ["", "a:b:", ":b:c", "a\nb", "a\u{7f}b", "caf\u{e9}\u{85}", "::k:t:v", "k:t::v"] {
            assert_eq!(CustomId::key_in(s), CustomId::parse(s).map(|_| s), "{s}");
            assert!(CustomId::key_in(s).is_err(), "{s}");
        }
    }

    #[test]
    fn ids_round_trip_through_strings() {
        let job = JobId::new();
        assert_eq!(job.to_string().parse::<JobId>().unwrap(), job);
        assert!(job.to_string().starts_with("job_"));
        let tranche = TrancheId::new();
        assert_eq!(tranche.to_string().parse::<TrancheId>().unwrap(), tranche);
        assert!("job_nope".parse::<JobId>().is_err());
        let token = LeaseToken::new();
        assert!(token.to_string().starts_with("ls_"));
        assert_eq!(token.to_string().parse::<LeaseToken>().unwrap(), token);
        assert!(tranche.to_string().parse::<JobId>().is_err());
    }

    #[test]
    fn accounts_name_provider_and_location() {
        let a = AccountId::new(crate::ProviderKind::Azure, "https://r.openai.azure.com/");
        assert_eq!(a.as_str(), "azure https://r.openai.azure.com");
        assert_eq!(a, AccountId::new(crate::ProviderKind::Azure, "https://r.openai.azure.com"));
        assert_ne!(a, AccountId::new(crate::ProviderKind::Openai, "https://r.openai.azure.com"));
    }

    #[test]
    fn engine_ids_name_host_and_process_and_differ_per_engine() {
        let a = EngineId::new("host-1", 42);
        let b = EngineId::new("host-1", 42);
        assert!(a.as_str().starts_with("host-1:42:"), "{a}");
        assert_ne!(a, b);
        assert_eq!(EngineId::from_stored(a.as_str()), a);
    }
}
