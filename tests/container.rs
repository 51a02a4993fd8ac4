//! The container image, built from `docker/Dockerfile` (its `prebuilt` target, with this build's
//! binary) and run with podman: it serves the embedded-simulator demo as a non-root user, streams
//! a request, answers `/healthz` and its HEALTHCHECK, writes the access log in its state
//! directory; and the parts of `docker/compose.yaml` that can run here — the gateway with the
//! compose config, the two simulators from the same image, and Prometheus (the Debian package,
//! native histograms on, scraping as compose's config does) — work together.
//!
//! A second-lane test (`cargo test --test it container:: -- --ignored`): it needs podman and the base
//! image `docker/podman-setup.sh` makes, as `.ci/run` does, and fails without them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::prom::{query, scalar};
use common::*;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const BASE: &str = "docker.io/library/debian:bookworm-slim";

struct Podman {
    conf: PathBuf,
    runc: bool,
}

impl Podman {
    fn cmd(&self) -> Command {
        let mut c = Command::new("podman");
        // Settings this machine kind needs (../shared/CONTAINERS.md); harmless elsewhere.
        c.env("CONTAINERS_CONF", &self.conf);
        if self.runc {
            c.args(["--runtime", "runc", "--cgroup-manager", "cgroupfs"]);
        }
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "podman {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

/// Podman with the base image (a second-lane test: without them it fails, saying why).
fn podman() -> Podman {
    let conf = match std::env::var_os("CONTAINERS_CONF") {
        Some(c) => PathBuf::from(c),
        None => {
            let c = temp_dir().join("containers.conf");
            std::fs::write(&c, "[containers]\ndefault_ulimits = []\n").unwrap();
            c
        }
    };
    let runc = Command::new("runc").arg("--version").output().is_ok();
    let p = Podman { conf, runc };
    match p.cmd().arg("info").output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "podman cannot run here: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => panic!("this test needs podman (docker/podman-setup.sh; .ci/run runs it): {e}"),
    }
    assert!(
        p.run(&["image", "exists", BASE]).status.success(),
        "no {BASE} image: run docker/podman-setup.sh"
    );
    p
}

/// Builds the image's `prebuilt` target with this build's binary.
fn build(p: &Podman, tag: &str) {
    let ctx = temp_dir();
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    std::fs::create_dir_all(ctx.join("docker")).unwrap();
    for f in ["Dockerfile", "inferscope.yaml"] {
        std::fs::copy(repo.join("docker").join(f), ctx.join("docker").join(f)).unwrap();
    }
    std::fs::copy(env!("CARGO_BIN_EXE_inferscope"), ctx.join("inferscope")).unwrap();
    let file = ctx.join("docker/Dockerfile");
    p.ok(&[
        "build",
        "--format",
        "docker",
        "--target",
        "prebuilt",
        "--build-arg",
        "BINARY=inferscope",
        "-t",
        tag,
        "-f",
        file.to_str().unwrap(),
        ctx.to_str().unwrap(),
    ]);
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A container removed when dropped.
struct Container<'a> {
    p: &'a Podman,
    id: String,
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        let _ = self.p.run(&["rm", "-f", "-t", "2", &self.id]);
    }
}

fn start<'a>(p: &'a Podman, args: &[&str]) -> Container<'a> {
    let mut all = vec!["run", "-d", "--network=host"];
    all.extend(args);
    Container { p, id: p.ok(&all) }
}

/// The image's gateway on free loopback ports (`INFERSCOPE_LISTEN`, `INFERSCOPE_ADMIN`), with
/// `extra` podman arguments; returns it with its data and admin addresses.
fn gateway<'a>(
    p: &'a Podman,
    tag: &str,
    extra: &[&str],
) -> (Container<'a>, SocketAddr, SocketAddr) {
    let (data, admin) = (free_addr(), free_addr());
    let (listen, adm) = (
        format!("INFERSCOPE_LISTEN={data}"),
        format!("INFERSCOPE_ADMIN={admin}"),
    );
    let mut args: Vec<&str> = extra.to_vec();
    args.extend(["-e", &listen, "-e", &adm, tag]);
    (start(p, &args), data, admin)
}

async fn healthy(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {addr}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(admin_get(addr, "/healthz").await.0, 200);
}

fn access_log(p: &Podman, c: &Container) -> Vec<Value> {
    p.ok(&[
        "exec",
        &c.id,
        "cat",
        "/var/lib/inferscope/inferscope-access.jsonl",
    ])
    .lines()
    .map(|l| serde_json::from_str(l).unwrap())
    .collect()
}

