//! One conformance suite, run against `tranche-sim` for every adapter (OpenAI, Azure v1, Azure
//! legacy, Anthropic): the full lifecycle driven provider-neutrally through the `Provider` trait on
//! a virtual clock, list pagination, cancel, results matched by wire id in shuffled order, and each
//! upstream error (401, 404, 413, 429 with Retry-After, 500, 529, quotaExceeded) arriving as the
//! right `UpstreamError` with the right classification.
//!
//! Adding a provider is a `Target` variant, its setup function, and one `conformance!` line.

#![cfg(test)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use secrecy::SecretString;
use serde_json::value::RawValue;
use tranche_core::{Endpoint, ProviderKind, TrancheId};
use tranche_providers::{
    AnthropicConfig, AnthropicProvider, AzureConfig, AzureProvider, BatchId, BatchInput,
    BatchStatus, CreateBatch, ErrorKind, FileId, InlineInput, InputTransport, LineOutcome,
    OpenAiConfig, OpenAiProvider, Provider, ProviderFiles, RemoteBatch, RetryPolicy, UpstreamError,
    http_client,
};
use tranche_sim::{HttpFault, SimConfig, SimHandle, Simulator};

const KEY: &str = "sk-conformance-key-0123456789";
const WRONG_KEY: &str = "sk-wrong-key-abcdefghijklmnop";
const DEPLOYMENT: &str = "gpt-4o-mini-batch";
const LEGACY_VERSION: &str = "2024-10-21";

/// Reads and deletes retry fast here, and hand any Retry-After over 100 ms to the caller.
const FAST_RETRY: RetryPolicy = RetryPolicy {
    max_attempts: 3,
    base_delay: Duration::from_millis(1),
    max_delay: Duration::from_millis(100),
};

/// One adapter configuration under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    OpenAi,
    AzureV1,
    AzureLegacy,
    Anthropic,
}

/// Builds a target's adapter against a running simulator.
type Setup = fn(&SimHandle, Options) -> Box<dyn Provider>;

/// Knobs a test may turn on an adapter.
#[derive(Debug, Clone, Copy)]
struct Options {
    key: &'static str,
    /// Upload input files with the target's default expiry (else without one).
    file_expiry: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self { key: KEY, file_expiry: true }
    }
}

fn setup_openai(sim: &SimHandle, options: Options) -> Box<dyn Provider> {
    let mut config = OpenAiConfig::new(SecretString::from(options.key));
    config.base_url = sim.openai_base_url();
    if !options.file_expiry {
        config.file_expires_after = None;
    }
    Box::new(
        OpenAiProvider::new(config, http_client().unwrap()).unwrap().with_retry_policy(FAST_RETRY),
    )
}

fn azure_config(sim: &SimHandle, options: Options) -> AzureConfig {
    let mut config = AzureConfig::new(sim.azure_endpoint(), SecretString::from(options.key));
    if !options.file_expiry {
        config.file_expires_after = None;
    }
    config
}

fn setup_azure_v1(sim: &SimHandle, options: Options) -> Box<dyn Provider> {
    let config = azure_config(sim, options);
    Box::new(
        AzureProvider::new(config, http_client().unwrap()).unwrap().with_retry_policy(FAST_RETRY),
    )
}

fn setup_azure_legacy(sim: &SimHandle, options: Options) -> Box<dyn Provider> {
    let config =
        azure_config(sim, options).with_legacy_api_version(Some(LEGACY_VERSION.to_owned()));
    Box::new(
        AzureProvider::new(config, http_client().unwrap()).unwrap().with_retry_policy(FAST_RETRY),
    )
}

fn setup_anthropic(sim: &SimHandle, options: Options) -> Box<dyn Provider> {
    let mut config = AnthropicConfig::new(SecretString::from(options.key));
    config.base_url = sim.anthropic_base_url();
    Box::new(
        AnthropicProvider::new(config, http_client().unwrap())
            .unwrap()
            .with_retry_policy(FAST_RETRY),
    )
}

impl Target {
    fn setup_fn(self) -> Setup {
        match self {
            Self::OpenAi => setup_openai,
            Self::AzureV1 => setup_azure_v1,
            Self::AzureLegacy => setup_azure_legacy,
            Self::Anthropic => setup_anthropic,
        }
    }

