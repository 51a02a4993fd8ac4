//! The command line: one file per command, each its `Args` and its `exec`; `main` parses and
//! dispatches. `anyhow` lives here.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use std::future::Future;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

mod bench;
mod check;
mod demo;
mod eval;
mod gpu;
mod health;
mod report;
mod serve;
mod sim;
mod verdict;

/// Exit statuses, the same in every command (a pipeline may gate on them).
const EXIT_STATUSES: &str = "Exit status, every command:
  0   done (verdict: accept; health: healthy)
  1   the command ran and failed: an error it names (bench: no request succeeded or past
      --max-error-rate; eval: a variant with no answered item; verdict: reject; health: not
      healthy; gpu: no GPU)
  2   verdict: undecided (wait and ask again); check, report: the input is invalid
  3   verdict: the experiment could not be read
  64  usage: an unknown flag, a missing or invalid argument (nothing was run)";

/// Exit status of a usage error (sysexits' EX_USAGE): no command reads it as a decision.
const USAGE: u8 = 64;

/// A streaming-aware measuring gateway for LLM inference.
#[derive(Debug, Parser)]
#[command(name = "inferscope", version, about, after_long_help = EXIT_STATUSES)]
pub struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
// Parsed once per process: the size of its largest variant (`bench`'s flags) does not matter.
#[allow(clippy::large_enum_variant)]
enum Cmd {
    /// Run the gateway (with no --config: two simulated backends behind model `demo`).
    Serve(serve::Args),
    /// This host's GPUs as NVML reports them (utilisation, memory, power, SM clock), as JSON;
    /// exit 1 with "no GPU: …" where there is none or the build has no NVML support.
    Gpu,
    /// Exit 0 when the gateway's admin `/healthz` answers 200, else 1 (a container HEALTHCHECK
    /// needs no other program): the admin address comes from --url, or from the config as
    /// `serve` would read it.
    Health(health::Args),
    /// The embedded default with built-in background load: open the printed dashboard URL and
    /// watch live charts and the int8-vs-fp16 verdict form.
    Demo(demo::Args),
    /// Run a simulated OpenAI-compatible backend.
    Sim(sim::Args),
    /// Load generator: open-loop (--rate) or closed-loop (--concurrency) streaming requests, measured
    /// client-side by the gateway's definitions; a vLLM-bench-style report (table and --out JSON).
    Bench(bench::Args),
    /// Report from an access log: TTFT, TPOT, tokens/s, P99, error rate per group, and each group
    /// compared with a control (median and p99 change with 95% intervals, Mann-Whitney p).
    Report(report::Args),
    /// Quality check of an experiment: run a dataset through the gateway once per variant and
    /// compare accuracy; with --perplexity, score a reference text's perplexity per variant (or,
    /// with --generate N, print a quiz dataset the simulator can answer).
    Eval(eval::Args),
    /// An experiment's decision for a rollout pipeline: per variant each `accept:` limit (and
    /// its suite) met, broken or undecided with its interval; exit 0 accept, 1 reject, 2
    /// undecided, 3 when it could not be read. From a gateway (--admin) or offline from access
    /// logs with --quality and --accept.
    Verdict(verdict::Args),
    /// Validate a config file — and what `serve` would need of this machine: `api_key_env`
    /// variables set, access-log and feedback paths writable, telemetry complete — exit 0, or
    /// print the error (file:line:column: key: problem) and exit 2.
    Check(check::Args),
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    ExitCode::SUCCESS
                }
                _ => ExitCode::from(USAGE),
            };
        }
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match cli.cmd {
        Cmd::Serve(args) => on_runtime(serve::exec(args)),
        Cmd::Gpu => gpu::exec(),
        Cmd::Health(args) => on_runtime(health::exec(args)),
        Cmd::Demo(args) => on_runtime(demo::exec(args)),
        Cmd::Sim(args) => on_runtime(sim::exec(args)),
        Cmd::Bench(args) => on_runtime(bench::exec(args)),
        Cmd::Report(args) => report::exec(&args),
        Cmd::Eval(args) => on_runtime(eval::exec(args)),
        Cmd::Check(args) => check::exec(&args),
        Cmd::Verdict(args) => verdict::exec(&args),
    }
}

/// Runs a command on a multi-threaded runtime: exit 0, or 1 with its error.
fn on_runtime(command: impl Future<Output = anyhow::Result<()>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn ready_line(line: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
async fn terminated() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// `--header NAME:VALUE` arguments.
fn parse_headers(headers: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    headers
        .iter()
        .map(|h| {
            h.split_once(':')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .context("--header NAME:VALUE")
        })
        .collect()
}

/// `GET {admin}{path}` as JSON (http or https, with an optional bearer token).
async fn fetch_json(
    admin: &str,
    path: &str,
    token: Option<&str>,
    ca_file: Option<PathBuf>,
) -> anyhow::Result<serde_json::Value> {
    admin_call(admin, path, token, ca_file, None).await
}

/// `GET {admin}{path}`, or `POST` of `body` when given, answered with JSON.
async fn admin_call(
    admin: &str,
    path: &str,
    token: Option<&str>,
    ca_file: Option<PathBuf>,
    body: Option<&serde_json::Value>,
) -> anyhow::Result<serde_json::Value> {
    use http_body_util::BodyExt;
    let url = format!("{}{path}", admin.trim_end_matches('/'));
    let connector =
        crate::tls::Connector::for_url(&url, ca_file, &[b"http/1.1"]).context("--ca-file")?;
    let client: hyper_util::client::legacy::Client<_, http_body_util::Full<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(connector);
    let mut req = match body {
        Some(b) => http::Request::post(url.as_str())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(b.to_string())))?,
        None => http::Request::get(url.as_str()).body(http_body_util::Full::default())?,
    };
    if let Some(t) = token {
        req.headers_mut().insert(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_str(&format!("Bearer {t}"))?,
        );
    }
    let resp = tokio::time::timeout(std::time::Duration::from_secs(30), client.request(req))
        .await
        .map_err(|_| anyhow::anyhow!("{url}: no answer in 30 s"))?
        .with_context(|| url.clone())?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    if !status.is_success() {
        anyhow::bail!(
            "{url}: {status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(300)])
        );
    }
    serde_json::from_slice(&body).with_context(|| format!("{url}: not JSON"))
}
