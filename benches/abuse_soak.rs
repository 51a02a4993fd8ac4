//! Abuse soak, long form: `cargo bench --bench abuse_soak` (environment: `ABUSE_SECONDS`, default
//! 60; `QUIET_SECONDS`, default 20; `NORMAL_CLIENTS`, default 8; `SILENT_CONNECTIONS`, default
//! 300). Prints the account recorded in docs/RELIABILITY.md.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

#[path = "abuse/driver.rs"]
mod driver;

fn env<T: std::str::FromStr>(k: &str, d: T) -> T {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let report = rt.block_on(driver::run(
        env("QUIET_SECONDS", 20.0),
        env("ABUSE_SECONDS", 60.0),
        env("NORMAL_CLIENTS", 8),
        env("SILENT_CONNECTIONS", 300),
    ));
    report.print();
}
