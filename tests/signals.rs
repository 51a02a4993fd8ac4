//! The real binary under real signals: SIGHUP with a broken config keeps serving the old one;
//! SIGHUP reads listener certificates again; SIGTERM lets an in-flight stream finish, flushes the
//! access log and exits 0.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use std::process::Command;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_with_a_bad_config_keeps_serving_and_sigterm_drains() {
    let sim = start_sim(exact(5.0, 20.0), 1).await;
    let dir = temp_dir();
    let path = dir.join("gw.yaml");
    let good = format!(
        "access_log: {{ path: {:?} }}\nbackends:\n  - {{ name: s, url: \"http://{}\" }}\nroutes:\n  - {{ name: all, backends: [s] }}\n",
        dir.join("access.jsonl"),
        sim.addr
    );
    std::fs::write(&path, &good).unwrap();
    let stderr = std::fs::File::create(dir.join("stderr.txt")).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_inferscope"));
    cmd.stderr(stderr);
    let (mut child, data, admin) = serve_with(cmd, &path);
    let pid = child.id();

    assert_eq!(
        post(data, "/v1/chat/completions", &chat(true, 2, ""), &[])
            .await
            .status,
        200
    );
    std::fs::write(&path, "routes: [ this is not yaml").unwrap();
    signal(pid, "-HUP");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, m) = admin_get(admin, "/metrics").await;
        if m.contains("inferscope_config_reload_failures_total 1") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the reload was never attempted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        post(data, "/v1/chat/completions", &chat(true, 2, ""), &[])
            .await
            .status,
        200,
        "old config still serving"
    );
    // The same bad file again (the watcher saw the edit, the operator sends SIGHUP): counted,
    // but logged once.
    let failures = || metric(admin, "inferscope_config_reload_failures_total");
    let before = failures().await;
    signal(pid, "-HUP");
    until(Duration::from_secs(10), "the second reload", || async {
        failures().await > before
    })
    .await;

    // SIGTERM while a stream is in flight: it completes, then the process exits 0.
    let stream =
        tokio::spawn(
            async move { post(data, "/v1/chat/completions", &chat(true, 25, ""), &[]).await },
        );
    let t = tokio::time::Instant::now();
    while sim.active() == 0 && t.elapsed() < Duration::from_secs(5) {
        tokio::task::yield_now().await;
    }
    signal(pid, "-TERM");
    let r = stream.await.unwrap();
    assert!(
        r.body().ends_with(b"data: [DONE]\n\n"),
        "the in-flight stream finished during the drain"
    );
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "exit status {status:?}");
    let log = std::fs::read_to_string(dir.join("access.jsonl")).unwrap();
    assert_eq!(
        log.lines().count(),
        3,
        "every request logged and flushed before exit"
    );
    let stderr = std::fs::read_to_string(dir.join("stderr.txt")).unwrap();
    assert_eq!(
        stderr.matches("config reload rejected").count(),
        1,
        "{stderr}"
    );
}

