//! `GET /metrics`: the deployment's figures in Prometheus' text exposition format (version
//! 0.0.4), written by hand from the app's typed snapshot (`App::metrics`), read afresh from the
//! store on every scrape. No recorder and no global state, so any number of servers share a
//! process; and a counter can carry dollars (the `metrics` crate's counters are whole numbers).
//!
//! Gauges: `tranche_jobs{state}`, `tranche_requests{state}`, `tranche_tranches{state}` (every
//! state, zeros included) and `tranche_upstream_errors{carrier,provider,code}` (jobs and
//! tranches carrying a provider's error now, apart, since one failure is often on both).
//! Counters: `tranche_tokens_total{provider,model,kind}` (billed tokens; `input` counts every
//! input token, `cached_input` and `cache_write` are parts of it) and
//! `tranche_cost_usd_total{provider,model}` (the batch bill, for priced models only).

use std::fmt::Write;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use tranche_app::Metrics;

use crate::ApiState;
use crate::error::{ApiError, ErrorBody};

/// The exposition format's content type.
pub const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `GET /metrics`: no token, like `/healthz`.
#[utoipa::path(get, path = "/metrics", tag = "health",
    responses((status = 200, description = "Prometheus text exposition (0.0.4)",
               content_type = "text/plain; version=0.0.4; charset=utf-8", body = String),
              (status = 500, body = ErrorBody)))]
pub async fn metrics(State(state): State<ApiState>) -> Result<Response, ApiError> {
    let metrics = state.app.metrics(&state.prices).await?;
    Ok(([(CONTENT_TYPE, TEXT_FORMAT)], render(&metrics)).into_response())
}

/// The figures as exposition text: each family's `# HELP` and `# TYPE` lines, then its
/// samples, one a line.
pub fn render(metrics: &Metrics) -> String {
    let mut out = String::new();
    family(&mut out, "tranche_jobs", "gauge", "Jobs in each state.");
    for (state, n) in &metrics.jobs {
        sample(&mut out, "tranche_jobs", &[("state", state.as_str())], n);
    }
    family(
        &mut out,
        "tranche_requests",
        "gauge",
        "Requests in each state, summed over every job (pruned jobs included).",
    );
    for (state, n) in &metrics.requests {
        sample(&mut out, "tranche_requests", &[("state", state.as_str())], n);
    }
    family(&mut out, "tranche_tranches", "gauge", "Tranches (provider batches) in each state.");
    for (state, n) in &metrics.tranches {
        sample(&mut out, "tranche_tranches", &[("state", state.as_str())], n);
    }
    family(
        &mut out,
        "tranche_upstream_errors",
        "gauge",
        "Jobs and tranches (carrier) carrying a provider's error now, by provider and code \
         (the provider's code, else its error type, else none).",
    );
    for e in &metrics.upstream_errors {
        let labels =
            [("carrier", e.carrier.as_str()), ("provider", &e.provider), ("code", &e.code)];
        sample(&mut out, "tranche_upstream_errors", &labels, e.count);
    }
    family(
        &mut out,
        "tranche_tokens_total",
        "counter",
        "Tokens providers billed, by kind: input counts every input token, cached_input \
         (read from the prompt cache) and cache_write (written to it) are parts of it.",
    );
    for m in &metrics.models {
        let kinds = [
            ("input", m.tokens.input),
            ("cached_input", m.tokens.cached_input),
            ("cache_write", m.tokens.cache_write_input),
            ("output", m.tokens.output),
        ];
        for (kind, n) in kinds {
            let labels = [("provider", m.provider.as_str()), ("model", &m.model), ("kind", kind)];
            sample(&mut out, "tranche_tokens_total", &labels, n);
        }
    }
    family(
        &mut out,
        "tranche_cost_usd_total",
        "counter",
        "What providers billed in USD at the deployment's prices, for models the price table \
         prices.",
    );
    for m in &metrics.models {
        if let Some(usd) = m.cost_usd {
            let labels = [("provider", m.provider.as_str()), ("model", m.model.as_str())];
            sample(&mut out, "tranche_cost_usd_total", &labels, Float(usd));
        }
    }
    out
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let help = help.replace('\\', r"\\").replace('\n', r"\n");
    // Writing to a String cannot fail.
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (label, value)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(label);
            out.push_str("=\"");
            escape_label_value(out, value);
            out.push('"');
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

/// A label value as the format requires: backslash, double quote and line feed escaped.
fn escape_label_value(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str(r"\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str(r"\n"),
            c => out.push(c),
        }
    }
}

/// A float as the format writes one: `NaN`, `+Inf`, `-Inf`, or the shortest decimal that
/// reads back as the same number.
struct Float(f64);

