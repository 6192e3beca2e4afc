//! What jobs cost: the usage ledger priced by the price table (bundled, under the user's
//! file), for one job or for a period; and the worst case of an input file before it runs.
//!
//! `cost` is what the providers bill; `sync_cost` what the same tokens would cost synchronously
//! without caching; `savings.cache` what caching saved at synchronous prices; `savings.batch`
//! the rest (`sync_cost - savings.cache - cost`); `savings.dedup` the synchronous price of the
//! requests answered from earlier results (not part of `sync_cost`). A model the table does
//! not price is listed in `unpriced_models` and its cost is unknown: then the amounts it enters
//! (the bill and its savings, or the dedup saving) are `null`, never a partial sum passed off as
//! the whole.

use std::io::BufRead;
use std::path::Path;

use serde::Serialize;
use tranche_core::estimate::Estimate;
use tranche_core::input::{ErrorCollector, InputParser};
use tranche_core::price::{Costs, PriceTable, costs};
use tranche_core::{JobSettings, ProviderKind, TokenUsage};
use tranche_store::{JobRecord, UsageKind, UsageRow};

use crate::App;
use crate::error::AppError;

/// Tokens by kind, as a cost report shows them. Printed as JSON: exact keys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TokenCounts {
    /// Every input token, cached and cache-written included.
    pub input: u64,
    /// Input read from the prompt cache.
    pub cached_input: u64,
    /// Input written to the prompt cache.
    pub cache_write_input: u64,
    pub output: u64,
}

impl From<TokenUsage> for TokenCounts {
    fn from(t: TokenUsage) -> Self {
        Self {
            input: t.input,
            cached_input: t.cached_input,
            cache_write_input: t.cache_write(),
            output: t.output,
        }
    }
}

/// What batching, caching and answering from earlier results saved, in USD.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Savings {
    pub batch: Option<f64>,
    pub cache: Option<f64>,
    pub dedup: Option<f64>,
}

/// One model's part of a report (for the table a person reads).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelCost {
    pub provider: ProviderKind,
    pub model: String,
    /// Billed attempts.
    pub requests: u64,
    pub tokens: TokenUsage,
    /// `None` when the table has no price for the model.
    pub costs: Option<Costs>,
}

/// The amounts a report shows, whatever it covers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CostTotals {
    pub currency: &'static str,
    pub tokens: TokenCounts,
    pub cost: Option<f64>,
    pub sync_cost: Option<f64>,
    pub savings: Savings,
    pub unpriced_models: Vec<String>,
}

/// A job's cost (`tranche cost JOB --json`: exact keys).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobCost {
    pub job_id: String,
    #[serde(flatten)]
    pub totals: CostTotals,
    /// By model, billed usage only; not part of the JSON.
    #[serde(skip)]
    pub by_model: Vec<ModelCost>,
}

/// A period's cost over every job, or one tenant's (`tranche cost --since DATE`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PeriodCost {
    /// The first day counted (`YYYY-MM-DD`, UTC).
    pub since: String,
    pub tenant: Option<String>,
    #[serde(flatten)]
    pub totals: CostTotals,
    #[serde(skip)]
    pub by_model: Vec<ModelCost>,
}

/// The worst case of an input file (`tranche cost estimate FILE --json`: exact keys), with the
/// monthly projection when asked.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FileEstimate {
    pub requests: u64,
    pub input_tokens: u64,
    pub max_output_tokens: u64,
    pub cost_max: Option<f64>,
    pub sync_cost_max: Option<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unpriced_models: Vec<String>,
    /// Requests no worst case holds (images, audio, files).
    #[serde(skip_serializing_if = "is_zero")]
    pub unbounded_requests: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub monthly: Option<Monthly>,
}

/// The seed's monthly formula: `runs × (input × input price × (1 − hit rate × cache saving) ×
/// batch + output × output price × batch)`, at the file's worst-case output.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Monthly {
    pub runs: f64,
    pub cache_hit_rate: f64,
    /// `None` when a model is unpriced or the file mixes models.
    pub cost: Option<f64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Prices the ledger's rows: billed rows make the cost, reused rows the dedup saving.
