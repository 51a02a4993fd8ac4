//! A real Prometheus (the Debian package) for tests: started on a free loopback port with a
//! scrape config of the test's, queried over its HTTP API.

use super::admin_get;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running Prometheus, killed on drop.
pub struct Prometheus {
    child: Child,
    /// Its HTTP API.
    pub addr: SocketAddr,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `prometheus` on PATH (a second-lane test: absent, it fails).
pub fn binary() -> PathBuf {
    super::program(&["prometheus"], "apt-get install prometheus")
}

/// Starts Prometheus with `config` (YAML text), its data under `dir/name`, native histograms on
/// when `native`.
pub fn start(bin: &Path, dir: &Path, name: &str, config: &str, native: bool) -> Prometheus {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let cfg = dir.join(format!("prometheus-{name}.yml"));
    std::fs::write(&cfg, config).unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg(format!("--config.file={}", cfg.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join(name).display()))
        .arg(format!("--web.listen-address={addr}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if native {
        cmd.arg("--enable-feature=native-histograms");
    }
    Prometheus {
        child: cmd.spawn().unwrap(),
        addr,
    }
}

/// A scrape config for `targets`, every second.
pub fn scrape_config(targets: &[SocketAddr]) -> String {
    let list: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
    format!(
        "global: {{ scrape_interval: 1s, evaluation_interval: 1s }}\nscrape_configs:\n  - job_name: inferscope\n    static_configs:\n      - targets: [{}]\n",
        list.join(", ")
    )
}

/// Percent-encodes a query parameter.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An instant query's result vector.
pub async fn query(p: &Prometheus, q: &str) -> Vec<Value> {
    let (status, body) = admin_get(p.addr, &format!("/api/v1/query?query={}", encode(q))).await;
    assert_eq!(status, 200, "{q}: {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// The first sample's value.
pub fn scalar(result: &[Value]) -> Option<f64> {
    result.first()?["value"][1].as_str()?.parse().ok()
}

/// Waits until the last scrapes of `targets` targets saw `requests` finished requests in all.
pub async fn scraped(p: &Prometheus, targets: usize, requests: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            Instant::now() < deadline,
            "Prometheus at {} did not scrape {targets} targets in 60 s",
            p.addr
        );
        // Connection refused while it starts: retry.
        if tokio::net::TcpStream::connect(p.addr).await.is_ok() {
            let n = scalar(&query(p, "sum(inferscope_requests_total)").await);
            let up = scalar(&query(p, "sum(up)").await);
            if n == Some(requests as f64) && up == Some(targets as f64) {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