    fn kind(self) -> ProviderKind {
        match self {
            Self::OpenAi => ProviderKind::Openai,
            Self::AzureV1 | Self::AzureLegacy => ProviderKind::Azure,
            Self::Anthropic => ProviderKind::Anthropic,
        }
    }

    /// The provider name in the simulator's fault config.
    fn sim_name(self) -> &'static str {
        self.kind().as_str()
    }

    fn endpoint(self) -> Endpoint {
        match self {
            Self::Anthropic => Endpoint::AnthropicMessages,
            _ => Endpoint::ChatCompletions,
        }
    }

    /// A request body for this target (Azure names its deployment as the model).
    fn body(self, i: usize) -> Box<RawValue> {
        let text = match self {
            Self::OpenAi => format!(
                r#"{{"model":"gpt-4o-mini","messages":[{{"role":"user","content":"Classify ticket {i}"}}],"max_tokens":16}}"#
            ),
            Self::AzureV1 | Self::AzureLegacy => format!(
                r#"{{"model":"{DEPLOYMENT}","messages":[{{"role":"user","content":"Classify ticket {i}"}}],"max_tokens":16}}"#
            ),
            Self::Anthropic => format!(
                r#"{{"model":"claude-3-5-haiku-20241022","max_tokens":16,"messages":[{{"role":"user","content":"Classify ticket {i}"}}]}}"#
            ),
        };
        RawValue::from_string(text).unwrap()
    }

    /// The expiry the adapter puts on uploaded input files by default.
    fn default_file_expiry(self) -> Option<i64> {
        match self {
            Self::OpenAi => Some(604_800),
            Self::AzureV1 | Self::AzureLegacy => Some(1_209_600),
            Self::Anthropic => None,
        }
    }

    /// The simulator config: frozen clock, one key, and Azure's documented wire quirks on.
    fn sim_config(self) -> SimConfig {
        let mut config =
            SimConfig { speed: 0.0, api_key: Some(KEY.to_owned()), ..SimConfig::default() };
        config.azure.legacy_quirks = matches!(self, Self::AzureV1 | Self::AzureLegacy);
        config
    }

    /// A simulator configured by `change`, and this target's adapter for it.
    async fn setup_with(
        self,
        change: impl FnOnce(&mut SimConfig),
        options: Options,
    ) -> (SimHandle, Box<dyn Provider>) {
        let mut config = self.sim_config();
        change(&mut config);
        let sim = Simulator::spawn(config).await.unwrap();
        let provider = (self.setup_fn())(&sim, options);
        assert_eq!(provider.kind(), self.kind());
        (sim, provider)
    }

    async fn setup(self) -> (SimHandle, Box<dyn Provider>) {
        self.setup_with(|_| {}, Options::default()).await
    }

    /// A fault answering `status` on `operation` of this target's surface.
    fn fault(self, operation: &str, status: u16, retry_after: Option<u64>) -> HttpFault {
        let mut fault = HttpFault::status(self.sim_name(), operation, status);
        fault.retry_after = retry_after;
        fault
    }
}

// ---------------------------------------------------------------------------------------------
// Provider-neutral drivers

/// Writes `n` requests through the adapter's own line writer; returns their wire ids in order.
fn write_input(target: Target, provider: &dyn Provider, path: &Path, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut ids = Vec::new();
    for i in 0..n {
        let wire_id = format!("w{i:04}");
        tranche_core::codec::write_input_line(
            provider.kind(),
            &mut out,
            &wire_id,
            target.endpoint(),
            &target.body(i),
        );
        ids.push(wire_id);
    }
    std::fs::write(path, &out).unwrap();
    ids
}

/// A created batch and what went into it.
struct Submitted {
    tranche: TrancheId,
    input_file: Option<FileId>,
    batch: RemoteBatch,
    wire_ids: Vec<String>,
}

