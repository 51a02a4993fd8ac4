//! The access log keeps its promise — every request is one whole line — on a full disk, across
//! rotation, and for streams cut at the end of the shutdown grace period.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A gateway in front of `backend` with `access_log: LOG`.
async fn logging_to(log: &str, backend: std::net::SocketAddr) -> inferscope::app::Running {
    start_yaml(&format!(
        "access_log: {log}\nbackends:\n  - {{ name: s, url: \"http://{backend}\" }}\nroutes:\n  - {{ name: all, backends: [s] }}\n"
    ))
    .await
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing"))
}

fn lines_of(p: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(p).unwrap_or_default();
    assert!(text.is_empty() || text.ends_with('\n'), "a torn last line");
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a whole line ({e}): {l}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: mounts a small tmpfs (lane 2)"]
async fn a_full_disk_tears_no_line_and_loses_none_once_space_returns() {
    let disk = SmallDisk::mount(256);
    // Leave ~12 KiB free: a few writes fit, then the disk is full.
    let filler = disk.0.join("filler");
    std::fs::write(&filler, vec![0u8; 244 << 10]).unwrap();
    let sim = start_sim(exact(1.0, 1.0), 1).await;
    let log_path = disk.0.join("access.jsonl");
    let gw = logging_to(&format!("{{ path: {log_path:?} }}"), sim.addr).await;
    let n = 100;
    for _ in 0..n {
        let r = post(
            gw.data_addr,
            "/v1/chat/completions",
            &chat(true, 4, ""),
            &[],
        )
        .await;
        assert_eq!(r.status, 200);
    }
    let errors = || async {
        let (_, m) = admin_get(gw.admin_addr, "/metrics").await;
        metric(&m, "inferscope_access_log_write_errors_total")
    };
    until(
        Duration::from_secs(5),
        "a write failed on the full disk",
        || async { errors().await > 0 },
    )
    .await;
    let (_, m) = admin_get(gw.admin_addr, "/metrics").await;
    let written = metric(&m, "inferscope_access_log_written_total");
    assert!(written < n, "the disk never filled ({written} written)");
    assert!(metric(&m, "inferscope_access_log_write_errors_total") > 0);
    // What is on disk is whole lines, exactly as many as counted written.
    assert_eq!(lines_of(&log_path).len() as u64, written);
    // Space comes back: the kept lines follow, none lost.
    std::fs::remove_file(&filler).unwrap();
    until(
        Duration::from_secs(5),
        "every line written once space came back",
        || async {
            let (_, m) = admin_get(gw.admin_addr, "/metrics").await;
            metric(&m, "inferscope_access_log_written_total") == n
        },
    )
    .await;
    let (_, m) = admin_get(gw.admin_addr, "/metrics").await;
    assert_eq!(metric(&m, "inferscope_access_log_lost_total"), 0);
    gw.shutdown();
    assert!(gw.wait().await);
    let lines = lines_of(&log_path);
    assert_eq!(lines.len() as u64, n);
    let mut ids: Vec<&str> = lines
        .iter()
        .map(|l| l["request_id"].as_str().unwrap())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len() as u64, n, "a line written twice");
    drop(disk);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_that_cannot_be_written_says_so() {
    // /dev/full: every write fails with ENOSPC.
    let sim = start_sim(exact(1.0, 1.0), 1).await;
    let gw = logging_to("{ path: /dev/full }", sim.addr).await;
    for _ in 0..20 {
        post(
            gw.data_addr,
            "/v1/chat/completions",
            &chat(false, 2, ""),
            &[],
        )
        .await;
    }
    until(
        Duration::from_secs(5),
        "the failed write counted",
        || async {
            let (_, m) = admin_get(gw.admin_addr, "/metrics").await;
            metric(&m, "inferscope_access_log_write_errors_total") >= 1
        },
    )
    .await;
    let (_, m) = admin_get(gw.admin_addr, "/metrics").await;
    assert_eq!(metric(&m, "inferscope_access_log_written_total"), 0);
    assert!(metric(&m, "inferscope_access_log_write_errors_total") >= 1);
    let recorder = std::sync::Arc::clone(&gw.recorder);
    gw.shutdown();
    assert!(gw.wait().await);
    // Closed with the lines unwritten: every one counted as lost.
    assert_eq!(recorder.log.lost(), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn size_rotation_keeps_whole_lines_and_a_bounded_number_of_files() {
    let sim = start_sim(exact(1.0, 1.0), 1).await;
    let dir = temp_dir();
    let log_path = dir.join("access.jsonl");
    let log = format!("{{ path: {log_path:?}, rotate: {{ max_bytes: 4096, keep: 2 }} }}");
    let gw = logging_to(&log, sim.addr).await;
    let n = 60;
    for i in 0..n {
        post(
            gw.data_addr,
            "/v1/chat/completions",
            &chat(false, 2, ""),
            &[],
        )
        .await;
        if i % 5 == 4 {
            // Several writes, so rotation has points to happen at.
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }
    let recorder = std::sync::Arc::clone(&gw.recorder);
    gw.shutdown();
    assert!(gw.wait().await);
    assert!(
        recorder.log.rotations() >= 2,
        "{}",
        recorder.log.rotations()
    );
    let files: Vec<PathBuf> = ["", ".1", ".2"]
        .iter()
        .map(|s| PathBuf::from(format!("{}{s}", log_path.display())))
        .collect();
    assert!(!Path::new(&format!("{}.3", log_path.display())).exists());
    let mut total = 0;
    for f in &files {
        let size = std::fs::metadata(f).unwrap().len();
        assert!(size <= 4096, "{} is {size} bytes", f.display());
        total += lines_of(f).len();
    }
    // Older files were deleted (keep: 2): fewer lines remain than were written, all whole.
    assert!(total > 0 && total < n);
    assert_eq!(recorder.log.written(), n as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_cut_when_the_grace_period_ends_are_logged_as_shutdown() {
    let slow = start_sim(exact(5.0, 100.0), 1).await;
    let dir = temp_dir();
    let gw = start_gateway(
        &[("s", slow.addr)],
        &dir,
        "limits:\n  shutdown_grace: 300ms\n",
    )
    .await;
    let addr = gw.data_addr;
    // A stream that needs ~5 s, started before the shutdown.
    let stream = tokio::spawn(async move {
        let mut c = Client::connect(addr).await;
        c.send("POST", "/v1/chat/completions", &chat(true, 50, ""), &[])
            .await
    });
    until(Duration::from_secs(5), "the backend streaming", || {
        let active = slow.active();
        async move { active > 0 }
    })
    .await;
    // Some tokens on their way (one every 100 ms), none near the end.
    tokio::time::sleep(Duration::from_millis(100)).await;
    gw.shutdown();
    assert!(!gw.wait().await, "the stream could not have finished");
    let r = stream.await.unwrap();
    assert!(!r.body().ends_with(b"data: [DONE]\n\n"));
    let log: Vec<serde_json::Value> = lines_of(&dir.join("access.jsonl"));
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0]["outcome"], "shutdown");
    assert_eq!(log[0]["error"], "shutdown");
}
