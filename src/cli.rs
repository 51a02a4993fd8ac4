//! The command line: parses arguments and calls library entry points. `anyhow` lives here.

use crate::app::{self, Overrides};
use crate::config::{self, sim_profile};
use crate::sim::{self, SimOptions};
use anyhow::Context as _;
use clap::{Parser, Subcommand};
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// A streaming-aware measuring gateway for LLM inference.
#[derive(Debug, Parser)]
#[command(name = "inferscope", version, about)]
pub struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
// Parsed once per process: the size of its largest variant (`bench`'s flags) does not matter.
#[allow(clippy::large_enum_variant)]
enum Cmd {
    /// Run the gateway (with no --config: two simulated backends behind model `demo`).
    Serve {
        /// YAML config file.
        #[arg(long, env = "INFERSCOPE_CONFIG")]
        config: Option<PathBuf>,
        /// Data-plane address, overriding the config (port 0 picks a free port).
        #[arg(long, env = "INFERSCOPE_LISTEN")]
        listen: Option<SocketAddr>,
        /// Admin address, overriding the config (port 0 picks a free port).
        #[arg(long, env = "INFERSCOPE_ADMIN")]
        admin: Option<SocketAddr>,
    },
    /// This host's GPUs as NVML reports them (utilisation, memory, power, SM clock), as JSON;
    /// exit 1 with "no GPU: …" where there is none or the build has no NVML support.
    Gpu,
    /// Exit 0 when the gateway's admin `/healthz` answers 200, else 1 (a container HEALTHCHECK
    /// needs no other program): the admin address comes from --url, or from the config as
    /// `serve` would read it.
    Health {
        /// The URL to check (default: http://ADMIN/healthz of the config's admin listener).
        #[arg(long)]
        url: Option<String>,
        /// YAML config file (default: the embedded one).
        #[arg(long, env = "INFERSCOPE_CONFIG")]
        config: Option<PathBuf>,
        /// Admin address, overriding the config's.
        #[arg(long, env = "INFERSCOPE_ADMIN")]
        admin: Option<SocketAddr>,
        /// For an https:// URL: a PEM CA bundle trusted besides the bundled Mozilla roots.
        #[arg(long)]
        ca_file: Option<PathBuf>,
    },
    /// The embedded default with built-in background load: open the printed dashboard URL and
    /// watch live charts and the int8-vs-fp16 verdict form.
    Demo {
        /// Data-plane address (port 0 picks a free port).
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// Admin address: the dashboard (port 0 picks a free port).
        #[arg(long, default_value = "127.0.0.1:9464")]
        admin: SocketAddr,
        /// Background requests per second (Poisson arrivals).
        #[arg(long, default_value_t = 8.0)]
        rate: f64,
    },
    /// Run a simulated OpenAI-compatible backend.
    Sim {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8000")]
        listen: SocketAddr,
        /// `fp16`, `int8`, or a profile YAML file.
        #[arg(long, default_value = "fp16")]
        profile: String,
        /// Override the profile's base time to first token (ms).
        #[arg(long)]
        ttft_ms: Option<f64>,
        /// Override the profile's time per output token (ms).
        #[arg(long)]
        tpot_ms: Option<f64>,
        /// Override the profile's relative jitter (0 = exact timing).
        #[arg(long)]
        jitter: Option<f64>,
        /// Override the output tokens carried by each chunk.
        #[arg(long)]
        tokens_per_chunk: Option<u32>,
        /// Requests generated at once; more wait in a queue (reported at /metrics).
        #[arg(long)]
        max_batch: Option<u32>,
        /// Seed of every random choice.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Model id listed by /v1/models.
        #[arg(long, default_value = "demo")]
        model: String,
        /// Precede each streamed event with `: t_us=N` (µs since the request arrived): ground truth.
        #[arg(long)]
        truth_comments: bool,
        /// Export an `llm_request` span per request to this OTLP/HTTP traces endpoint
        /// (`http://127.0.0.1:9090/v1/traces`: the gateway's admin listener), as vLLM's
        /// `--otlp-traces-endpoint` does, with the simulator's true queue, prefill and decode.
        #[arg(long)]
        otlp_traces_endpoint: Option<http::Uri>,
        /// Spans wait this long (ms) to be exported together.
        #[arg(long, default_value_t = 200)]
        otlp_delay_ms: u64,
        /// Fault: every Nth request waits --queue-hold-ms more in the queue (starved).
        #[arg(long)]
        queue_hold_every: Option<u64>,
        /// Fault: how long those requests wait (ms).
        #[arg(long)]
        queue_hold_ms: Option<f64>,
        /// Fault: close each connection when a request arrives, without answering.
        #[arg(long)]
        refuse: bool,
        /// Fault: fraction of requests answered with --error-status.
        #[arg(long)]
        error_rate: Option<f64>,
        /// Fault: status of injected errors (default 503).
        #[arg(long)]
        error_status: Option<u16>,
        /// Fault: abort the connection after K streamed chunks.
        #[arg(long)]
        die_after: Option<u32>,
        /// Fault: stop sending after K streamed chunks (connection kept open).
        #[arg(long)]
        stall_after: Option<u32>,
        /// Fault: extra delay before the first token (ms).
        #[arg(long)]
        slow_first_token_ms: Option<f64>,
        /// Fault: fraction of content events sent as malformed JSON.
        #[arg(long)]
        malformed_rate: Option<f64>,
    },
    /// Load generator: open-loop (--rate) or closed-loop (--concurrency) streaming requests, measured
    /// client-side by the gateway's definitions; a vLLM-bench-style report (table and --out JSON).
    Bench {
        /// Gateway (or backend) URL.
        #[arg(long)]
        url: String,
        /// Model name.
        #[arg(long, default_value = "demo")]
        model: String,
        /// Prompts: ShareGPT JSON or JSONL (`{"prompt": ...}` or strings); default synthetic.
        #[arg(long)]
        dataset: Option<PathBuf>,
        /// Words per synthetic prompt.
        #[arg(long, default_value_t = 64)]
        input_words: usize,
        /// Requests per second, open loop (Poisson arrivals unless --constant).
        #[arg(long, conflicts_with = "concurrency")]
        rate: Option<f64>,
        /// Run once per rate (open loop) and print one row per rate, e.g. --sweep 1,2,4,8.
        #[arg(long, value_delimiter = ',', conflicts_with_all = ["rate", "concurrency"])]
        sweep: Vec<f64>,
        /// Evenly spaced arrivals instead of Poisson.
        #[arg(long)]
        constant: bool,
        /// Requests in flight, closed loop (default 1 when no --rate).
        #[arg(long)]
        concurrency: Option<usize>,
        /// Requests to send.
        #[arg(long, default_value_t = 100)]
        requests: usize,
        /// Stop after this long (e.g. 60s), whichever comes first.
        #[arg(long)]
        duration: Option<String>,
        /// Non-streaming requests.
        #[arg(long)]
        no_stream: bool,
        /// max_tokens of each request.
        #[arg(long, default_value_t = 128)]
        max_tokens: u32,
        /// SLOs for goodput, e.g. ttft=200ms,tpot=30ms.
        #[arg(long)]
        slo: Option<String>,
        /// Extra header NAME:VALUE (repeatable), e.g. x-inferscope-variant:int8.
        #[arg(long = "header")]
        headers: Vec<String>,
        /// What the requests are to the gateway: `bench` (its own groups in /stats, out of live
        /// rates and experiment comparisons, where the route has `purpose_header: true`) or
        /// `live` (standing in for users' traffic).
        #[arg(long, default_value = "bench", value_parser = ["bench", "live"])]
        purpose: String,
        /// Write the report as JSON here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Gateway admin URL: print its /stats next to the client's figures.
        #[arg(long)]
        compare_gateway: Option<String>,
        /// Seed of arrivals and synthetic prompts.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// HTTP/2 with prior knowledge (h2c) over this many connections instead of HTTP/1.1 (one
        /// connection per request in flight): holds many thousands of streams on a few sockets.
        #[arg(long)]
        http2_connections: Option<usize>,
        /// Send this many requests at once first, left out of the report (opens the connections
        /// the run will use).
        #[arg(long, default_value_t = 0)]
        warmup: usize,
        /// For an https:// URL: a PEM CA bundle trusted besides the bundled Mozilla roots.
        #[arg(long)]
        ca_file: Option<PathBuf>,
        /// Roofline: the served model's parameters, in billions (with --gpu, or --hbm-gb-s and
        /// --tflops): decode bandwidth, MBU and prefill MFU next to the latencies.
        #[arg(long)]
        params_b: Option<f64>,
        /// Roofline: bytes per parameter as served (2: FP16/BF16, 1: INT8/FP8, 0.5: INT4).
        #[arg(long, default_value_t = 2.0)]
        bytes_per_param: f64,
        /// Roofline: KV-cache bytes per token (absent: KV traffic left out, a lower bound).
        #[arg(long)]
        kv_bytes_per_token: Option<f64>,
        /// Roofline: GPU preset (a100, h100, h200, l4, l40s).
        #[arg(long)]
        gpu: Option<String>,
        /// Roofline: HBM bandwidth of one GPU, GB/s (overrides the preset's).
        #[arg(long)]
        hbm_gb_s: Option<f64>,
        /// Roofline: dense FP16/BF16 TFLOP/s of one GPU (overrides the preset's).
        #[arg(long)]
        tflops: Option<f64>,
        /// Roofline: GPUs serving the model.
        #[arg(long, default_value_t = 1)]
        gpus: u32,
    },
    /// Report from an access log: TTFT, TPOT, tokens/s, P99, error rate per group, and each group
    /// compared with a control (median and p99 change with 95% intervals, Mann-Whitney p).
    Report {
        /// Access logs (JSON lines); several are read as one (a fleet's replicas).
        #[arg(required_unless_present = "merge")]
        files: Vec<PathBuf>,
        /// Merge replicas exactly: admin URLs (read at /stats?format=hdr), saved
        /// /stats?format=hdr documents, or access logs (every sample: the fleet's verdict).
        #[arg(long, num_args = 1.., value_name = "URL|FILE")]
        merge: Vec<String>,
        /// For admin URLs: a bearer token, from this environment variable.
        #[arg(long, value_name = "VAR")]
        token_env: Option<String>,
        /// For https:// admin URLs: a PEM CA bundle trusted besides the bundled Mozilla roots.
        #[arg(long)]
        ca_file: Option<PathBuf>,
        /// Group by `variant`, `backend`, `model`, `route`, `purpose` or `stream`.
        #[arg(long, default_value = "variant")]
        by: String,
        /// Which traffic to read: `live` (with shadow copies, as their own `VARIANT:shadow`
        /// group: the default), `eval`, `bench`, `shadow`, or `all`. Grouped by variant, a
        /// variant a client forced is left out unless `all`.
        #[arg(long, value_name = "PURPOSE")]
        purpose: Option<String>,
        /// The group the others are compared with (e.g. the control variant).
        #[arg(long)]
        control: Option<String>,
        /// No verdict until both groups have this many samples of a metric (the fixed horizon:
        /// the experiment's `min_samples`, which a log does not carry).
        #[arg(long, default_value_t = 200)]
        min_samples: usize,
        /// Print JSON (per group: labels, counts, p50/p90/p99 of every metric; comparisons).
        #[arg(long)]
        json: bool,
        /// The gateway's config: with access logs, each backend it gives `model:` and `gpu:` is
        /// placed on its roofline from its logged requests, and each group whose backends have a
        /// `price:` gets its cost per million output tokens.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Eval results to join to the comparison (`inferscope eval --json > FILE`; repeatable):
        /// one verdict row per variant, latency and quality side by side (needs --control).
        #[arg(long, value_name = "FILE")]
        quality: Vec<PathBuf>,
        /// Limits of the verdict, as an experiment's `accept:`, e.g.
        /// `tpot_change_max=0,accuracy_drop_max_points=1,ppl_rise_max=0.5`.
        #[arg(long, value_name = "KEY=VALUE,...")]
        accept: Option<String>,
    },
    /// Quality check of an experiment: run a dataset through the gateway once per variant and
    /// compare accuracy; with --perplexity, score a reference text's perplexity per variant (or,
    /// with --generate N, print a quiz dataset the simulator can answer).
    Eval {
        /// The dataset: JSONL (multiple choice: question, choices, answer letter; question,
        /// answer; GSM8K's question, answer ending `#### N`; or HumanEval's task_id, prompt,
        /// test, entry_point, also gzipped), an MMLU subject's CSV file, or MMLU's directory
        /// (test/ and dev/).
        #[arg(long, required_unless_present_any = ["generate", "perplexity"])]
        dataset: Option<PathBuf>,
        /// MMLU: answered dev examples before each question.
        #[arg(long, default_value_t = 5)]
        shots: usize,
        /// Ask only the first N items.
        #[arg(long)]
        limit: Option<usize>,
        /// Append each item's result here (JSON lines); a rerun with the same file asks only
        /// the items it does not hold yet.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print the summary as JSON instead of tables.
        #[arg(long)]
        json: bool,
        /// Perplexity of --corpus per variant, from prompt log-probabilities (`/v1/completions`
        /// with `echo` and `logprobs`), with the paired difference from the control.
        #[arg(long, requires = "corpus")]
        perplexity: bool,
        /// The reference text for --perplexity (plain UTF-8).
        #[arg(long)]
        corpus: Option<PathBuf>,
        /// --perplexity window, in the backend's tokens (`/tokenize`), else characters.
        #[arg(long, default_value_t = 1024)]
        window: usize,
        /// --perplexity distance between windows, same unit (at most --window).
        #[arg(long, default_value_t = 512)]
        stride: usize,
        /// Gateway URL.
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
        /// Model name to request.
        #[arg(long, default_value = "demo")]
        model: String,
        /// Variants to evaluate, the control first.
        #[arg(long, value_delimiter = ',', default_value = "fp16,int8")]
        variants: Vec<String>,
        /// Requests in flight at once.
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// Print N generated arithmetic quiz items (JSONL) and exit.
        #[arg(long)]
        generate: Option<usize>,
        /// Seed of the generated items.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Extra header NAME:VALUE (repeatable), e.g. authorization:Bearer KEY.
        #[arg(long = "header")]
        headers: Vec<String>,
        /// For an https:// URL: a PEM CA bundle trusted besides the bundled Mozilla roots.
        #[arg(long)]
        ca_file: Option<PathBuf>,
        /// The suite's name in the summary and the verdict (default: the dataset's or corpus's
        /// file name without extension).
        #[arg(long)]
        suite: Option<String>,
        /// Post the summary to this admin URL (`POST /experiments/quality`), where it joins the
        /// latency comparison in the experiment's verdict (`/experiments`, the dashboard).
        #[arg(long, value_name = "ADMIN_URL")]
        report_to: Option<String>,
        /// For --report-to: the admin bearer token, from this environment variable.
        #[arg(long, value_name = "VAR")]
        report_token_env: Option<String>,
        /// Run the model's code to score HumanEval problems (pass@1): each program in its own
        /// Python process with CPU, memory, file-size and time limits, an empty environment and,
        /// where `unshare` is permitted, no network. Not a security boundary: off by default.
        #[arg(long)]
        allow_code_execution: bool,
    },
    /// Validate a config file — and what `serve` would need of this machine: `api_key_env`
    /// variables set, access-log and feedback paths writable, telemetry complete — exit 0, or
    /// print the error (file:line: key: problem) and exit 2.
    Check {
        /// YAML config file.
        file: PathBuf,
    },
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    if let Cmd::Report {
        files,
        merge,
        token_env,
        ca_file,
        by,
        purpose,
        control,
        min_samples,
        json,
        config: roof_config,
        quality,
        accept,
    } = &cli.cmd
    {
        let mut sources: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
        sources.extend(merge.iter().cloned());
        let token = token_env.as_ref().and_then(|v| std::env::var(v).ok());
        let joined = read_quality(quality).and_then(|q| Ok((q, parse_accept(accept.as_deref())?)));
        let backends = match roof_config.as_deref().map(config::load).transpose() {
            Ok(c) => c.map(|c| c.backends.clone()).unwrap_or_default(),
            Err(e) => {
                eprintln!("error: {e:#}");
                return ExitCode::from(2);
            }
        };
        let (quality, accept) = match joined {
            Ok(j) => j,
            Err(e) => {
                eprintln!("error: {e:#}");
                return ExitCode::from(2);
            }
        };
        let opts = crate::experiment::ReportOptions {
            files: Vec::new(),
            by: by.clone(),
            purpose: purpose.clone(),
            control: control.clone(),
            min_samples: *min_samples,
            json: *json,
            quality,
            accept,
            backends,
        };
        let made =
            read_report_sources(&sources, token.as_deref(), ca_file.clone()).and_then(|read| {
                match read {
                    ReportSources::Logs(files) => {
                        let opts = crate::experiment::ReportOptions {
                            files: files.clone(),
                            ..opts
                        };
                        let text = crate::experiment::report(&opts).map_err(anyhow::Error::from)?;
                        match roof_config {
                            Some(c) => with_rooflines(text, &files, c, *json),
                            None => Ok(text),
                        }
                    }
                    ReportSources::Hdr(_) if opts.quality.len() + usize::from(opts.accept.is_some()) > 0 => {
                        anyhow::bail!("--quality and --accept are read with access logs, not with /stats?format=hdr sources (their comparisons have no intervals to judge)")
                    }
                    ReportSources::Hdr(docs) => {
                        crate::stats::hdr::report(&docs, by, control.as_deref(), *json)
                            .map_err(anyhow::Error::from)
                    }
                }
            });
        return match made {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    if let Cmd::Gpu = &cli.cmd {
        return match crate::route::nvml::read() {
            Ok(g) => {
                println!("{}", g.to_json());
                ExitCode::SUCCESS
            }
            Err(why) => {
                eprintln!("{why}");
                ExitCode::from(1)
            }
        };
    }
    if let Cmd::Check { file } = &cli.cmd {
        let checked = config::load(file).and_then(|c| {
            config::check_environment(file, &c, |k| std::env::var(k).ok()).map(|()| c)
        });
        return match checked {
            Ok(c) => {
                println!(
                    "ok: {} ({} backends, {} routes)",
                    file.display(),
                    c.backends.len(),
                    c.routes.len()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        };
    }
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
    match runtime.block_on(run(cli.cmd)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Serve {
            config,
            listen,
            admin,
        } => {
            let cfg = match &config {
                Some(path) => config::load(path)?,
                None => Arc::new(config::embedded_default()?),
            };
            crate::server::raise_fd_limit();
            let running = app::start(
                cfg,
                Overrides {
                    listen,
                    admin,
                    config_path: config.clone(),
                },
            )
            .await?;
            ready_line(&format!(
                "inferscope ready data={} admin={}",
                running.data_addr, running.admin_addr
            ))?;
            tracing::info!(data = %running.data_addr, admin = %running.admin_addr, "serving");
            terminated().await;
            tracing::info!("shutting down: draining in-flight requests");
            running.shutdown();
            if !running.wait().await {
                tracing::warn!("some requests did not finish within the grace period");
            }
            Ok(())
        }
        Cmd::Health {
            url,
            config,
            admin,
            ca_file,
        } => {
            let url = match url {
                Some(u) => u,
                None => {
                    let cfg = match &config {
                        Some(path) => config::load(path)?,
                        None => Arc::new(config::embedded_default()?),
                    };
                    let mut addr = admin.unwrap_or(cfg.admin.listen);
                    if addr.ip().is_unspecified() {
                        addr.set_ip(if addr.is_ipv4() {
                            std::net::Ipv4Addr::LOCALHOST.into()
                        } else {
                            std::net::Ipv6Addr::LOCALHOST.into()
                        });
                    }
                    let scheme = if cfg.admin.tls.is_some() {
                        "https"
                    } else {
                        "http"
                    };
                    format!("{scheme}://{addr}/healthz")
                }
            };
            let connector = crate::tls::Connector::for_url(&url, ca_file, &[b"http/1.1"])
                .context("--ca-file")?;
            let client: hyper_util::client::legacy::Client<_, http_body_util::Empty<bytes::Bytes>> =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build(connector);
            let uri: http::Uri = url.parse().with_context(|| url.clone())?;
            let resp = tokio::time::timeout(std::time::Duration::from_secs(5), client.get(uri))
                .await
                .map_err(|_| anyhow::anyhow!("{url}: no answer in 5 s"))?
                .with_context(|| url.clone())?;
            anyhow::ensure!(resp.status().is_success(), "{url}: {}", resp.status());
            Ok(())
        }
        Cmd::Demo {
            listen,
            admin,
            rate,
        } => {
            anyhow::ensure!(
                rate > 0.0 && rate <= 10_000.0,
                "--rate {rate}: between 0 and 10000 requests/s"
            );
            let cfg = Arc::new(config::embedded_default()?);
            crate::server::raise_fd_limit();
            let running = app::start(
                cfg,
                Overrides {
                    listen: Some(listen),
                    admin: Some(admin),
                    config_path: None,
                },
            )
            .await?;
            ready_line(&format!(
                "inferscope ready data={} admin={}\ndashboard: http://{}/\nload: {rate} requests/s to model `demo`, split between fp16 and int8 (Ctrl-C stops)",
                running.data_addr, running.admin_addr, running.admin_addr
            ))?;
            let url = format!("http://{}", running.data_addr);
            let load = tokio::spawn(demo_load(url, rate));
            terminated().await;
            load.abort();
            running.shutdown();
            running.wait().await;
            Ok(())
        }
        Cmd::Sim {
            listen,
            profile,
            ttft_ms,
            tpot_ms,
            jitter,
            tokens_per_chunk,
            max_batch,
            seed,
            model,
            truth_comments,
            otlp_traces_endpoint,
            otlp_delay_ms,
            queue_hold_every,
            queue_hold_ms,
            refuse,
            error_rate,
            error_status,
            die_after,
            stall_after,
            slow_first_token_ms,
            malformed_rate,
        } => {
            let mut p = sim_profile(&profile)?;
            p.ttft_base_ms = ttft_ms.unwrap_or(p.ttft_base_ms);
            p.tpot_ms = tpot_ms.unwrap_or(p.tpot_ms);
            p.jitter = jitter.unwrap_or(p.jitter);
            p.tokens_per_chunk = tokens_per_chunk.unwrap_or(p.tokens_per_chunk);
            p.max_batch = max_batch.or(p.max_batch);
            let f = &mut p.faults;
            f.refuse |= refuse;
            f.error_rate = error_rate.unwrap_or(f.error_rate);
            f.error_status = error_status.or(f.error_status);
            f.die_after_chunks = die_after.or(f.die_after_chunks);
            f.stall_after_chunks = stall_after.or(f.stall_after_chunks);
            f.slow_first_token_ms = slow_first_token_ms.unwrap_or(f.slow_first_token_ms);
            f.malformed_rate = malformed_rate.unwrap_or(f.malformed_rate);
            f.queue_hold_every = queue_hold_every.or(f.queue_hold_every);
            f.queue_hold_ms = queue_hold_ms.unwrap_or(f.queue_hold_ms);
            p.validate()?;
            let listener = crate::server::bind(listen, crate::server::DEFAULT_BACKLOG)
                .with_context(|| format!("binding {listen}"))?;
            let mut opts = SimOptions::new(p);
            opts.seed = seed;
            opts.model = model;
            opts.truth_comments = truth_comments;
            if let Some(endpoint) = otlp_traces_endpoint {
                if endpoint.scheme_str() != Some("http") || endpoint.host().is_none() {
                    anyhow::bail!("--otlp-traces-endpoint takes an http:// URL");
                }
                opts.spans = Some(sim::SpanExport {
                    endpoint,
                    delay: std::time::Duration::from_millis(otlp_delay_ms),
                });
            }
            let (stop, rx) = tokio::sync::oneshot::channel::<()>();
            let handle = sim::spawn(listener, opts, async move {
                let _ = rx.await;
            })?;
            ready_line(&format!("inferscope-sim ready addr={}", handle.addr))?;
            terminated().await;
            let _ = stop.send(());
            Ok(())
        }
        Cmd::Eval {
            dataset,
            shots,
            limit,
            out,
            json,
            perplexity,
            corpus,
            window,
            stride,
            url,
            model,
            variants,
            concurrency,
            generate,
            seed,
            headers,
            ca_file,
            suite,
            report_to,
            report_token_env,
            allow_code_execution,
        } => {
            if let Some(n) = generate {
                for item in crate::sim::quiz::generate(n, seed) {
                    println!("{}", serde_json::to_string(&item)?);
                }
                return Ok(());
            }
            let report_token = match &report_token_env {
                Some(var) => Some(
                    std::env::var(var)
                        .with_context(|| format!("--report-token-env {var}: not set"))?,
                ),
                None => None,
            };
            if let Some(admin) = &report_to {
                // Before a long run, not after it: the admin API answers, and takes the token.
                admin_call(
                    admin,
                    "/experiments",
                    report_token.as_deref(),
                    ca_file.clone(),
                    None,
                )
                .await
                .context("--report-to: the admin API must answer before the eval runs")?;
            }
            let ca_file_for_report = ca_file.clone();
            // Posts the summary where --report-to says, after printing it.
            let report = |summary: serde_json::Value| async move {
                if let Some(admin) = &report_to {
                    let answer = admin_call(
                        admin,
                        "/experiments/quality",
                        report_token.as_deref(),
                        ca_file_for_report,
                        Some(&summary),
                    )
                    .await
                    .context("--report-to")?;
                    eprintln!(
                        "posted to {admin}: experiment {} on route {}",
                        answer["experiment"], answer["route"]
                    );
                }
                anyhow::Ok(())
            };
            let target = crate::experiment::eval::EvalTarget {
                connector: crate::tls::Connector::for_url(&url, ca_file, &[b"http/1.1"])
                    .context("--ca-file")?,
                url,
                model,
                variants,
                concurrency,
                headers: parse_headers(&headers)?,
            };
            if perplexity {
                let path = corpus.context("--corpus is required")?;
                let text = crate::util::fs::read_to_string(&path, crate::util::fs::DATA_CAP)
                    .with_context(|| format!("reading {}", path.display()))?;
                anyhow::ensure!(
                    window > 0 && stride > 0,
                    "--window and --stride must be above 0"
                );
                anyhow::ensure!(stride <= window, "--stride must not exceed --window");
                let opts = crate::experiment::perplexity::PerplexityOptions {
                    target,
                    window,
                    stride,
                };
                let results = crate::experiment::perplexity::run(&opts, &text)
                    .await
                    .with_context(|| path.display().to_string())?;
                let suite = suite.unwrap_or_else(|| suite_name(&path));
                let summary = crate::experiment::perplexity::summary_json(&results, &opts, &suite);
                if json {
                    println!("{summary}");
                } else {
                    print!("{}", crate::experiment::perplexity::render(&results, &opts));
                }
                return report(summary).await;
            }
            let path = dataset.context("--dataset is required")?;
            let mut items = crate::experiment::eval::load_path(&path, shots)?;
            items.truncate(limit.unwrap_or(usize::MAX));
            let model = target.model.clone();
            let sandbox = if items.iter().any(|i| i.code.is_some()) {
                anyhow::ensure!(
                    allow_code_execution,
                    "{}: its problems are scored by running the model's code: pass --allow-code-execution to allow it",
                    path.display()
                );
                let sandbox = crate::experiment::sandbox::Sandbox::detect()
                    .await
                    .map_err(anyhow::Error::msg)?;
                eprintln!("running generated code: {}", sandbox.guarantees());
                Some(std::sync::Arc::new(sandbox))
            } else {
                None
            };
            let guarantees = sandbox.as_ref().map(|s| s.guarantees());
            let opts = crate::experiment::eval::EvalOptions {
                target,
                out,
                sandbox,
                progress: true,
            };
            let scores = crate::experiment::eval::run(&opts, &items).await;
            let suite = suite.unwrap_or_else(|| suite_name(&path));
            let mut summary = crate::experiment::eval::summary_json(&scores, &suite, &model);
            if let Some(g) = guarantees {
                summary["sandbox"] = g.into();
            }
            if json {
                println!("{summary}");
            } else {
                print!("{}", crate::experiment::eval::render(&scores));
            }
            report(summary).await
        }
        Cmd::Bench {
            url,
            model,
            dataset,
            input_words,
            rate,
            sweep,
            constant,
            concurrency,
            requests,
            duration,
            no_stream,
            max_tokens,
            slo,
            headers,
            purpose,
            out,
            compare_gateway,
            seed,
            http2_connections,
            warmup,
            ca_file,
            params_b,
            bytes_per_param,
            kv_bytes_per_token,
            gpu,
            hbm_gb_s,
            tflops,
            gpus,
        } => {
            use crate::loadgen::{self, Arrivals, BenchOptions};
            let roof = match params_b {
                None => None,
                Some(params_b) => {
                    let model = crate::config::ModelSpec {
                        params_b,
                        bytes_per_param,
                        kv_bytes_per_token,
                    };
                    let spec = crate::config::GpuSpec {
                        preset: gpu,
                        hbm_gb_s,
                        tflops,
                        count: gpus,
                    };
                    let peak = crate::stats::roofline::Peak::of(&spec).context(
                        "--params-b needs --gpu (a100, h100, h200, l4, l40s) or both --hbm-gb-s and --tflops",
                    )?;
                    Some((model, peak))
                }
            };
            let alpn: &[&[u8]] = if http2_connections.is_some() {
                &[b"h2"]
            } else {
                &[b"http/1.1"]
            };
            let connector =
                crate::tls::Connector::for_url(&url, ca_file, alpn).context("--ca-file")?;
            let prompts = match &dataset {
                Some(p) => loadgen::load_prompts(
                    &crate::util::fs::read_to_string(p, crate::util::fs::DATA_CAP)
                        .with_context(|| format!("reading {}", p.display()))?,
                )
                .with_context(|| p.display().to_string())?,
                None => loadgen::synthetic_prompts(requests.min(1000), input_words, seed),
            };
            let arrivals = match (rate, concurrency) {
                (Some(r), _) if r > 0.0 => {
                    if constant {
                        Arrivals::Constant(r)
                    } else {
                        Arrivals::Poisson(r)
                    }
                }
                (Some(r), _) => anyhow::bail!("--rate {r}: must be above 0"),
                (None, c) => Arrivals::Concurrency(c.unwrap_or(1)),
            };
            let mut headers = parse_headers(&headers)?;
            if purpose != "live" {
                headers.push((crate::meter::PURPOSE_HEADER.into(), purpose.clone()));
            }
            let opts = BenchOptions {
                url,
                model,
                prompts,
                arrivals,
                requests,
                duration: duration
                    .map(|d| config::parse_duration(&d))
                    .transpose()
                    .context("--duration")?,
                stream: !no_stream,
                max_tokens,
                slo: slo
                    .map(|s| loadgen::parse_slo(&s))
                    .transpose()
                    .context("--slo")?
                    .unwrap_or_default(),
                headers,
                seed,
                progress: true,
                http2_connections,
                warmup,
                connector,
            };
            if !sweep.is_empty() {
                let mut rows = Vec::new();
                for r in &sweep {
                    let mut o = opts.clone();
                    o.arrivals = if constant {
                        Arrivals::Constant(*r)
                    } else {
                        Arrivals::Poisson(*r)
                    };
                    let (samples, wall) = loadgen::run(&o).await;
                    let mut report = loadgen::summarize(&samples, wall, &o.slo);
                    if let serde_json::Value::Object(m) = &mut report {
                        m.insert("rate".into(), (*r).into());
                    }
                    rows.push(report);
                }
                print!("{}", loadgen::render_sweep(&rows));
                if let Some(path) = out {
                    std::fs::write(&path, serde_json::to_string_pretty(&rows)?)
                        .with_context(|| format!("writing {}", path.display()))?;
                }
                return Ok(());
            }
            let (samples, wall) = loadgen::run(&opts).await;
            let mut report = loadgen::summarize(&samples, wall, &opts.slo);
            let taken = samples.iter().any(|s| s.purpose_taken);
            if purpose != "live" && !taken && !samples.is_empty() {
                eprintln!("note: the gateway did not take x-inferscope-purpose: {purpose} (the route has no `purpose_header: true`), so these requests count as live traffic in its statistics and experiments");
            }
            let gateway = match &compare_gateway {
                // Compared with the gateway's figures for the same population.
                Some(admin) => Some(population(
                    fetch_stats(admin).await?,
                    taken.then_some(purpose.as_str()),
                )),
                None => None,
            };
            print!("{}", loadgen::render(&report, gateway.as_ref()));
            if let Some((model, peak)) = &roof {
                let v = crate::stats::roofline::assess(model, *peak, bench_measured(&report));
                for part in ["decode", "prefill"] {
                    if let Some(w) = v[part]["words"].as_str() {
                        println!("roofline: {w}");
                    }
                }
                if let serde_json::Value::Object(m) = &mut report {
                    m.insert("roofline".into(), v);
                }
            }
            if let Some(path) = out {
                let mut doc = report.clone();
                if let (Some(g), serde_json::Value::Object(m)) = (&gateway, &mut doc) {
                    m.insert("gateway".into(), g["rollups"]["all"].clone());
                }
                std::fs::write(&path, serde_json::to_string_pretty(&doc)?)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            Ok(())
        }
        Cmd::Check { .. } | Cmd::Report { .. } | Cmd::Gpu => Ok(()),
    }
}

/// What a bench run says for the roofline: its median TPOT and TTFT, mean tokens, and as the
/// batch the mean number of its requests in flight (Little's law: throughput × mean E2E; the
/// engine's batch when this run is its only load).
fn bench_measured(r: &serde_json::Value) -> crate::stats::roofline::Measured {
    let ms = |k: &str, q: &str| r[k][q].as_f64().map(|v| v / 1e3);
    let ok = r["successful"].as_f64().filter(|n| *n > 0.0);
    let secs = r["duration_s"].as_f64();
    let per_request = |k: &str| Some(r[k].as_f64()? * secs? / ok?);
    let output = per_request("output_token_throughput");
    let input = per_request("total_token_throughput")
        .zip(output)
        .map(|(t, o)| t - o);
    let in_flight = r["request_throughput"]
        .as_f64()
        .zip(ms("e2e_ms", "mean"))
        .map(|(x, e2e)| x * e2e);
    crate::stats::roofline::Measured {
        tpot_s: ms("tpot_ms", "median"),
        ttft_s: ms("ttft_ms", "median"),
        prompt_tokens: input.filter(|n| *n > 0.0),
        output_tokens: output,
        batch: in_flight.filter(|b| *b > 0.0),
        engine_prefill_s: None,
    }
}

/// A report with each configured backend's roofline (`model:` and `gpu:` in `config`) from the
/// logs' lines: appended as text, or as `roofline` in the JSON document.
fn with_rooflines(
    report: String,
    files: &[PathBuf],
    config: &std::path::Path,
    json: bool,
) -> anyhow::Result<String> {
    use crate::stats::roofline;
    let cfg = config::load(config)?;
    let mut lines = Vec::new();
    for f in files {
        let text = crate::util::fs::read_to_string(f, crate::util::fs::DATA_CAP)
            .with_context(|| format!("reading {}", f.display()))?;
        lines.extend(
            text.lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()),
        );
    }
    let mut found = serde_json::Map::new();
    let mut out = String::new();
    for b in &cfg.backends {
        let (Some(model), Some(peak)) = (b.model, b.gpu.as_ref().and_then(roofline::Peak::of))
        else {
            continue;
        };
        let (m, n) = roofline::measured_from_log(&lines, &b.name);
        if n == 0 {
            continue;
        }
        let v = roofline::assess(&model, peak, m);
        out.push_str(&format!(
            "
roofline of {} ({n} requests):
",
            b.name
        ));
        for part in ["decode", "prefill"] {
            if let Some(w) = v[part]["words"].as_str() {
                out.push_str(&format!(
                    "  {w}
"
                ));
            }
        }
        found.insert(b.name.clone(), v);
    }
    if !json {
        return Ok(report + &out);
    }
    let mut doc: serde_json::Value = serde_json::from_str(&report)?;
    if let serde_json::Value::Object(m) = &mut doc {
        m.insert("roofline".into(), found.into());
    }
    Ok(serde_json::to_string_pretty(&doc)? + "\n")
}

/// The demo's traffic: the load generator in one-minute rounds, forever; no user key, so each
/// request is assigned a variant at random.
async fn demo_load(url: String, rate: f64) {
    use crate::loadgen::{self, Arrivals, BenchOptions};
    let Ok(connector) = crate::tls::Connector::for_url(&url, None, &[b"http/1.1"]) else {
        return;
    };
    for round in 0u64.. {
        let opts = BenchOptions {
            url: url.clone(),
            model: "demo".into(),
            prompts: loadgen::synthetic_prompts(200, 40, round),
            arrivals: Arrivals::Poisson(rate),
            requests: (rate * 120.0) as usize + 100,
            duration: Some(std::time::Duration::from_secs(60)),
            stream: true,
            max_tokens: 64,
            slo: Vec::new(),
            headers: Vec::new(),
            seed: round,
            progress: false,
            http2_connections: None,
            warmup: 0,
            connector: connector.clone(),
        };
        loadgen::run(&opts).await;
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

/// The eval results given to `report --quality`, each checked as the admin API checks a post.
fn read_quality(
    files: &[PathBuf],
) -> anyhow::Result<Vec<crate::experiment::quality::QualityResult>> {
    files
        .iter()
        .map(|f| {
            let bytes = crate::util::fs::read(f, crate::util::fs::DATA_CAP)
                .with_context(|| format!("--quality {}", f.display()))?;
            crate::experiment::quality::QualityResult::parse(&bytes)
                .with_context(|| format!("--quality {}", f.display()))
        })
        .collect()
}

/// `report --accept KEY=VALUE,...`, the keys of an experiment's `accept:`.
fn parse_accept(s: Option<&str>) -> anyhow::Result<Option<crate::config::AcceptConfig>> {
    let Some(s) = s else { return Ok(None) };
    let mut a = crate::config::AcceptConfig::default();
    for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .with_context(|| format!("--accept {pair}: write KEY=VALUE"))?;
        let v: f64 = v
            .trim()
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite())
            .with_context(|| format!("--accept {pair}: not a number"))?;
        let slot = match k.trim() {
            "ttft_change_max" => &mut a.ttft_change_max,
            "tpot_change_max" => &mut a.tpot_change_max,
            "e2e_change_max" => &mut a.e2e_change_max,
            "accuracy_drop_max_points" => &mut a.accuracy_drop_max_points,
            "ppl_rise_max" => &mut a.ppl_rise_max,
            other => anyhow::bail!("--accept {other}: use ttft_change_max, tpot_change_max, e2e_change_max, accuracy_drop_max_points or ppl_rise_max"),
        };
        *slot = Some(v);
    }
    anyhow::ensure!(a.limits().next().is_some(), "--accept: no limit given");
    Ok(Some(a))
}

/// A suite's default name: the file's (or MMLU directory's) name without its extension.
fn suite_name(path: &std::path::Path) -> String {
    let name = path
        .file_name()
        .map_or_else(|| "suite".into(), |s| s.to_string_lossy().into_owned());
    let mut stem = name.as_str();
    for ext in [".gz", ".jsonl", ".json", ".csv"] {
        stem = stem.strip_suffix(ext).unwrap_or(stem);
    }
    stem.to_owned()
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

/// `GET {admin}/stats`.
/// A `/stats` document whose overall rollup is `purpose`'s (the rollups are of live traffic;
/// requests a benchmark declared are counted under their purpose).
fn population(mut stats: serde_json::Value, purpose: Option<&str>) -> serde_json::Value {
    let Some(p) = purpose else {
        return stats;
    };
    let own = stats["rollups"]["purpose"]
        .as_array()
        .and_then(|l| l.iter().find(|g| g["purpose"] == p))
        .cloned()
        .unwrap_or(serde_json::Value::Null);
    stats["rollups"]["all"] = own;
    stats
}

async fn fetch_stats(admin: &str) -> anyhow::Result<serde_json::Value> {
    fetch_json(admin, "/stats", None, None).await
}

/// What `report` was given: access logs, or HdrHistogram exports.
enum ReportSources {
    Logs(Vec<PathBuf>),
    Hdr(Vec<serde_json::Value>),
}

/// Reads every source: an admin URL is fetched at `/stats?format=hdr`; a file holding one JSON
/// document of that format is an export; any other file is an access log. Mixing the two is an
/// error (a log's samples and a histogram's buckets do not add up to one population).
fn read_report_sources(
    sources: &[String],
    token: Option<&str>,
    ca_file: Option<PathBuf>,
) -> anyhow::Result<ReportSources> {
    let mut logs = Vec::new();
    let mut docs = Vec::new();
    let urls: Vec<&String> = sources
        .iter()
        .filter(|s| s.starts_with("http://") || s.starts_with("https://"))
        .collect();
    if !urls.is_empty() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        for u in &urls {
            let doc = rt.block_on(fetch_json(u, "/stats?format=hdr", token, ca_file.clone()))?;
            docs.push(doc);
        }
    }
    for s in sources.iter().filter(|s| !urls.contains(s)) {
        let path = PathBuf::from(s);
        let text = crate::util::fs::read_to_string(&path, crate::util::fs::DATA_CAP)
            .with_context(|| s.clone())?;
        match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(v) if v["format"] == crate::stats::hdr::FORMAT => docs.push(v),
            _ => logs.push(path),
        }
    }
    match (logs.is_empty(), docs.is_empty()) {
        (false, false) => anyhow::bail!(
            "give access logs or /stats?format=hdr exports (admin URLs), not both: a log's samples and a histogram's buckets are not one population"
        ),
        (true, _) => Ok(ReportSources::Hdr(docs)),
        (false, true) => Ok(ReportSources::Logs(logs)),
    }
}