/// Writes `n` requests and creates a batch from them by the provider's transport.
async fn try_submit(
    target: Target,
    provider: &dyn Provider,
    dir: &Path,
    n: usize,
) -> Result<Submitted, UpstreamError> {
    let tranche = TrancheId::new();
    let path = dir.join(format!("tranche-{tranche}.jsonl"));
    let wire_ids = write_input(target, provider, &path, n);
    let (input_file, batch) = match provider.transport() {
        InputTransport::UploadFile => {
            let file = provider.upload_path(tranche, &path).await?;
            assert_eq!(file.filename, format!("tranche-{tranche}.jsonl"));
            assert_eq!(file.bytes, std::fs::metadata(&path).unwrap().len());
            assert_eq!(
                file.expires_at,
                target.default_file_expiry().map(|secs| file.created_at + secs)
            );
            let batch = provider
                .create_batch(CreateBatch {
                    tranche_id: tranche,
                    input: BatchInput::File(&file.id),
                    endpoint: target.endpoint(),
                })
                .await?;
            (Some(file.id), batch)
        }
        InputTransport::Inline => {
            let batch = provider
                .create_batch(CreateBatch {
                    tranche_id: tranche,
                    input: BatchInput::Inline(InlineInput::from_file(&path).await.unwrap()),
                    endpoint: target.endpoint(),
                })
                .await?;
            (None, batch)
        }
    };
    Ok(Submitted { tranche, input_file, batch, wire_ids })
}

async fn submit(target: Target, provider: &dyn Provider, dir: &Path, n: usize) -> Submitted {
    try_submit(target, provider, dir, n).await.unwrap()
}

/// Advances the virtual clock until the batch is terminal (bounded; no wall-clock sleeps).
async fn run_to_end(sim: &SimHandle, provider: &dyn Provider, id: &BatchId) -> RemoteBatch {
    for _ in 0..200 {
        let batch = provider.retrieve_batch(id).await.unwrap();
        if batch.status.is_terminal() {
            return batch;
        }
        sim.advance(5.0);
    }
    panic!("batch {id} did not finish");
}

/// Downloads every result a finished batch has (output and error files, or its `results_url`);
/// returns the files written.
async fn fetch_results(provider: &dyn Provider, batch: &RemoteBatch, dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for (id, name) in [(&batch.output_file_id, "output"), (&batch.error_file_id, "errors")] {
        if let Some(id) = id {
            let dest = dir.join(format!("{}-{name}.jsonl", batch.id));
            let written = provider.download_to(id, &dest).await.unwrap();
            assert_eq!(written, std::fs::metadata(&dest).unwrap().len());
            files.push(dest);
        }
    }
    if let Some(url) = &batch.results_url {
        let dest = dir.join(format!("{}-results.jsonl", batch.id));
        let written = provider.results_to(url, &dest).await.unwrap();
        assert_eq!(written, std::fs::metadata(&dest).unwrap().len());
        files.push(dest);
    }
    files
}

/// Every result line, and what it parses to, in file order.
fn parse_all(
    provider: &dyn Provider,
    files: &[PathBuf],
) -> Vec<(String, tranche_providers::ResultLine)> {
    files
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f).unwrap().lines().map(str::to_owned).collect::<Vec<_>>()
        })
        .map(|line| {
            let parsed =
                provider.parse_result_line(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
            (line, parsed)
        })
        .collect()
}

/// Checks the facts every HTTP error must keep (invariant 7) and that no key leaks (invariant 8).
fn assert_http_error(target: Target, err: &UpstreamError, status: u16, retryable: bool) {
    assert_eq!(err.provider, target.kind(), "{err}");
    assert_eq!(err.kind, ErrorKind::Http, "{err}");
    assert_eq!(err.status, Some(status), "{err}");
    assert_eq!(err.retryable(), retryable, "{err}");
    assert!(err.request_id.is_some(), "no request id: {err:?}");
    assert!(!err.message.is_empty(), "{err:?}");
    let text = err.to_string();
    let json = serde_json::to_string(err).unwrap();
    for secret in [KEY, WRONG_KEY] {
        assert!(!text.contains(secret) && !json.contains(secret), "{text}");
    }
    assert!(text.starts_with(target.kind().as_str()), "{text}");
}

// ---------------------------------------------------------------------------------------------
// The suite

