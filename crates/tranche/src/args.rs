//! Command-line arguments.

use std::net::IpAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use tranche_app::{EngineSettings, ExportFormat, ExportOptions, ProviderOptions};
use tranche_core::{
    CacheSharedPrompt, Endpoint, JobSettings, OnInvalid, ProviderKind, RequestState, Usd,
};

/// tranche: a durable pipeline for LLM batch APIs.
#[derive(Debug, Parser)]
#[command(name = "tranche", version, about, long_about = None)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct Global {
    /// Where tranche keeps its state: the database (unless --db says otherwise) and raw results.
    #[arg(long, global = true, env = "TRANCHE_DATA_DIR", default_value = ".tranche")]
    pub data_dir: PathBuf,
    /// The database: a SQLite file path or `sqlite:` URL, or a `postgres://` URL of an existing
    /// PostgreSQL database shared by every host's workers [default: <data-dir>/tranche.db].
    #[arg(long, global = true, env = "TRANCHE_DATABASE_URL")]
    pub db: Option<String>,
    /// Where bytes rest: file:///path or s3://bucket/prefix (S3 settings from AWS_*)
    /// [default: <data-dir>/blobs].
    #[arg(long, global = true, env = "TRANCHE_BLOB_STORE")]
    pub blob_store: Option<String>,
    /// More log output on stderr (-v: info, -vv: debug). RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a sample job end to end against a built-in simulator (no API key, no network).
    Demo(DemoArgs),
    /// Submit a file and work on it until the job ends.
    Run(RunArgs),
    /// Accept a file as a job and print its id; a worker does the rest.
    Submit(SubmitArgs),
    /// Work on every job until stopped (ctrl-c / SIGTERM).
    Worker(WorkerArgs),
    /// Show a job (or the latest jobs).
    Status(StatusArgs),
    /// Write a job's results as JSONL.
    Results(ResultsArgs),
    /// Cancel a job: waiting requests at once, its batches at the provider.
    Cancel(CancelArgs),
    /// Show answers of a job drawn at random, beside their inputs, for review.
    Review(ReviewArgs),
    /// Approve a job's answers: the job awaiting review ends `done`.
    Approve(DecideArgs),
    /// Reject a job's answers (all succeeded ones, or those named): they end failed with
    /// `rejected_in_review`, the others stand, and the job ends `done`.
    Reject(RejectArgs),
    /// Judge a job's answers again from its stored raw results, without calling a provider.
    Reparse(ReparseArgs),
    /// Forget jobs that ended long ago: their requests and the bytes no other job needs; each
    /// job's summary stays.
    Prune(PruneArgs),
    /// Provider files: what each account holds and whose (audit), and deleting what no batch
    /// needs (cleanup).
    Files(FilesArgs),
    /// What a job cost (or everything since a day), against what it would have cost
    /// synchronously; or, with `estimate FILE`, the most a file may cost before it runs.
    Cost(CostArgs),
    /// The HTTP server's tenants and their bearer tokens: add one (its token printed once;
    /// only its SHA-256 is stored), list them, revoke one.
    Tenants(TenantsArgs),
    /// Serve the HTTP API (and, unless --no-worker, a worker) until SIGTERM or ctrl-c.
    Serve(ServeArgs),
    /// Serve the provider simulator on localhost.
    Sim(SimArgs),
    /// Move this SQLite store (--db, or <data-dir>/tranche.db) into an empty PostgreSQL
    /// database: every job, request, tranche and their history.
    ///
    /// The copy is one transaction: if it fails, the target stays empty. The blob store stays
    /// where it is; afterwards, use the same blob store (or data folder) with
    /// `--db postgres://...`. A job in flight moves too, and workers on PostgreSQL continue it,
    /// but stop every worker on the SQLite store first: what they write after the copy began is
    /// not moved. Refused when the target already holds jobs, tranches or tenants.
    Migrate(MigrateArgs),
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// How many requests the sample job has.
    #[arg(long, default_value_t = 2000)]
    pub requests: usize,
    /// Simulator speed: virtual seconds per wall second.
    #[arg(long, default_value_t = 10.0)]
    pub speed: f64,
    /// Share of requests the simulator answers with a fatal per-line error.
    #[arg(long, default_value_t = 0.005)]
    pub fault_rate: f64,
}

