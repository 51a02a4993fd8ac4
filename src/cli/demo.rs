//! `inferscope demo`: the embedded default with background load, for the dashboard.

use super::{ready_line, terminated};
use crate::app::{self, Overrides};
use crate::config;
use std::net::SocketAddr;
use std::sync::Arc;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Data-plane address (port 0 picks a free port).
    #[arg(long, default_value_t = config::DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// Admin address: the dashboard (port 0 picks a free port).
    #[arg(long, default_value_t = config::DEFAULT_ADMIN_LISTEN)]
    admin: SocketAddr,
    /// Background requests per second (Poisson arrivals).
    #[arg(long, default_value_t = 8.0)]
    rate: f64,
}

pub(crate) async fn exec(args: Args) -> anyhow::Result<()> {
    let Args {
        listen,
        admin,
        rate,
    } = args;
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

/// The demo's traffic: the load generator in one-minute rounds, forever; no user key, so each
/// request is assigned a variant at random.
async fn demo_load(url: String, rate: f64) {
    use crate::lab::loadgen::{self, Arrivals, BenchOptions};
    let Ok(connector) = crate::tls::Connector::for_url(&url, None, &[b"http/1.1"]) else {
        return;
    };
    for round in 0u64.. {
        let opts = BenchOptions {
            url: url.clone(),
            model: "demo".into(),
            endpoint: Default::default(),
            prompts: loadgen::synthetic_prompts(200, 40, round),
            arrivals: Arrivals::Poisson(rate),
            pacing: Default::default(),
            // About a minute's worth, each round drained (not cut: the dashboard shows no
            // cancelled requests of its own making).
            requests: (rate * 60.0).ceil() as usize,
            duration: None,
            stream: true,
            max_tokens: 64,
            ignore_eos: false,
            timeout: None,
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