async fn full_lifecycle(target: Target) {
    let (sim, provider) = target.setup().await;
    let provider = provider.as_ref();
    let dir = tempfile::tempdir().unwrap();
    let n = 24;
    let sub = submit(target, provider, dir.path(), n).await;

    // Created: not terminal; OpenAI-shaped batches carry the tranche id in their metadata.
    assert!(!sub.batch.status.is_terminal(), "{:?}", sub.batch.status);
    match provider.transport() {
        InputTransport::UploadFile => {
            assert_eq!(sub.batch.tranche_id(), Some(sub.tranche));
            assert_eq!(sub.batch.input_file_id, sub.input_file);
        }
        InputTransport::Inline => assert_eq!(sub.batch.tranche_id(), None),
    }
    assert!(sub.batch.created_at > 0);

    // Run on the virtual clock.
    let done = run_to_end(&sim, provider, &sub.batch.id).await;
    assert_eq!(done.status, BatchStatus::Completed);
    assert_eq!(done.request_counts.total, n as u64);
    assert_eq!(done.request_counts.completed, n as u64);
    assert_eq!(done.request_counts.failed, 0);

    // Results: every wire id exactly once, in an order different from the input.
    let files = fetch_results(provider, &done, dir.path()).await;
    assert!(!files.is_empty());
    let lines = parse_all(provider, &files);
    let mut seen = Vec::new();
    for (text, line) in &lines {
        match &line.outcome {
            LineOutcome::Succeeded { status_code, body, usage, .. } => {
                assert_eq!(*status_code, 200);
                let tokens = usage.tokens.unwrap_or_else(|| panic!("no usage: {text}"));
                assert!(tokens.input > 0 && tokens.output > 0, "{text}");
                let body: serde_json::Value = serde_json::from_str(&text[body.clone()]).unwrap();
                assert_eq!(usage.model.as_deref(), body["model"].as_str(), "the model it names");
                match target.kind() {
                    ProviderKind::Anthropic => assert_eq!(body["type"], "message"),
                    _ => assert_eq!(body["object"], "chat.completion"),
                }
            }
            LineOutcome::Failed(err) => panic!("unexpected failure: {err}"),
        }
        seen.push(line.wire_id.clone());
    }
    assert_eq!(seen.len(), n, "one line per request");
    assert_eq!(seen.iter().collect::<BTreeSet<_>>(), sub.wire_ids.iter().collect::<BTreeSet<_>>());
    assert_ne!(seen, sub.wire_ids, "results came back in input order");

    // Azure: a successful batch still has an error file, and it is empty.
    if target.kind() == ProviderKind::Azure {
        let errors = done.error_file_id.as_ref().expect("azure always has an error file");
        let dest = dir.path().join("azure-errors.jsonl");
        assert_eq!(provider.download_to(errors, &dest).await.unwrap(), 0);
    }

    // Clean up: every file deleted (twice is fine), or the ended batch deleted.
    match provider.transport() {
        InputTransport::UploadFile => {
            let files: Vec<&FileId> = sub
                .input_file
                .iter()
                .chain(done.output_file_id.iter())
                .chain(done.error_file_id.iter())
                .collect();
            for file in &files {
                provider.delete_file(file).await.unwrap();
                provider.delete_file(file).await.unwrap();
            }
            let err = provider.download_to(files[1], &dir.path().join("gone")).await.unwrap_err();
            assert_http_error(target, &err, 404, false);
        }
        InputTransport::Inline => {
            provider.delete_batch(&done.id).await.unwrap();
            provider.delete_batch(&done.id).await.unwrap();
            let err = provider.retrieve_batch(&done.id).await.unwrap_err();
            assert_http_error(target, &err, 404, false);
        }
    }
}

async fn list_pagination(target: Target) {
    let (_sim, provider) = target.setup().await;
    let provider = provider.as_ref();
    let dir = tempfile::tempdir().unwrap();
    let mut created = BTreeSet::new();
    for _ in 0..5 {
        created.insert(submit(target, provider, dir.path(), 1).await.batch.id);
    }
    let mut listed = Vec::new();
    let mut after: Option<BatchId> = None;
    let mut pages = 0;
    loop {
        let page = provider.list_batches(after.as_ref(), 2).await.unwrap();
        pages += 1;
        assert!(page.data.len() <= 2);
        listed.extend(page.data.iter().map(|b| b.id.clone()));
        if !page.has_more {
            break;
        }
        after = page.last_id.clone();
        assert!(after.is_some());
        assert!(pages < 10, "pagination does not end");
    }
    assert_eq!(pages, 3);
    assert_eq!(listed.len(), 5, "{listed:?}");
    assert_eq!(listed.into_iter().collect::<BTreeSet<_>>(), created);
}

