//! The metering as a library: the `axum_embed` example (an axum app with one `MeterLayer`) serves
//! a stream over a real socket, and its `/metrics` and stats report what happened.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../examples/axum_embed.rs"]
mod axum_embed;
use crate::common;

use common::*;
use inferscope::stats::Stats;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_axum_app_gets_measurements_and_metrics_from_one_layer() {
    let stats = Arc::new(Stats::new(64));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum_embed::app(Arc::clone(&stats));
    tokio::spawn(async move { axum::serve(listener, app).await });

    let r = post(addr, "/v1/chat/completions", "{}", &[]).await;
    assert_eq!(r.status, 200);
    assert!(r.headers.contains_key("x-inferscope-request-id"));
    let body = String::from_utf8(r.body()).unwrap();
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    // The record is written when the body ends, just before the client has it all.
    until(Duration::from_secs(5), "the request's record", || {
        let stats = Arc::clone(&stats);
        async move {
            stats
                .snapshot()
                .groups
                .iter()
                .any(|(_, t, _)| t.requests == 1)
        }
    })
    .await;

    let snap = stats.snapshot();
    let (key, t, _) = snap
        .groups
        .iter()
        .find(|(k, _, _)| &*k.route == "chat")
        .unwrap();
    assert_eq!(&*key.model, "demo-model", "annotated by the handler");
    assert_eq!(t.requests, 1);
    assert_eq!(t.outcomes[0], 1, "ok: the stream ended with [DONE]");
    assert_eq!(t.output_tokens, 5, "five content events, counted");
    let [ttft, _, tpot, itl, e2e, ..] = &t.hists;
    assert_eq!((ttft.count(), tpot.count(), itl.count()), (1, 1, 4));
    let ttft_s = ttft.sum_seconds();
    assert!(
        ttft_s >= axum_embed::FIRST_TOKEN.as_secs_f64(),
        "TTFT {ttft_s} s covers the handler's wait before the first token"
    );
    assert!(e2e.sum_seconds() > ttft_s);
    let tpot_s = tpot.sum_seconds();
    assert!(
        tpot_s >= axum_embed::BETWEEN_TOKENS.as_secs_f64() * 0.9,
        "TPOT {tpot_s} s"
    );

    let (status, metrics) = admin_get(addr, "/metrics").await;
    assert_eq!(status, 200);
    let labels =
        r#"route="chat",model="demo-model",backend="-",variant="-",purpose="live",stream="true""#;
    assert!(
        metrics.contains(&format!(
            "inferscope_requests_total{{{labels},outcome=\"ok\"}} 1\n"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "inferscope_time_to_first_token_seconds_count{{{labels}}} 1\n"
        )),
        "{metrics}"
    );
}