/// How input lines become requests.
#[derive(Debug, Clone, Args)]
pub struct InputArgs {
    /// Which provider's batch API to use.
    #[arg(long, default_value = "openai", value_parser = parse_provider)]
    pub provider: ProviderKind,
    /// Task name for tranche lines (`{"key", "body"}`); part of each custom_id.
    #[arg(long)]
    pub task: Option<String>,
    /// Version for tranche lines; part of each custom_id.
    #[arg(long = "version", id = "task_version", default_value = "v1")]
    pub task_version: String,
    /// Endpoint for tranche lines [default: /v1/chat/completions; /v1/messages for anthropic].
    #[arg(long, value_parser = parse_endpoint)]
    pub endpoint: Option<Endpoint>,
    /// Model for lines whose body has none.
    #[arg(long)]
    pub model: Option<String>,
    /// Prefix custom_ids of tranche lines with `TENANT::`.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Send a request at most this many times (only retryable failures are retried).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub max_attempts: Option<u32>,
    /// A JSON Schema file every answer must match (the answer text, or the one tool call's
    /// arguments, parsed as JSON); an answer that does not fails with `invalid_output`.
    #[arg(long, value_name = "FILE")]
    pub schema: Option<PathBuf>,
    /// Accept JSON inside a Markdown code fence (```json ... ```) as well.
    #[arg(long, requires = "schema")]
    pub lenient_json: bool,
    /// What an answer that does not match the schema does: goes out again, spending an
    /// attempt (`retry`), or ends the request failed (`fail`).
    #[arg(long, value_name = "retry|fail", default_value = "retry", value_parser = parse_on_invalid)]
    pub on_invalid: OnInvalid,
    /// Hold the job's answers for review: the job ends in `needs_review` until `tranche
    /// approve` (or `reject`); `tranche review` shows this many answers drawn at random.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub review_sample: Option<u32>,
    /// The seed of the review sample [default: derived from the job id].
    #[arg(long, requires = "review_sample")]
    pub review_seed: Option<u64>,
    /// The most the job may cost, in US dollars: its requests go out only while their worst
    /// case (input plus max_tokens, at batch prices) fits beside what it was billed and has in
    /// flight; the rest end cancelled with `budget_exceeded`. Every model needs a price.
    #[arg(long, value_name = "USD")]
    pub budget: Option<Usd>,
    /// Anthropic: mark a system prompt that requests of one batch share, when long enough
    /// for the model to cache, with `cache_control`, so the provider caches it and bills its
    /// reads at a tenth of the input price (`auto`); or send bodies as given (`off`). Bodies
    /// that carry their own `cache_control` are always sent as given.
    #[arg(long, value_name = "auto|off", default_value = "auto", value_parser = parse_cache_shared_prompt)]
    pub cache_shared_prompt: CacheSharedPrompt,
}

fn parse_cache_shared_prompt(s: &str) -> Result<CacheSharedPrompt, String> {
    s.parse()
}

fn parse_on_invalid(s: &str) -> Result<OnInvalid, String> {
    s.parse()
}

/// The JSON Schema in the file at `path`, or why it cannot be read as JSON.
pub fn read_schema(path: &std::path::Path) -> Result<serde_json::Value, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--schema {}: cannot read it: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| {
        format!(
            "--schema {}: not JSON at line {}, column {}: {e}",
            path.display(),
            e.line(),
            e.column()
        )
    })
}