pub(crate) fn price_rows(rows: &[UsageRow], prices: &PriceTable) -> (CostTotals, Vec<ModelCost>) {
    let mut billed = TokenUsage::default();
    let mut total = Costs::default();
    let mut dedup = 0.0;
    let mut unpriced: Vec<String> = Vec::new();
    // Which amounts an unpriced model leaves unknown: the bill, the dedup saving, or both.
    let (mut bill_known, mut dedup_known) = (true, true);
    let mut by_model = Vec::new();
    for row in rows {
        let priced = prices
            .lookup(row.provider, &row.model)
            .map(|price| costs(&row.tokens, &price, &prices.rules(row.provider)));
        if priced.is_none() {
            match row.kind {
                UsageKind::Billed => bill_known = false,
                UsageKind::Reused => dedup_known = false,
            }
            if !unpriced.contains(&row.model) {
                unpriced.push(row.model.clone());
            }
        }
        match row.kind {
            UsageKind::Billed => {
                billed += row.tokens;
                if let Some(c) = priced {
                    total += c;
                }
                by_model.push(ModelCost {
                    provider: row.provider,
                    model: row.model.clone(),
                    requests: row.requests,
                    tokens: row.tokens,
                    costs: priced,
                });
            }
            UsageKind::Reused => dedup += priced.map_or(0.0, |c| c.sync_cost),
        }
    }
    let known = |v: f64| bill_known.then_some(v);
    let totals = CostTotals {
        currency: "USD",
        tokens: billed.into(),
        cost: known(total.cost),
        sync_cost: known(total.sync_cost),
        savings: Savings {
            batch: known(total.batch_savings()),
            cache: known(total.cache_savings()),
            dedup: dedup_known.then_some(dedup),
        },
        unpriced_models: unpriced,
    };
    (totals, by_model)
}

/// The day a `YYYY-MM-DD` date names, as unix seconds of its UTC midnight.
pub fn parse_day(text: &str) -> Result<i64, AppError> {
    let text = text.trim();
    let bad = || AppError::Config(format!("`{text}` is not a date: give one as YYYY-MM-DD"));
    let shaped = text.len() == 10
        && text
            .bytes()
            .enumerate()
            .all(|(i, b)| if i == 4 || i == 7 { b == b'-' } else { b.is_ascii_digit() });
    if !shaped {
        return Err(bad());
    }
    let midnight = humantime::parse_rfc3339(&format!("{text}T00:00:00Z")).map_err(|_| bad())?;
    let since_epoch = midnight.duration_since(std::time::UNIX_EPOCH).map_err(|_| bad())?;
    i64::try_from(since_epoch.as_secs()).map_err(|_| bad())
}

impl App {
    /// A job's cost, from the usage ledger (a few rows, whatever the job's size).
    pub async fn job_cost(
        &self,
        job: &JobRecord,
        prices: &PriceTable,
    ) -> Result<JobCost, AppError> {
        let rows = self.store.job_usage(job.id).await?;
        let (totals, by_model) = price_rows(&rows, prices);
        Ok(JobCost { job_id: job.id.to_string(), totals, by_model })
    }

    /// The cost of everything recorded from the day `since` (`YYYY-MM-DD`, UTC) on, over
    /// every job or one tenant's.
    pub async fn period_cost(
        &self,
        since: &str,
        tenant: Option<&str>,
        prices: &PriceTable,
    ) -> Result<PeriodCost, AppError> {
        let day = parse_day(since)?;
        let rows = self.store.usage_since(day, tenant).await?;
        let (totals, by_model) = price_rows(&rows, prices);
        Ok(PeriodCost {
            since: since.trim().to_owned(),
            tenant: tenant.map(str::to_owned),
            totals,
            by_model,
        })
    }
}

