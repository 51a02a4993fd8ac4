//! Chaos soak, long form: `cargo bench --bench chaos_soak` (environment: `SOAK_SECONDS`, default 60;
//! `CONCURRENCY`, default 32). Prints the account recorded in docs/RELIABILITY.md.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

#[path = "soak/driver.rs"]
mod driver;

fn main() {
    let seconds = std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60.0);
    let concurrency = std::env::var("CONCURRENCY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let report = rt.block_on(driver::run(seconds, concurrency));
    report.print();
}