impl InputArgs {
    /// The endpoint tranche lines go to.
    pub fn endpoint(&self) -> Endpoint {
        self.endpoint.unwrap_or(match self.provider {
            ProviderKind::Anthropic => Endpoint::AnthropicMessages,
            ProviderKind::Openai | ProviderKind::Azure => Endpoint::ChatCompletions,
        })
    }
}

/// Where the providers are and how to reach them. Keys come from the environment only:
/// OPENAI_API_KEY, AZURE_OPENAI_API_KEY (or AZURE_OPENAI_AD_TOKEN), ANTHROPIC_API_KEY.
#[derive(Debug, Clone, Args)]
pub struct ProviderArgs {
    /// The chosen provider's base URL (for `worker`: OpenAI's) [env: OPENAI_BASE_URL,
    /// AZURE_OPENAI_ENDPOINT, ANTHROPIC_BASE_URL].
    #[arg(long)]
    pub base_url: Option<String>,
    /// The Azure OpenAI resource endpoint, e.g. https://NAME.openai.azure.com.
    #[arg(long, env = "AZURE_OPENAI_ENDPOINT")]
    pub azure_endpoint: Option<String>,
    /// A dated Azure API version (e.g. 2024-10-21) selects the legacy surface; without one
    /// the v1 surface is used.
    #[arg(long, env = "OPENAI_API_VERSION")]
    pub azure_api_version: Option<String>,
    /// The Anthropic API base URL [default: https://api.anthropic.com].
    #[arg(long, env = "ANTHROPIC_BASE_URL")]
    pub anthropic_base_url: Option<String>,
    /// Seconds an uploaded input file lives at the provider before it expires.
    #[arg(long)]
    pub file_expires_after: Option<u64>,
}

