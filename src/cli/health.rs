//! `inferscope health`: exit 0 when the admin `/healthz` answers 200 (a container HEALTHCHECK).

use crate::config;
use anyhow::Context as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
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
}

pub(crate) async fn exec(args: Args) -> anyhow::Result<()> {
    let Args {
        url,
        config,
        admin,
        ca_file,
    } = args;
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
    let connector =
        crate::tls::Connector::for_url(&url, ca_file, &[b"http/1.1"]).context("--ca-file")?;
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