async fn wait_metric(admin: std::net::SocketAddr, needle: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, m) = admin_get(admin, "/metrics").await;
        if m.lines().any(|l| l == needle) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never saw `{needle}`"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr1_reopens_the_access_log_for_logrotate() {
    let sim = start_sim(exact(1.0, 1.0), 1).await;
    let dir = temp_dir();
    let path = dir.join("gw.yaml");
    let log = dir.join("access.jsonl");
    std::fs::write(
        &path,
        format!(
            "access_log: {{ path: {log:?} }}\nbackends:\n  - {{ name: s, url: \"http://{}\" }}\nroutes:\n  - {{ name: all, backends: [s] }}\n",
            sim.addr
        ),
    )
    .unwrap();
    let (mut child, data, admin) = serve(&path);
    for _ in 0..3 {
        assert_eq!(
            post(data, "/v1/chat/completions", &chat(false, 2, ""), &[])
                .await
                .status,
            200
        );
    }
    wait_metric(admin, "inferscope_access_log_written_total 3").await;
    // logrotate: move the file away, then signal.
    let moved = dir.join("access.jsonl.1");
    std::fs::rename(&log, &moved).unwrap();
    signal(child.id(), "-USR1");
    wait_metric(admin, "inferscope_access_log_rotations_total 1").await;
    for _ in 0..2 {
        assert_eq!(
            post(data, "/v1/chat/completions", &chat(false, 2, ""), &[])
                .await
                .status,
            200
        );
    }
    signal(child.id(), "-TERM");
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success());
    let count = |p: &std::path::Path| std::fs::read_to_string(p).unwrap().lines().count();
    assert_eq!((count(&moved), count(&log)), (3, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_fd_limit_caps_connections_keeps_admin_up_and_does_not_flood_the_log() {
    if Command::new("prlimit").arg("--version").output().is_err() {
        eprintln!("no prlimit here: skipped");
        return;
    }
    let sim = start_sim(exact(1.0, 1.0), 1).await;
    let dir = temp_dir();
    let path = dir.join("gw.yaml");
    std::fs::write(
        &path,
        format!(
            "limits: {{ client_idle_timeout: 1s, header_read_timeout: 1s, max_connections: 1000 }}\nbackends:\n  - {{ name: s, url: \"http://{}\" }}\nroutes:\n  - {{ name: all, backends: [s] }}\n",
            sim.addr
        ),
    )
    .unwrap();
    let stderr = std::fs::File::create(dir.join("stderr.txt")).unwrap();
    let mut cmd = Command::new("prlimit");
    cmd.arg("--nofile=256:256")
        .arg(env!("CARGO_BIN_EXE_inferscope"))
        .stderr(stderr);
    let (mut child, data, admin) = serve_with(cmd, &path);
    // More silent connections than the gateway has descriptors for.
    let mut silent = Vec::new();
    for _ in 0..300 {
        silent.push(tokio::net::TcpStream::connect(data).await.unwrap());
    }
    // Until the gateway meets the full table: a connection refused at capacity, or an accept
    // that failed for want of a descriptor.
    until(
        Duration::from_secs(10),
        "the data plane full",
        || async move {
            metric(admin, "inferscope_client_connections_at_capacity_total").await
                + metric(admin, "inferscope_accept_errors_total").await
                > 0.0
        },
    )
    .await;
    let (status, _) = tokio::time::timeout(Duration::from_secs(3), admin_get(admin, "/healthz"))
        .await
        .expect("/healthz did not answer with the data plane full");
    assert_eq!(status, 200);
    // Real traffic gets through once the silent ones are closed for idling.
    let r = tokio::time::timeout(
        Duration::from_secs(15),
        post(data, "/v1/chat/completions", &chat(false, 2, ""), &[]),
    )
    .await
    .expect("a real request never got through");
    assert_eq!(r.status, 200);
    drop(silent);
    signal(child.id(), "-TERM");
    let _ = tokio::task::spawn_blocking(move || child.wait()).await;
    let log = std::fs::read_to_string(dir.join("stderr.txt")).unwrap();
    assert!(log.contains("max_connections lowered"), "{log}");
    let floods = log.matches("accept failed").count();
    assert!(floods <= 2, "{floods} accept-failure lines:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reads_the_listener_certificate_again() {
    let sim = start_sim(exact(1.0, 1.0), 1).await;
    let dir = temp_dir();
    let p = pki::make(&dir);
    let path = dir.join("gw.yaml");
    std::fs::write(
        &path,
        format!(
            "tls: {{ cert: {:?}, key: {:?} }}\nbackends:\n  - {{ name: s, url: \"http://{}\" }}\nroutes:\n  - {{ name: all, backends: [s] }}\n",
            p.server_cert, p.server_key, sim.addr
        ),
    )
    .unwrap();
    let (mut child, data, _admin) = serve(&path);
    let works = |ca: std::path::PathBuf| async move {
        let Ok(tls) = pki::connect(data, pki::client_config(&ca, None, &[b"http/1.1"])).await
        else {
            return false;
        };
        let r = Client::over(tls)
            .await
            .send("GET", "/v1/models", "", &[])
            .await;
        r.status == 200
    };
    assert!(works(p.ca.clone()).await);
    // New files with the old modification times: only the signal can make them noticed.
    let stamp = |f: &std::path::Path| std::fs::metadata(f).unwrap().modified().unwrap();
    let (cert_t, key_t) = (stamp(&p.server_cert), stamp(&p.server_key));
    let new_ca = dir.join("new-ca.pem");
    pki::reissue_server(&dir, &new_ca);
    for (f, t) in [(&p.server_cert, cert_t), (&p.server_key, key_t)] {
        std::fs::File::options()
            .write(true)
            .open(f)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(works(p.ca.clone()).await, "not reloaded without the signal");
    signal(child.id(), "-HUP");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !works(new_ca.clone()).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "SIGHUP did not reload the certificate"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!works(p.ca.clone()).await);
    signal(child.id(), "-TERM");
    assert!(child.wait().unwrap().success());
}
