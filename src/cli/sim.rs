//! `inferscope sim`: a simulated backend, with its faults.

use super::{ready_line, terminated};
use crate::config::sim_profile;
use crate::sim::{self, SimOptions};
use anyhow::Context as _;
use std::net::SocketAddr;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
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
}

pub(crate) async fn exec(args: Args) -> anyhow::Result<()> {
    let Args {
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
    } = args;
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