/// Every file the account holds is listed once, page by page, with its purpose and name:
/// the input tranche uploaded and the output the provider wrote. Providers without files list
/// none.
async fn file_listing(target: Target) {
    let (sim, provider) = target.setup().await;
    let provider = provider.as_ref();
    let dir = tempfile::tempdir().unwrap();
    let submitted = submit(target, provider, dir.path(), 2).await;
    let ended = run_to_end(&sim, provider, &submitted.batch.id).await;
    let mut listed = Vec::new();
    let mut after: Option<FileId> = None;
    for _ in 0..10 {
        let page = provider.list_files(after.as_ref(), 1).await.unwrap();
        assert!(page.data.len() <= 1);
        listed.extend(page.data);
        if !page.has_more {
            break;
        }
        after = page.last_id.clone();
    }
    let Some(input) = submitted.input_file else {
        assert!(listed.is_empty(), "{listed:?}");
        return;
    };
    assert_eq!(listed.len() as u64, sim.stats().files_live, "{listed:?}");
    let ids: BTreeSet<_> = listed.iter().map(|f| f.id.clone()).collect();
    assert_eq!(ids.len(), listed.len(), "each file once");
    let input = listed.iter().find(|f| f.id == input).unwrap();
    assert_eq!(input.purpose, "batch");
    assert_eq!(input.filename, format!("tranche-{}.jsonl", submitted.tranche));
    let output = ended.output_file_id.unwrap();
    assert_eq!(listed.iter().find(|f| f.id == output).unwrap().purpose, "batch_output");
}

async fn cancel(target: Target) {
    let (sim, provider) = target.setup().await;
    let provider = provider.as_ref();
    let dir = tempfile::tempdir().unwrap();
    let sub = submit(target, provider, dir.path(), 6).await;
    let cancelling = provider.cancel_batch(&sub.batch.id).await.unwrap();
    assert!(
        matches!(cancelling.status, BatchStatus::Cancelling | BatchStatus::Cancelled),
        "{:?}",
        cancelling.status
    );
    assert_eq!(cancelling.id, sub.batch.id);
    if provider.transport() == InputTransport::UploadFile {
        assert_eq!(cancelling.tranche_id(), Some(sub.tranche));
    }
    let done = run_to_end(&sim, provider, &sub.batch.id).await;
    assert_eq!(done.status, BatchStatus::Cancelled);
    // Whatever results a cancelled batch has: known wire ids, at most once each, and every
    // request that never ran can be sent again.
    let lines = parse_all(provider, &fetch_results(provider, &done, dir.path()).await);
    let mut seen = BTreeSet::new();
    for (_, line) in &lines {
        assert!(sub.wire_ids.contains(&line.wire_id), "{}", line.wire_id);
        assert!(seen.insert(line.wire_id.clone()), "{} twice", line.wire_id);
        if let LineOutcome::Failed(err) = &line.outcome {
            assert_eq!(err.provider, target.kind());
            if err.code.as_deref() == Some("batch_cancelled") {
                assert!(err.retryable, "{err}");
            }
        }
    }
    if provider.transport() == InputTransport::Inline {
        // Anthropic: one result per request, each canceled one retryable.
        assert!(done.results_url.is_some());
        assert_eq!(seen.len(), sub.wire_ids.len());
    }
    // Cancelling an ended batch is refused (OpenAI and Azure 409, Anthropic 400), and fatal.
    let err = provider.cancel_batch(&sub.batch.id).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Http, "{err}");
    assert!(err.status.is_some_and(|s| (400..500).contains(&s)), "{err}");
    assert!(!err.retryable(), "{err}");
}

async fn error_401(target: Target) {
    let (sim, _) = target.setup().await;
    let provider = (target.setup_fn())(&sim, Options { key: WRONG_KEY, ..Options::default() });
    let err = provider.retrieve_batch(&BatchId::new("batch_x")).await.unwrap_err();
    assert_http_error(target, &err, 401, false);
    assert!(err.is_auth());
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("{} rejected tranche's credentials (401", target.kind())),
        "{text}"
    );
    // Side effects are refused the same way. (For file-based providers the create is used: the
    // simulator answers a bad key before reading an upload's body and closes the connection, so
    // an upload may see a broken pipe instead of the 401.)
    let dir = tempfile::tempdir().unwrap();
    let err = match provider.transport() {
        InputTransport::Inline => {
            try_submit(target, provider.as_ref(), dir.path(), 1).await.err().unwrap()
        }
        InputTransport::UploadFile => {
            let file = FileId::new("file-abc123");
            let create = CreateBatch {
                tranche_id: TrancheId::new(),
                input: BatchInput::File(&file),
                endpoint: target.endpoint(),
            };
            provider.create_batch(create).await.unwrap_err()
        }
    };
    assert_http_error(target, &err, 401, false);
}