async fn wait_log(p: &Podman, c: &Container<'_>, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = access_log(p, c);
        if log.len() >= n || Instant::now() > deadline {
            return log;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs podman, its base image and prometheus"]
async fn the_image_serves_streams_logs_and_reports_health() {
    let p = podman();
    let tag = format!("localhost/inferscope:test-{}", std::process::id());
    build(&p, &tag);

    // The image as shipped: its own config (the demo), addresses from the environment.
    let (c, data, admin) = gateway(&p, &tag, &[]);
    healthy(admin).await;
    let r = post(data, "/v1/chat/completions", &chat(true, 5, ""), &[]).await;
    assert_eq!(r.status, 200);
    assert!(String::from_utf8_lossy(&r.body())
        .trim_end()
        .ends_with("data: [DONE]"));
    let log = wait_log(&p, &c, 1).await;
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0]["outcome"], "ok");
    assert_eq!(log[0]["stream"], true);
    assert_eq!(
        p.ok(&["exec", &c.id, "id", "-u"]),
        "65534",
        "runs as non-root"
    );
    // The binary carries NVML, loaded at run time: with no driver here it says "no GPU" (and
    // exits 1) rather than "this build has no NVML support".
    let gpu = p.run(&["exec", &c.id, "inferscope", "gpu"]);
    let said = String::from_utf8_lossy(&gpu.stderr);
    assert_eq!(gpu.status.code(), Some(1), "{said}");
    assert!(
        said.contains("no GPU: NVML could not start"),
        "the image's binary has NVML: {said}"
    );
    // The HEALTHCHECK the image declares passes (it runs `inferscope health`).
    let image: Value = serde_json::from_str(&p.ok(&["image", "inspect", &tag])).unwrap();
    let hc = &image[0]["Healthcheck"]["Test"];
    assert_eq!(
        hc,
        &serde_json::json!(["CMD", "inferscope", "health"]),
        "{image}"
    );
    let out = p.run(&["healthcheck", "run", &c.id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // SIGTERM drains and exits 0.
    p.ok(&["stop", "-t", "20", &c.id]);
    assert_eq!(
        p.ok(&["inspect", "--format", "{{.State.ExitCode}}", &c.id]),
        "0"
    );
    drop(c);

    // The compose setup's parts that run here, together: two simulators from the image, the
    // gateway with compose's config (service names → loopback ports), Prometheus with compose's
    // scrape config (the same rewrite).
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let (fp16, int8) = (free_addr(), free_addr());
    let _sims: Vec<Container> = [("fp16", fp16), ("int8", int8)]
        .iter()
        .map(|(profile, addr)| {
            start(
                &p,
                &[
                    &tag,
                    "sim",
                    "--listen",
                    &addr.to_string(),
                    "--profile",
                    profile,
                ],
            )
        })
        .collect();
    let dir = temp_dir();
    let compose_cfg = std::fs::read_to_string(repo.join("docker/compose/inferscope.yaml"))
        .unwrap()
        .replace("sim-fp16:8000", &fp16.to_string())
        .replace("sim-int8:8000", &int8.to_string());
    // No collector here: the telemetry section goes.
    let compose_cfg = compose_cfg
        .split("\ntelemetry:")
        .next()
        .unwrap()
        .to_string()
        + "\n";
    let cfg_path = dir.join("config.yaml");
    std::fs::write(&cfg_path, &compose_cfg).unwrap();
    let mount = format!("{}:/etc/inferscope/config.yaml:ro", cfg_path.display());
    let (gw, data, admin) = gateway(&p, &tag, &["-v", &mount]);
    healthy(admin).await;
    wait_ready(admin).await;
    const N: usize = 20;
    for i in 0..N {
        let r = post(
            data,
            "/v1/chat/completions",
            &chat(true, 4, ""),
            &[("x-user-id", &format!("u{i}"))],
        )
        .await;
        assert_eq!(r.status, 200);
    }
    let log = wait_log(&p, &gw, N).await;
    let variants: std::collections::BTreeSet<&str> =
        log.iter().filter_map(|l| l["variant"].as_str()).collect();
    assert_eq!(variants.len(), 2, "both simulators served: {variants:?}");

    let bin = common::prom::binary();
    let scrape = std::fs::read_to_string(repo.join("docker/compose/prometheus.yml"))
        .unwrap()
        .replace("inferscope:9464", &admin.to_string())
        .replace("scrape_interval: 5s", "scrape_interval: 1s");
    let scrape = scrape
        .split("  - job_name: otel-collector")
        .next()
        .unwrap()
        .to_string();
    let prom = common::prom::start(&bin, &dir, "compose", &scrape, true);
    common::prom::scraped(&prom, 1, N).await;
    let p99 = scalar(
        &query(
            &prom,
            "histogram_quantile(0.99, sum(inferscope_time_to_first_token_seconds))",
        )
        .await,
    )
    .unwrap();
    assert!(p99 > 0.0 && p99 < 1.0, "TTFT p99 {p99} s");
    let _ = p.run(&["rmi", "-f", &tag]);
}

/// Waits until `/readyz` is 200 (the probes found the simulators healthy).
async fn wait_ready(admin: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while admin_get(admin, "/readyz").await.0 != 200 {
        assert!(Instant::now() < deadline, "not ready in 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
