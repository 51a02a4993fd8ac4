//! Chaos soak, short form: a few seconds of mixed faults; nothing is lost, nothing leaks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../benches/soak/driver.rs"]
mod driver;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_faults_lose_nothing_and_leak_nothing() {
    let r = driver::run(4.0, 16).await;
    r.print();
    assert_eq!(
        r.logged, r.sent,
        "every request sent reached the access log exactly once"
    );
    let counted: u64 = r.outcomes.values().sum();
    assert_eq!(counted, r.sent);
    let ok = r.outcomes.get("ok").copied().unwrap_or(0);
    assert!(
        ok as f64 > 0.5 * r.sent as f64,
        "most requests succeed despite the faults: {r:?}"
    );
    for k in r.outcomes.keys() {
        assert!(
            ["ok", "truncated", "timeout", "backend_error", "rejected"].contains(&k.as_str()),
            "unexpected outcome {k}"
        );
    }
    // Connections opened for the load are closed again (slack: pooled upstream connections vary
    // with scheduling by a few).
    assert!(r.fds.1 <= r.fds.0 + 8, "file descriptors grew: {:?}", r.fds);
    // And once the gateway and simulators are gone, nothing of theirs stays open.
    assert!(
        r.fds_outside.1 <= r.fds_outside.0 + 2,
        "leaked file descriptors: {:?}",
        r.fds_outside
    );
}