async fn error_404(target: Target) {
    let (_sim, provider) = target.setup().await;
    let missing = BatchId::new("batch_does_not_exist");
    let err = provider.retrieve_batch(&missing).await.unwrap_err();
    assert_http_error(target, &err, 404, false);
    assert!(!err.is_auth());
    assert!(err.to_string().starts_with(&format!("{} returned 404", target.kind())), "{err}");
    let err = provider.cancel_batch(&missing).await.unwrap_err();
    assert_http_error(target, &err, 404, false);
}

async fn error_413(target: Target) {
    let dir = tempfile::tempdir().unwrap();
    match target.kind() {
        ProviderKind::Anthropic => {
            // A create body over the batch size limit: 413 `request_too_large`, fatal.
            let (_sim, provider) =
                target.setup_with(|c| c.anthropic.max_body_bytes = 2048, Options::default()).await;
            let err = try_submit(target, provider.as_ref(), dir.path(), 40).await.err().unwrap();
            assert_http_error(target, &err, 413, false);
            assert_eq!(err.error_type.as_deref(), Some("request_too_large"));
            // Under the limit the same adapter creates fine.
            submit(target, provider.as_ref(), dir.path(), 2).await;
        }
        _ => {
            // OpenAI-shaped providers answer an oversized upload with a documented 400
            // ("File is too large."), also fatal.
            let (sim, provider) =
                target.setup_with(|c| c.max_file_bytes = 2048, Options::default()).await;
            let err = try_submit(target, provider.as_ref(), dir.path(), 40).await.err().unwrap();
            assert_http_error(target, &err, 400, false);
            assert_eq!(err.message, "File is too large.");
            // A 413 from a proxy in front of them is fatal too.
            sim.set_faults(vec![target.fault("upload", 413, None)]);
            let err = try_submit(target, provider.as_ref(), dir.path(), 1).await.err().unwrap();
            assert_http_error(target, &err, 413, false);
        }
    }
}

async fn error_429_with_retry_after(target: Target) {
    let (sim, provider) = target.setup().await;
    let provider = provider.as_ref();
    let dir = tempfile::tempdir().unwrap();
    let batch = submit(target, provider, dir.path(), 1).await.batch;

    // A create is never retried: the 429 and its Retry-After reach the caller.
    sim.set_faults(vec![target.fault("create", 429, Some(7))]);
    let err = try_submit(target, provider, dir.path(), 1).await.err().unwrap();
    assert_http_error(target, &err, 429, true);
    assert_eq!(err.retry_after, Some(Duration::from_secs(7)));
    let (error_type, code) = match target {
        Target::OpenAi => (Some("requests"), Some("rate_limit_exceeded")),
        Target::AzureV1 | Target::AzureLegacy => (None, Some("429")),
        Target::Anthropic => (Some("rate_limit_error"), None),
    };
    assert_eq!(err.error_type.as_deref(), error_type, "{err:?}");
    assert_eq!(err.code.as_deref(), code, "{err:?}");

    // A read asked to wait longer than the policy's longest sleep hands the wait to the caller.
    sim.set_faults(vec![target.fault("retrieve", 429, Some(7))]);
    let err = provider.retrieve_batch(&batch.id).await.unwrap_err();
    assert_http_error(target, &err, 429, true);
    assert_eq!(err.retry_after, Some(Duration::from_secs(7)));

    // Once the fault is gone the same calls work.
    sim.set_faults(Vec::new());
    provider.retrieve_batch(&batch.id).await.unwrap();
}

