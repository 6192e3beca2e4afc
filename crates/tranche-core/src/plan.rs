//! Planning: grouping requests by provider + endpoint + model and cutting them into
//! tranches within a provider's count and byte limits.

use std::collections::BTreeMap;

use crate::{Endpoint, ProviderKind};

/// How large one provider batch may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrancheLimits {
    /// Requests per batch.
    pub max_requests: usize,
    /// Bytes of the batch's input (JSONL with newlines, or the request body).
    pub max_bytes: u64,
}

impl TrancheLimits {
    /// OpenAI: 50,000 requests and 200 MB (209,715,200 bytes) per input file.
    pub const OPENAI: TrancheLimits =
        TrancheLimits { max_requests: 50_000, max_bytes: 209_715_200 };

    /// The provider's own ceiling.
    pub fn for_provider(provider: ProviderKind) -> Self {
        match provider {
            ProviderKind::Openai => Self::OPENAI,
            // Azure: 100,000 requests and 200 MB per file.
            ProviderKind::Azure => Self { max_requests: 100_000, max_bytes: 200 * 1024 * 1024 },
            // Anthropic: 100,000 requests or 256 MB of request body. Lines are joined into
            // `{"requests":[...]}`, whose wrapping this reserves.
            ProviderKind::Anthropic => {
                Self { max_requests: 100_000, max_bytes: 256 * 1024 * 1024 - 64 }
            }
        }
    }

    /// Lowers the provider's limits to the configured ones; never raises them.
    pub fn lowered(self, max_requests: Option<usize>, max_bytes: Option<u64>) -> Self {
        Self {
            max_requests: max_requests.map_or(self.max_requests, |n| n.clamp(1, self.max_requests)),
            max_bytes: max_bytes.map_or(self.max_bytes, |n| n.clamp(1, self.max_bytes)),
        }
    }
}

/// Requests that may share a batch: one provider, one endpoint, one model.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupKey {
    pub provider: ProviderKind,
    pub endpoint: Endpoint,
    pub model: String,
}

/// One request to plan: its group, its encoded size, and whatever the caller tracks it by.
#[derive(Debug, Clone)]
pub struct PlanItem<T> {
    pub group: GroupKey,
    pub bytes: u64,
    pub item: T,
}

/// A cut tranche.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedTranche<T> {
    pub group: GroupKey,
    pub items: Vec<T>,
    pub bytes: u64,
}

/// A single request larger than a whole tranche may be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a request of {bytes} bytes exceeds the {max} byte limit of one batch")]
pub struct TooLarge {
    pub bytes: u64,
    pub max: u64,
}

/// A streaming planner: push items, collect tranches as they fill, flush the rest.
#[derive(Debug)]
pub struct Planner<T> {
    limits: TrancheLimits,
    open: BTreeMap<GroupKey, PlannedTranche<T>>,
}

impl<T> Planner<T> {
    pub fn new(limits: TrancheLimits) -> Self {
        Self { limits, open: BTreeMap::new() }
    }

    /// Adds an item; returns the tranche it closed, if adding it would have overflowed one.
    pub fn push(&mut self, item: PlanItem<T>) -> Result<Option<PlannedTranche<T>>, TooLarge> {
        if item.bytes > self.limits.max_bytes {
            return Err(TooLarge { bytes: item.bytes, max: self.limits.max_bytes });
        }
        let mut sealed = None;
        if let Some(open) = self.open.get(&item.group) {
            let full = open.items.len() >= self.limits.max_requests
                || open.bytes + item.bytes > self.limits.max_bytes;
            if full {
                sealed = self.open.remove(&item.group);
            }
        }
        let open = self.open.entry(item.group.clone()).or_insert_with(|| PlannedTranche {
            group: item.group,
            items: Vec::new(),
            bytes: 0,
        });
        open.bytes += item.bytes;
        open.items.push(item.item);
        Ok(sealed)
    }

    /// The tranches still open, in group order.
    pub fn finish(self) -> Vec<PlannedTranche<T>> {
        self.open.into_values().collect()
    }
}

/// Plans a whole set at once.
pub fn plan<T>(
    items: impl IntoIterator<Item = PlanItem<T>>,
    limits: TrancheLimits,
) -> Result<Vec<PlannedTranche<T>>, TooLarge> {
    let mut planner = Planner::new(limits);
    let mut out = Vec::new();
    for item in items {
        out.extend(planner.push(item)?);
    }
    out.extend(planner.finish());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(model: &str) -> GroupKey {
        GroupKey {
            provider: ProviderKind::Openai,
            endpoint: Endpoint::ChatCompletions,
            model: model.into(),
        }
    }

    fn items(n: usize, bytes: u64, model: &str) -> impl Iterator<Item = PlanItem<usize>> + '_ {
        (0..n).map(move |i| PlanItem { group: group(model), bytes, item: i })
    }

    fn sizes<T>(tranches: &[PlannedTranche<T>]) -> Vec<usize> {
        tranches.iter().map(|t| t.items.len()).collect()
    }

    #[test]
    fn exactly_fifty_thousand_is_one_tranche() {
        let tranches = plan(items(50_000, 100, "m"), TrancheLimits::OPENAI).unwrap();
        assert_eq!(sizes(&tranches), vec![50_000]);
    }

    #[test]
    fn fifty_thousand_and_one_is_two() {
        let tranches = plan(items(50_001, 100, "m"), TrancheLimits::OPENAI).unwrap();
        assert_eq!(sizes(&tranches), vec![50_000, 1]);
        assert_eq!(tranches[1].items, vec![50_000]);
    }

    #[test]
    fn byte_limit_is_exact() {
        // 209,715,200 = 2,048 × 102,400: exactly full.
        let tranches = plan(items(2_048, 102_400, "m"), TrancheLimits::OPENAI).unwrap();
        assert_eq!(sizes(&tranches), vec![2_048]);
        assert_eq!(tranches[0].bytes, 209_715_200);
        // One byte more spills one request into a second tranche.
        let mut all: Vec<_> = items(2_047, 102_400, "m").collect();
        all.push(PlanItem { group: group("m"), bytes: 102_401, item: 2_047 });
        let tranches = plan(all, TrancheLimits::OPENAI).unwrap();
        assert_eq!(sizes(&tranches), vec![2_047, 1]);
    }

    #[test]
    fn never_two_models_in_one_tranche() {
        let all = items(3, 10, "a").chain(items(2, 10, "b")).chain(items(1, 10, "a"));
        let tranches = plan(all, TrancheLimits::OPENAI).unwrap();
        assert_eq!(tranches.len(), 2);
        assert_eq!(tranches[0].group.model, "a");
        assert_eq!(sizes(&tranches), vec![4, 2]);
    }

    #[test]
    fn configured_limits_only_lower() {
        let limits = TrancheLimits::OPENAI.lowered(Some(3), Some(1 << 40));
        assert_eq!(limits, TrancheLimits { max_requests: 3, max_bytes: 209_715_200 });
        let tranches = plan(items(7, 1, "m"), limits).unwrap();
        assert_eq!(sizes(&tranches), vec![3, 3, 1]);
    }

    #[test]
    fn an_oversized_request_is_an_error() {
        let limits = TrancheLimits { max_requests: 10, max_bytes: 100 };
        let err = plan(items(1, 101, "m"), limits).unwrap_err();
        assert_eq!(err, TooLarge { bytes: 101, max: 100 });
    }
}
