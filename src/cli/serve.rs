//! `inferscope serve`: the gateway, until SIGTERM or SIGINT, then drained in order.

use super::{ready_line, terminated};
use crate::app::{self, Overrides};
use crate::config;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// YAML config file.
    #[arg(long, env = "INFERSCOPE_CONFIG")]
    config: Option<PathBuf>,
    /// Data-plane address, overriding the config (port 0 picks a free port).
    #[arg(long, env = "INFERSCOPE_LISTEN")]
    listen: Option<SocketAddr>,
    /// Admin address, overriding the config (port 0 picks a free port).
    #[arg(long, env = "INFERSCOPE_ADMIN")]
    admin: Option<SocketAddr>,
}

pub(crate) async fn exec(args: Args) -> anyhow::Result<()> {
    let Args {
        config,
        listen,
        admin,
    } = args;
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