/// The worst case of the input file at `path` read as `settings` say for `provider`: every
/// request's input tokens counted offline and its output bounded by its `max_tokens` (or the
/// model's maximum); with `per_month` (runs a month, cache hit rate), the monthly projection.
/// A file with a bad line is refused whole, as submit refuses it.
pub fn estimate_file(
    path: &Path,
    provider: ProviderKind,
    settings: &JobSettings,
    prices: &PriceTable,
    per_month: Option<(f64, f64)>,
) -> Result<FileEstimate, AppError> {
    let file = std::fs::File::open(path)
        .map_err(|source| AppError::Read { path: path.to_owned(), source })?;
    let mut parser = InputParser::new(settings.input_options(provider));
    let mut errors = ErrorCollector::default();
    let mut estimate = Estimate::new();
    // The monthly formula prices one model: the file's, when it names only one.
    let mut model: Option<Option<String>> = None;
    for line in std::io::BufReader::new(file).lines() {
        let line = line.map_err(|source| AppError::Read { path: path.to_owned(), source })?;
        match parser.next_line(&line) {
            Ok(Some(request)) => {
                let body: serde_json::Value = serde_json::from_str(&request.body)
                    .map_err(|e| AppError::Corrupt(e.to_string()))?;
                estimate.add(provider, request.endpoint, &request.model, &body, prices);
                match &model {
                    None => model = Some(Some(request.model)),
                    Some(Some(m)) if *m != request.model => model = Some(None),
                    Some(_) => {}
                }
            }
            Ok(None) => {}
            Err(e) => errors.push(e),
        }
    }
    errors.finish().map_err(AppError::Rejected)?;
    let monthly = per_month.map(|(runs, cache_hit_rate)| {
        let cost = model
            .flatten()
            .and_then(|m| prices.lookup(provider, &m))
            .filter(|_| estimate.unpriced_models.is_empty())
            .map(|price| {
                tranche_core::estimate::monthly(
                    estimate.input_tokens,
                    estimate.max_output_tokens,
                    runs,
                    cache_hit_rate,
                    &price,
                    &prices.rules(provider),
                )
            });
        Monthly { runs, cache_hit_rate, cost }
    });
    Ok(FileEstimate {
        requests: estimate.requests,
        input_tokens: estimate.input_tokens,
        max_output_tokens: estimate.max_output_tokens,
        cost_max: estimate.cost_max,
        sync_cost_max: estimate.sync_cost_max,
        unpriced_models: estimate.unpriced_models,
        unbounded_requests: estimate.unbounded_requests,
        monthly,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_are_parsed_strictly() {
        assert_eq!(parse_day("1970-01-01").unwrap(), 0);
        assert_eq!(parse_day("2026-12-01").unwrap(), 1_796_083_200);
        assert_eq!(parse_day("2024-02-29").unwrap(), 1_709_164_800);
        for bad in ["2023-02-29", "2026-13-01", "2026-1-01", "yesterday", "2026-12-01T00"] {
            let e = parse_day(bad).unwrap_err().to_string();
            assert!(e.contains("YYYY-MM-DD"), "{bad}: {e}");
        }
    }

    #[test]
    fn rows_are_priced_and_unknown_models_are_unknown() {
        let prices = PriceTable::bundled();
        let tokens = TokenUsage { input: 1_000_000, output: 1_000_000, ..TokenUsage::default() };
        let row = |kind, model: &str| UsageRow {
            kind,
            provider: ProviderKind::Openai,
            model: model.to_owned(),
            requests: 1,
            tokens,
        };
        // gpt-4o-mini: $0.15 in and $0.60 out per million, half in a batch.
        let (totals, by_model) = price_rows(
            &[row(UsageKind::Billed, "gpt-4o-mini"), row(UsageKind::Reused, "gpt-4o-mini")],
            &prices,
        );
        let close = |a: Option<f64>, b: f64| assert!((a.unwrap() - b).abs() < 1e-12, "{a:?} {b}");
        close(totals.cost, 0.375);
        close(totals.sync_cost, 0.75);
        close(totals.savings.batch, 0.375);
        close(totals.savings.cache, 0.0);
        close(totals.savings.dedup, 0.75);
        assert_eq!(totals.tokens.input, 1_000_000, "reused tokens are not billed tokens");
        assert_eq!(by_model.len(), 1);
        let (totals, _) = price_rows(
            &[row(UsageKind::Billed, "gpt-4o-mini"), row(UsageKind::Billed, "house-model")],
            &prices,
        );
        assert_eq!(totals.unpriced_models, ["house-model"]);
        assert_eq!((totals.cost, totals.sync_cost, totals.savings.batch), (None, None, None));
        assert_eq!(totals.tokens.input, 2_000_000);
        // A model unpriced only among reused answers leaves the bill known.
        let (totals, _) = price_rows(
            &[row(UsageKind::Billed, "gpt-4o-mini"), row(UsageKind::Reused, "house-model")],
            &prices,
        );
        close(totals.cost, 0.375);
        assert_eq!((totals.savings.dedup, totals.unpriced_models.len()), (None, 1));
    }
}
