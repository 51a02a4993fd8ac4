//! Abuse soak, short form (the long one is `cargo bench --bench abuse_soak`): hostile clients,
//! a faulty backend and normal traffic at once, and on the admin side span bombs, forged spans,
//! state files swapped for a FIFO and a directory, and trickled heads. Normal traffic still
//! completes, every hostile request gets its refusal, every probe is answered, and requests in =
//! access-log lines out. (Latency under abuse is a benchmark number, docs/RELIABILITY.md, not
//! asserted here.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../benches/abuse/driver.rs"]
mod driver;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_do_not_stop_normal_traffic_and_every_request_is_logged() {
    let r = driver::run(1.5, 6.0, 4, 100).await;
    r.print();
    assert!(r.quiet.ok > 0 && r.abused.ok > 0);
    assert_eq!(r.abused.failed, 0, "normal requests failed under abuse");
    for status in [
        "HTTP/1.1 431",
        "HTTP/1.1 400",
        "HTTP/1.1 408",
        "HTTP/1.1 200",
    ] {
        assert!(
            r.hostile_status.contains_key(status),
            "no {status}: {:?}",
            r.hostile_status
        );
    }
    assert!(
        r.hostile["silent_connection"] > 100,
        "silent ones were never closed"
    );
    assert_eq!(r.requests, r.logged, "requests in != log lines out");
    assert!(
        r.probes.ok > 0 && r.probes.failed == 0,
        "{:?}",
        r.probes.failed
    );
    let count = |k: &str| r.admin_counts.get(k).copied().unwrap_or(0.0);
    assert!(count("inferscope_otlp_exports_total{outcome=\"accepted\"}") > 0.0);
    assert!(count("inferscope_engine_span_values_out_of_range_total") > 0.0);
    assert!(count("inferscope_admin_connections_evicted_total") > 0.0);
    assert!(
        count("inferscope_state_writes_total{file=\"rollbacks.jsonl\",outcome=\"failed\"}") > 0.0,
        "{:?}",
        r.admin_counts
    );
}