async fn error_500(target: Target) {
    let (sim, provider) = target.setup().await;
    let provider = provider.as_ref();
    let dir = tempfile::tempdir().unwrap();
    let batch = submit(target, provider, dir.path(), 1).await.batch;
    sim.set_faults(vec![target.fault("retrieve", 500, None)]);
    let err = provider.retrieve_batch(&batch.id).await.unwrap_err();
    assert_http_error(target, &err, 500, true);
    assert!(err.to_string().starts_with(&format!("{} returned 500", target.kind())), "{err}");
    sim.set_faults(vec![target.fault("list", 503, None)]);
    let err = provider.list_batches(None, 10).await.unwrap_err();
    assert_http_error(target, &err, 503, true);
    sim.set_faults(Vec::new());
    assert_eq!(provider.list_batches(None, 10).await.unwrap().data.len(), 1);
}

/// Anthropic only: 529 `overloaded_error` is retryable.
async fn error_529_overloaded(target: Target) {
    let (sim, provider) = target.setup().await;
    let provider = provider.as_ref();
    let dir = tempfile::tempdir().unwrap();
    let batch = submit(target, provider, dir.path(), 1).await.batch;
    sim.set_faults(vec![target.fault("retrieve", 529, None)]);
    let err = provider.retrieve_batch(&batch.id).await.unwrap_err();
    assert_http_error(target, &err, 529, true);
    assert_eq!(err.error_type.as_deref(), Some("overloaded_error"));
    sim.set_faults(vec![target.fault("create", 529, None)]);
    let err = try_submit(target, provider, dir.path(), 1).await.err().unwrap();
    assert_http_error(target, &err, 529, true);
}

/// Azure only: input files without an expiry run into the resource quota (`400 quotaExceeded`,
/// fatal); files with an expiry count against a separate, larger quota.
async fn error_quota_exceeded(target: Target) {
    let no_expiry = Options { file_expiry: false, ..Options::default() };
    let (sim, provider) =
        target.setup_with(|c| c.azure.max_input_files_without_expiry = 3, no_expiry).await;
    let dir = tempfile::tempdir().unwrap();
    for i in 0..3 {
        let path = dir.path().join(format!("in-{i}.jsonl"));
        write_input(target, provider.as_ref(), &path, 1);
        let file = provider.upload_path(TrancheId::new(), &path).await.unwrap();
        assert_eq!(file.expires_at, None);
    }
    let path = dir.path().join("in-4.jsonl");
    write_input(target, provider.as_ref(), &path, 1);
    let err = provider.upload_path(TrancheId::new(), &path).await.unwrap_err();
    assert_http_error(target, &err, 400, false);
    assert_eq!(err.code.as_deref(), Some("quotaExceeded"));
    assert!(err.message.contains("quota"), "{err}");
    assert!(err.to_string().starts_with("azure returned 400 quotaExceeded: The quota"), "{err}");
    // With an expiry (the default), the same resource still takes files.
    let with_expiry = (target.setup_fn())(&sim, Options::default());
    let file = with_expiry.upload_path(TrancheId::new(), &path).await.unwrap();
    assert_eq!(file.expires_at, Some(file.created_at + 1_209_600));
}

/// The whole suite for one target, plus the named target-specific tests.
macro_rules! conformance {
    ($name:ident, $target:expr $(; $($extra:ident),+ $(,)?)?) => {
        mod $name {
            use super::*;

            #[tokio::test]
            async fn full_lifecycle() {
                super::full_lifecycle($target).await;
            }

            #[tokio::test]
            async fn list_pagination() {
                super::list_pagination($target).await;
            }

            #[tokio::test]
            async fn file_listing() {
                super::file_listing($target).await;
            }

            #[tokio::test]
            async fn cancel() {
                super::cancel($target).await;
            }

            #[tokio::test]
            async fn error_401() {
                super::error_401($target).await;
            }

            #[tokio::test]
            async fn error_404() {
                super::error_404($target).await;
            }

            #[tokio::test]
            async fn error_413() {
                super::error_413($target).await;
            }

            #[tokio::test]
            async fn error_429_with_retry_after() {
                super::error_429_with_retry_after($target).await;
            }

            #[tokio::test]
            async fn error_500() {
                super::error_500($target).await;
            }

            $($(
                #[tokio::test]
                async fn $extra() {
                    super::$extra($target).await;
                }
            )+)?
        }
    };
}

conformance!(openai, Target::OpenAi);
conformance!(azure_v1, Target::AzureV1; error_quota_exceeded);
conformance!(azure_legacy, Target::AzureLegacy; error_quota_exceeded);
conformance!(anthropic, Target::Anthropic; error_529_overloaded);