impl std::fmt::Display for Float {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            v if v.is_nan() => f.write_str("NaN"),
            v if v == f64::INFINITY => f.write_str("+Inf"),
            v if v == f64::NEG_INFINITY => f.write_str("-Inf"),
            v => write!(f, "{v}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use tranche_app::{ErrorCarrier, ModelUsage, TokenCounts, UpstreamErrorCount};
    use tranche_core::{JobState, ProviderKind, RequestState, TrancheState};

    use super::*;

    fn metrics() -> Metrics {
        let tokens =
            TokenCounts { input: 1_000, cached_input: 200, cache_write_input: 0, output: 50 };
        Metrics {
            jobs: vec![(JobState::Running, 1), (JobState::Done, 2)],
            requests: vec![(RequestState::Succeeded, 7)],
            tranches: vec![(TrancheState::Submitted, 1)],
            upstream_errors: vec![UpstreamErrorCount {
                carrier: ErrorCarrier::Tranche,
                provider: "azure".into(),
                code: "quota\"Exceeded\\\n".into(),
                count: 2,
            }],
            models: vec![
                ModelUsage {
                    provider: ProviderKind::Openai,
                    model: "gpt-4o-mini".into(),
                    tokens,
                    cost_usd: Some(0.000_012_5),
                },
                ModelUsage {
                    provider: ProviderKind::Anthropic,
                    model: "house \"model\"".into(),
                    tokens,
                    cost_usd: None,
                },
            ],
        }
    }

    #[test]
    fn every_family_has_help_and_type_and_samples_follow_it() {
        let text = render(&metrics());
        let expected = r#"# HELP tranche_jobs Jobs in each state.
# TYPE tranche_jobs gauge
tranche_jobs{state="running"} 1
tranche_jobs{state="done"} 2
# HELP tranche_requests Requests in each state, summed over every job (pruned jobs included).
# TYPE tranche_requests gauge
tranche_requests{state="succeeded"} 7
# HELP tranche_tranches Tranches (provider batches) in each state.
# TYPE tranche_tranches gauge
tranche_tranches{state="submitted"} 1
# HELP tranche_upstream_errors Jobs and tranches (carrier) carrying a provider's error now, by provider and code (the provider's code, else its error type, else none).
# TYPE tranche_upstream_errors gauge
tranche_upstream_errors{carrier="tranche",provider="azure",code="quota\"Exceeded\\\n"} 2
# HELP tranche_tokens_total Tokens providers billed, by kind: input counts every input token, cached_input (read from the prompt cache) and cache_write (written to it) are parts of it.
# TYPE tranche_tokens_total counter
tranche_tokens_total{provider="openai",model="gpt-4o-mini",kind="input"} 1000
tranche_tokens_total{provider="openai",model="gpt-4o-mini",kind="cached_input"} 200
tranche_tokens_total{provider="openai",model="gpt-4o-mini",kind="cache_write"} 0
tranche_tokens_total{provider="openai",model="gpt-4o-mini",kind="output"} 50
tranche_tokens_total{provider="anthropic",model="house \"model\"",kind="input"} 1000
tranche_tokens_total{provider="anthropic",model="house \"model\"",kind="cached_input"} 200
tranche_tokens_total{provider="anthropic",model="house \"model\"",kind="cache_write"} 0
tranche_tokens_total{provider="anthropic",model="house \"model\"",kind="output"} 50
# HELP tranche_cost_usd_total What providers billed in USD at the deployment's prices, for models the price table prices.
# TYPE tranche_cost_usd_total counter
tranche_cost_usd_total{provider="openai",model="gpt-4o-mini"} 0.0000125
"#;
        assert_eq!(text, expected);
        // The escaped label value is one line: no sample is broken across lines.
        assert!(text.lines().all(|l| l.starts_with("# ") || l.starts_with("tranche_")));
    }

    #[test]
    fn help_text_and_floats_are_written_as_the_format_reads_them() {
        let mut out = String::new();
        family(&mut out, "x", "gauge", "a \\ b\nc");
        assert_eq!(out, "# HELP x a \\\\ b\\nc\n# TYPE x gauge\n");
        let floats: Vec<String> = [0.1, 1e21, 1e-9, f64::NAN, f64::INFINITY, f64::NEG_INFINITY]
            .into_iter()
            .map(|v| Float(v).to_string())
            .collect();
        assert_eq!(floats, ["0.1", "1000000000000000000000", "0.000000001", "NaN", "+Inf", "-Inf"]);
    }

    #[test]
    fn an_empty_family_keeps_its_help_and_type() {
        let empty = Metrics { upstream_errors: Vec::new(), models: Vec::new(), ..metrics() };
        let text = render(&empty);
        for name in ["tranche_upstream_errors", "tranche_tokens_total", "tranche_cost_usd_total"] {
            assert!(text.contains(&format!("# TYPE {name} ")), "{name}");
            assert!(!text.contains(&format!("\n{name}{{")), "{name} has no samples");
        }
    }
}