/// How the engine works.
#[derive(Debug, Clone, Default, Args)]
pub struct EngineArgs {
    /// Seconds between two polls of a running batch, decimals allowed [default: 30; 60 for
    /// azure and anthropic].
    #[arg(long)]
    pub poll_interval: Option<f64>,
    /// A batch goes out once this many requests of one provider + endpoint + model wait...
    /// [default: 1]
    #[arg(long)]
    pub min_batch_size: Option<usize>,
    /// ...or once the oldest has waited this many seconds [default: 0].
    #[arg(long)]
    pub max_wait: Option<f64>,
    /// Enqueued-token budget for one model, as MODEL=TOKENS (repeatable).
    #[arg(long = "token-budget", value_name = "MODEL=TOKENS")]
    pub token_budgets: Vec<String>,
    /// Enqueued-token budget for models without their own.
    #[arg(long)]
    pub default_token_budget: Option<u64>,
    /// The most of each model's enqueued-token budget one tenant's batches may hold, as a
    /// share above 0 and at most 1 (jobs without a tenant count as one tenant).
    #[arg(long, value_name = "SHARE")]
    pub tenant_token_share: Option<f64>,
    /// The most unfinished batches, each holding at most one input file, one tenant may have
    /// on a provider account: its share of the account's file quota.
    #[arg(long, value_name = "N")]
    pub tenant_max_files: Option<u64>,
    /// At most this many requests per provider batch (the provider's own limit is the ceiling).
    #[arg(long)]
    pub max_batch_requests: Option<usize>,
    /// At most this many bytes of input per provider batch.
    #[arg(long)]
    pub max_batch_bytes: Option<u64>,
    /// Seconds a lease on a tranche step or on planning lasts unless renewed, decimals
    /// allowed; engines sharing a store take turns by them, and the work of an engine that
    /// died resumes after at most this long [default: 60].
    #[arg(long)]
    pub lease: Option<f64>,
    /// How many batches one engine works on at once: one's file is written while another's
    /// batch is created and a third's results are read [default: 4].
    #[arg(long)]
    pub parallel_steps: Option<usize>,
    /// How many of those steps may move a file's bytes at once: write an input file, copy a
    /// batch's results, ingest them. Each holds buffers while it runs, so this bounds memory
    /// whatever the job's size; creating and polling batches go on beside them [default: 1].
    #[arg(long)]
    pub transfer_steps: Option<usize>,
    /// A price file (the bundled table's shape) whose entries override or add to the bundled
    /// prices [env: TRANCHE_PRICES; tranche.toml: prices].
    #[arg(long, value_name = "FILE")]
    pub prices: Option<PathBuf>,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct CostArgs {
    #[command(subcommand)]
    pub command: Option<CostCommand>,
    /// The job.
    #[arg(required_unless_present = "since")]
    pub job: Option<String>,
    /// Instead of one job: everything recorded from this day (YYYY-MM-DD, UTC) on.
    #[arg(long, value_name = "DATE", conflicts_with = "job")]
    pub since: Option<String>,
    /// With --since: only this tenant's jobs.
    #[arg(long, requires = "since")]
    pub tenant: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// A price file whose entries override or add to the bundled prices.
    #[arg(long, value_name = "FILE")]
    pub prices: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum CostCommand {
    /// The most an input file may cost: input tokens counted offline, output bounded by each
    /// request's max_tokens (or the model's maximum), at batch and at synchronous prices.
    Estimate(EstimateArgs),
}

#[derive(Debug, Args)]
pub struct EstimateArgs {
    /// The input file (JSONL), read as `submit` would read it.
    pub file: PathBuf,
    #[command(flatten)]
    pub input: InputArgs,
    /// Also project a month of this many runs of the file.
    #[arg(long, value_name = "N")]
    pub per_month: Option<f64>,
    /// With --per-month: the share of input served from the prompt cache (0 to 1).
    #[arg(long, value_name = "R", default_value_t = 0.0, requires = "per_month")]
    pub cache_hit_rate: f64,
    /// Print the estimate as JSON.
    #[arg(long)]
    pub json: bool,
    /// A price file whose entries override or add to the bundled prices.
    #[arg(long, value_name = "FILE")]
    pub prices: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The input file (JSONL): tranche lines or OpenAI batch lines.
    pub file: PathBuf,
    #[command(flatten)]
    pub input: InputArgs,
    #[command(flatten)]
    pub provider: ProviderArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Also write the results to this file (JSONL).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the final status as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// The input file (JSONL): tranche lines or OpenAI batch lines.
    pub file: PathBuf,
    #[command(flatten)]
    pub input: InputArgs,
    #[command(flatten)]
    pub provider: ProviderArgs,
    /// Print `{"job_id": ...}`.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Where the API listens (port 0: any free port; the address is printed).
    #[arg(long, default_value = "127.0.0.1:8400")]
    pub addr: std::net::SocketAddr,
    /// Serve the API only; workers elsewhere on the same store carry the jobs out.
    #[arg(long)]
    pub no_worker: bool,
    /// The most bytes one submission's body may have (more is 413).
    #[arg(long, default_value_t = 256 * 1024 * 1024)]
    pub max_body_bytes: u64,
    /// The most requests one job may have (more is 413).
    #[arg(long, default_value_t = 1_000_000)]
    pub max_requests_per_job: u64,
    /// Submissions taken in at once (more are answered 429).
    #[arg(long, default_value_t = 8)]
    pub max_concurrent_intake: usize,
    /// Submissions of one tenant taken in at once, so that one tenant's large uploads leave
    /// room for the others' (more are answered 429).
    #[arg(long, default_value_t = 4)]
    pub max_tenant_intake: usize,
    #[command(flatten)]
    pub provider: ProviderArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub provider: ProviderArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Exit once no job has work left.
    #[arg(long)]
    pub until_idle: bool,
    /// Seconds between two cleanups of each account's provider files (one worker of the
    /// deployment does each), decimals allowed [default: 3600; 0: never].
    #[arg(long)]
    pub janitor_interval: Option<f64>,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The job; without it, the latest jobs.
    pub job: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ResultsArgs {
    /// The job.
    pub job: String,
    /// Write to this file instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write into the blob store (`exports/<job>/results.jsonl`) instead of stdout, and print
    /// where as JSON: `object`, `url`, `lines`, `bytes`, `sha256`.
    #[arg(long, conflicts_with = "out")]
    pub to_blob_store: bool,
    /// Only requests that ended so.
    #[arg(long, value_name = "succeeded|failed|cancelled", value_parser = parse_ended)]
    pub status: Option<RequestState>,
    /// Also answers still awaiting review, marked `"stage": "staged"`.
    #[arg(long)]
    pub staged: bool,
    /// `jsonl` (one JSON object a line) or `csv` (custom_id, key, status, answer, error_code,
    /// error_message).
    #[arg(long, default_value = "jsonl", value_parser = parse_format)]
    pub format: ExportFormat,
    /// Add each answer's whole result line as the provider returned it (`raw`).
    #[arg(long)]
    pub raw: bool,
}

fn parse_ended(s: &str) -> Result<RequestState, String> {
    match s {
        "succeeded" => Ok(RequestState::Succeeded),
        "failed" => Ok(RequestState::Failed),
        "cancelled" => Ok(RequestState::Cancelled),
        other => Err(format!("`{other}` is not succeeded, failed or cancelled")),
    }
}

fn parse_format(s: &str) -> Result<ExportFormat, String> {
    match s {
        "jsonl" => Ok(ExportFormat::Jsonl),
        "csv" => Ok(ExportFormat::Csv),
        other => Err(format!("`{other}` is not jsonl or csv")),
    }
}

impl ResultsArgs {
    /// Which results, and how.
    pub fn options(&self) -> ExportOptions {
        ExportOptions {
            status: self.status,
            staged: self.staged,
            format: self.format,
            raw: self.raw,
        }
    }
}

#[derive(Debug, Args)]
pub struct ReviewArgs {
    /// The job.
    pub job: String,
    /// How many answers [default: the job's --review-sample, else 20].
    #[arg(long, value_name = "N")]
    pub sample: Option<u32>,
    /// The seed of the draw [default: the job's --review-seed, else derived from the job id].
    #[arg(long)]
    pub review_seed: Option<u64>,
    /// Print `[{custom_id, key, input, output, answer}]`.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DecideArgs {
    /// The job.
    pub job: String,
    /// Who decided [default: the user's login name].
    #[arg(long)]
    pub by: Option<String>,
}

#[derive(Debug, Args)]
pub struct RejectArgs {
    #[command(flatten)]
    pub decide: DecideArgs,
    /// Reject only these answers (repeatable); without it, every succeeded answer.
    #[arg(long = "custom-id", value_name = "ID")]
    pub custom_ids: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ReparseArgs {
    /// The job.
    pub job: String,
    /// A JSON Schema file that replaces the job's.
    #[arg(long, value_name = "FILE")]
    pub schema: Option<PathBuf>,
    #[command(flatten)]
    pub provider: ProviderArgs,
    /// Print what changed as JSON: `judged`, `promoted`, `demoted`, `resent`, `undecodable`.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PruneArgs {
    /// Prune jobs that ended longer ago than this: `30d`, `12h`, `90m`, `1h 30m`, `45s`.
    #[arg(long, value_parser = parse_duration)]
    pub older_than: std::time::Duration,
    /// Count what would be removed and remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("`{s}` is not a duration ({e}); write e.g. 30d, 12h, 90m or 45s"))
}

#[derive(Debug, Args)]
pub struct CancelArgs {
    /// The job.
    pub job: String,
    #[command(flatten)]
    pub provider: ProviderArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Only record the cancel; a running worker carries it out.
    #[arg(long)]
    pub no_wait: bool,
    /// Print the final status as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SimArgs {
    /// The port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Virtual seconds per wall second.
    #[arg(long)]
    pub speed: Option<f64>,
    /// A JSON file with the simulator's configuration.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

fn parse_provider(s: &str) -> Result<ProviderKind, String> {
    s.parse().map_err(|e: tranche_core::provider::UnknownProvider| e.to_string())
}

fn parse_endpoint(s: &str) -> Result<Endpoint, String> {
    s.parse().map_err(|_| {
        let known: Vec<_> = Endpoint::ALL.iter().map(|e| e.as_str()).collect();
        format!("unknown endpoint `{s}` (expected one of {})", known.join(", "))
    })
}

impl EngineArgs {
    /// The engine settings these flags set (the top layer over environment, file and
    /// defaults).
    pub fn settings(
        &self,
        provider: &ProviderArgs,
        blob_store: Option<&str>,
    ) -> Result<EngineSettings, String> {
        let mut budgets = std::collections::BTreeMap::new();
        for entry in &self.token_budgets {
            let (model, tokens) = entry
                .rsplit_once('=')
                .and_then(|(model, tokens)| {
                    Some((model.trim(), tokens.trim().parse::<u64>().ok()?))
                })
                .filter(|(model, _)| !model.is_empty())
                .ok_or_else(|| format!("--token-budget takes MODEL=TOKENS, got `{entry}`"))?;
            budgets.insert(model.to_owned(), tokens);
        }
        Ok(EngineSettings {
            poll_interval: self.poll_interval,
            min_batch_size: self.min_batch_size,
            max_wait: self.max_wait,
            max_batch_requests: self.max_batch_requests,
            max_batch_bytes: self.max_batch_bytes,
            token_budgets: budgets,
            default_token_budget: self.default_token_budget,
            tenant_token_share: self.tenant_token_share,
            tenant_max_files: self.tenant_max_files,
            lease: self.lease,
            max_attempts: None,
            file_expires_after: provider.file_expires_after,
            blob_store: blob_store.map(str::to_owned),
            parallel_steps: self.parallel_steps,
            transfer_steps: self.transfer_steps,
            janitor_interval: None,
            orphan_grace: None,
            file_limits: std::collections::BTreeMap::new(),
            prices: self.prices.clone(),
        })
    }
}

impl ProviderArgs {
    /// No provider flags at all (commands that call no provider).
    pub fn none() -> Self {
        Self {
            base_url: None,
            azure_endpoint: None,
            azure_api_version: None,
            anthropic_base_url: None,
            file_expires_after: None,
        }
    }

    /// Where the providers are reached; `file_expires_after` comes from the layered settings.
    pub fn options(&self, file_expires_after: Option<u64>) -> ProviderOptions {
        ProviderOptions {
            base_url: self.base_url.clone(),
            azure_endpoint: self.azure_endpoint.clone(),
            azure_api_version: self.azure_api_version.clone(),
            anthropic_base_url: self.anthropic_base_url.clone(),
            file_expires_after,
        }
    }
}

impl InputArgs {
    /// What the flags ask of a job (its schema read from its file).
    pub fn job_settings(&self) -> Result<JobSettings, String> {
        Ok(JobSettings {
            task: self.task.clone(),
            version: Some(self.task_version.clone()),
            endpoint: self.endpoint(),
            model: self.model.clone(),
            max_attempts: self.max_attempts,
            tenant: self.tenant.clone(),
            schema: self.schema.as_deref().map(read_schema).transpose()?,
            answer_check: None,
            lenient_json: self.lenient_json,
            on_invalid: self.on_invalid,
            review_sample: self.review_sample,
            review_seed: self.review_seed,
            budget: self.budget,
            cache_shared_prompt: self.cache_shared_prompt,
        })
    }
}

#[derive(Debug, Args)]
pub struct FilesArgs {
    #[command(subcommand)]
    pub command: FilesCommand,
}

#[derive(Debug, Subcommand)]
pub enum FilesCommand {
    /// Count each account's files by purpose, expiry and owner (`owned`, `orphaned`,
    /// `foreign`), with its limits, recent uploads and the days left to each limit.
    Audit(FilesAuditArgs),
    /// Delete what no batch needs: files of ended tranches, orphans past the grace period,
    /// and other applications' batch files with --include-foreign. Files a live batch names
    /// (whoever made it) are never deleted.
    Cleanup(FilesCleanupArgs),
}

/// Which accounts a `files` command reaches.
#[derive(Debug, Clone, Args)]
pub struct FilesTarget {
    /// Only this provider's account [default: every provider whose credentials are set].
    #[arg(long = "provider", value_parser = parse_provider)]
    pub kind: Option<ProviderKind>,
    #[command(flatten)]
    pub provider: ProviderArgs,
}

#[derive(Debug, Args)]
pub struct FilesAuditArgs {
    #[command(flatten)]
    pub target: FilesTarget,
    /// Print JSON: `{"accounts": [...]}`.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct FilesCleanupArgs {
    #[command(flatten)]
    pub target: FilesTarget,
    /// Print what would be deleted; delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Delete other applications' batch input and output files too.
    #[arg(long)]
    pub include_foreign: bool,
    /// Print JSON: `{"accounts": [...]}`, each with the files deleted.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct TenantsArgs {
    #[command(subcommand)]
    pub command: TenantsCommand,
}

#[derive(Debug, Subcommand)]
pub enum TenantsCommand {
    /// Add a tenant and print its new bearer token, alone on the last line; it is shown only
    /// this once.
    Add(TenantAddArgs),
    /// Every tenant ever added: name, admin, created, revoked.
    List(TenantListArgs),
    /// Revoke a tenant's token: it authenticates no more, and the name may be added again.
    Revoke(TenantRevokeArgs),
}

#[derive(Debug, Args)]
pub struct TenantAddArgs {
    /// The tenant's name: the `--tenant` its jobs are recorded with (at most 64 characters,
    /// no `:`).
    pub name: String,
    /// May see and act on every tenant's jobs, and manage tenants.
    #[arg(long)]
    pub admin: bool,
}

#[derive(Debug, Args)]
pub struct TenantListArgs {
    /// Print `[{"name", "admin", "created_at", "revoked_at"}]` (unix seconds).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct TenantRevokeArgs {
    /// The tenant.
    pub name: String,
}

#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// The PostgreSQL database to move into: postgres://USER@HOST/DB (it must exist and hold
    /// no job, tranche or tenant).
    #[arg(long)]
    pub to: String,
    /// Print `{"tables": {"jobs": N, ...}}`.
    #[arg(long)]
    pub json: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input_of(args: &[&str]) -> Result<InputArgs, clap::Error> {
        let cli = Cli::try_parse_from(args)?;
        match cli.command {
            Command::Run(run) => Ok(run.input),
            Command::Submit(submit) => Ok(submit.input),
            other => panic!("not run or submit: {other:?}"),
        }
    }

    #[test]
    fn submit_and_run_take_cache_shared_prompt() {
        for command in ["run", "submit"] {
            let default = input_of(&["tranche", command, "in.jsonl"]).unwrap();
            let settings = default.job_settings().unwrap();
            assert_eq!(settings.cache_shared_prompt, CacheSharedPrompt::Auto, "{command}");
            let off = input_of(&["tranche", command, "in.jsonl", "--cache-shared-prompt", "off"])
                .unwrap();
            let settings = off.job_settings().unwrap();
            assert_eq!(settings.cache_shared_prompt, CacheSharedPrompt::Off, "{command}");
            let refused = input_of(&["tranche", command, "f", "--cache-shared-prompt", "on"])
                .unwrap_err()
                .to_string();
            assert!(refused.contains("is not auto or off"), "{refused}");
        }
    }
}
