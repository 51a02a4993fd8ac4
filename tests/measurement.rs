//! The gateway measures what the simulator really did, forwards without buffering, and never
//! changes what the client receives (except removing the usage chunk it added itself).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use inferscope::sim::{ChunkKind, Profile, Truth};
use std::time::Duration;

/// Client-visible bytes when the gateway injected `include_usage`: the sim's bytes without the
/// usage-only chunk.
fn without_usage(t: &Truth) -> Vec<u8> {
    let mut out = Vec::new();
    for s in &t.sent {
        if s.kind != ChunkKind::Usage {
            out.extend_from_slice(&t.bytes[s.range.clone()]);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_chunk_reaches_the_client_before_the_next_is_sent() {
    let sim = start_sim(exact(30.0, 40.0), 1).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", sim.addr)], &dir, "").await;
    let body = chat(true, 6, r#","stream_options":{"include_usage":true}"#);
    let r = post(gw.data_addr, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(r.status, 200);
    let t = &sim.truth()[0];
    assert_eq!(
        r.body(),
        t.bytes,
        "the client asked for usage: the stream must be untouched"
    );
    let mut checked = 0;
    for pair in t.sent.windows(2) {
        if !matches!(pair[1].kind, ChunkKind::Content { .. }) {
            continue; // finish/usage/[DONE] follow the last token within microseconds
        }
        let received = r
            .time_of_byte(pair[0].range.end)
            .expect("chunk never arrived");
        assert!(
            received < pair[1].at,
            "chunk ending at byte {} reached the client {:?} after the simulator sent the next one",
            pair[0].range.end,
            received - pair[1].at
        );
        checked += 1;
    }
    assert_eq!(checked, 6, "role→token1 and five token→token gaps");
    stop_and_read_log(gw, &dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttft_ttfc_tpot_itl_e2e_match_ground_truth() {
    // Jitter makes every gap different, so a measurement that drifted would show.
    let profile = Profile {
        jitter: 0.3,
        ..exact(50.0, 15.0)
    };
    let sim = start_sim(profile, 7).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", sim.addr)], &dir, "").await;
    let r = post(
        gw.data_addr,
        "/v1/chat/completions",
        &chat(true, 30, ""),
        &[],
    )
    .await;
    assert_eq!(r.status, 200);
    let t = sim.truth().remove(0);
    assert_eq!(r.body(), without_usage(&t));

    let (_, stats) = admin_get(gw.admin_addr, "/stats").await;
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 1);
    let line = &log[0];
    assert_eq!(line["outcome"], "ok");
    assert_eq!(line["output_tokens"], 30);
    assert_eq!(line["tokens_source"], "usage");
    assert_eq!(line["input_tokens"], t.prompt_tokens);
    assert_eq!(line["finish_reason"], "length");

    // Causality bounds, no tolerance needed: the gateway's clock starts after the client sent and
    // before the simulator received; it stops after the simulator sent and before the client
    // received. The log rounds to 1 µs, hence the 1 µs slack.
    let us = Duration::from_micros(1);
    let first = |kind: fn(&ChunkKind) -> bool| t.sent.iter().find(|s| kind(&s.kind)).unwrap();
    let tok1 = first(|k| matches!(k, ChunkKind::Content { .. }));
    let role = first(|k| *k == ChunkKind::Role);
    let gw_ttft = ms(line, "ttft_ms");
    let client_ttft = r.time_of_byte(tok1.range.end).unwrap() - r.t_send;
    assert!(
        tok1.at - t.arrival <= gw_ttft + us,
        "gateway TTFT {gw_ttft:?} below truth {:?}",
        tok1.at - t.arrival
    );
    assert!(
        gw_ttft <= client_ttft + us,
        "gateway TTFT {gw_ttft:?} above what the client saw {client_ttft:?}"
    );
    let gw_ttfc = ms(line, "ttfc_ms");
    assert!(
        role.at - t.arrival <= gw_ttfc + us
            && gw_ttfc <= r.time_of_byte(role.range.end).unwrap() - r.t_send + us
    );
    assert!(
        gw_ttfc < gw_ttft,
        "the role-only chunk counts for TTFC, not TTFT"
    );
    // And close: on loopback the gateway adds well under a millisecond; 50 ms leaves room for a
    // shared CI machine descheduling a thread, while still catching a clock started or stopped
    // at the wrong place (that error would be a whole token gap or TTFT, ≥ 50 ms here).
    assert!(gw_ttft - (tok1.at - t.arrival) < Duration::from_millis(50));

    // TPOT averages 29 gaps: per-event delivery delays (sub-ms on loopback) cancel except at the
    // two ends, so 1 ms bounds it with a wide margin.
    let times = t.content_times();
    let truth_tpot = (times[times.len() - 1] - times[0]) / 29;
    let gw_tpot = ms(line, "tpot_ms");
    let diff = gw_tpot.abs_diff(truth_tpot);
    assert!(
        diff < Duration::from_millis(1),
        "TPOT {gw_tpot:?} vs truth {truth_tpot:?}"
    );

    // ITL: one sample per gap; its quantiles move by at most the largest per-gap error, which is
    // scheduling noise (sub-ms typically; the bounds allow a descheduled thread on a busy CI box).
    let mut gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    gaps.sort();
    let itl = &line["itl_ms"];
    assert_eq!(itl["count"], 29);
    let p50 = Duration::from_secs_f64(itl["p50"].as_f64().unwrap() / 1000.0);
    let max = Duration::from_secs_f64(itl["max"].as_f64().unwrap() / 1000.0);
    assert!(
        p50.abs_diff(gaps[14]) < Duration::from_millis(5),
        "ITL p50 {p50:?} vs {:?}",
        gaps[14]
    );
    assert!(
        max.abs_diff(gaps[28]) < Duration::from_millis(5),
        "ITL max {max:?} vs {:?}",
        gaps[28]
    );

    let last = t.sent.last().unwrap();
    assert!(ms(line, "e2e_ms") + us >= last.at - t.arrival);
    assert!(ms(line, "upstream_ttft_ms") <= gw_ttft);

    // /stats reports the same request from the same measurement (HdrHistogram: 3 digits).
    let g = &stats["groups"][0]["cumulative"];
    let p50_ttft = g["ttft"]["p50"].as_f64().unwrap();
    let logged = line["ttft_ms"].as_f64().unwrap();
    assert!(
        (p50_ttft - logged).abs() <= logged * 0.001 + 0.001,
        "{p50_ttft} vs {logged}"
    );
    assert_eq!(g["requests"], 1);
    assert_eq!(g["output_tokens"], 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_usage_is_invisible_and_exact() {
    let sim = start_sim(exact(5.0, 2.0), 3).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", sim.addr)], &dir, "").await;
    // Without usage asked: the gateway asks, counts from it, and removes the chunk.
    let plain = post(
        gw.data_addr,
        "/v1/chat/completions",
        &chat(true, 12, ""),
        &[],
    )
    .await;
    // With usage asked: untouched.
    let asked = chat(true, 12, r#","stream_options":{"include_usage":true}"#);
    let kept = post(gw.data_addr, "/v1/chat/completions", &asked, &[]).await;
    // Legacy completions get the same treatment.
    let comp = r#"{"model":"demo","prompt":"one two three","stream":true,"max_tokens":4}"#;
    let legacy = post(gw.data_addr, "/v1/completions", comp, &[]).await;
    let truth = sim.truth();
    assert!(String::from_utf8_lossy(&truth[0].request).contains(r#""include_usage":true"#));
    assert!(
        truth[0].sent.iter().any(|s| s.kind == ChunkKind::Usage),
        "the backend was asked for usage"
    );
    assert_eq!(
        plain.body(),
        without_usage(&truth[0]),
        "byte-for-byte, minus the injected chunk"
    );
    assert_eq!(kept.body(), truth[1].bytes);
    assert_eq!(legacy.body(), without_usage(&truth[2]));
    assert!(plain.headers.get("content-length").is_none());

    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 3);
    for (line, t) in log.iter().zip(&truth) {
        assert_eq!(line["outcome"], "ok", "{line}");
        assert_eq!(line["output_tokens"], t.output_tokens);
        assert_eq!(line["tokens_source"], "usage");
    }
    assert_eq!(log[0]["bytes_out"], plain.body().len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_token_chunks_count_tokens_from_usage() {
    let profile = Profile {
        tokens_per_chunk: 3,
        ..exact(5.0, 3.0)
    };
    let sim = start_sim(profile, 4).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", sim.addr)], &dir, "").await;
    let r = post(
        gw.data_addr,
        "/v1/chat/completions",
        &chat(true, 10, ""),
        &[],
    )
    .await;
    assert_eq!(r.status, 200);
    let log = stop_and_read_log(gw, &dir).await;
    // 10 tokens in chunks of 3,3,3,1: four output events, three gaps, ten tokens.
    assert_eq!(log[0]["output_tokens"], 10);
    assert_eq!(log[0]["itl_ms"]["count"], 3);
    let tpot = ms(&log[0], "tpot_ms");
    let span = sim.truth()[0].content_times();
    assert_eq!(span.len(), 4);
    let expect = (span[3] - span[0]) / 9;
    assert!(
        tpot.abs_diff(expect) < Duration::from_millis(1),
        "TPOT uses n_out − 1 = 9: {tpot:?} vs {expect:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streaming_records_e2e_and_usage_only() {
    let sim = start_sim(exact(10.0, 2.0), 5).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", sim.addr)], &dir, "").await;
    let r = post(
        gw.data_addr,
        "/v1/chat/completions",
        &chat(false, 8, ""),
        &[],
    )
    .await;
    assert_eq!(r.status, 200);
    let t = sim.truth().remove(0);
    assert_eq!(r.body(), t.bytes);
    let log = stop_and_read_log(gw, &dir).await;
    let l = &log[0];
    assert_eq!(l["stream"], false);
    assert_eq!(l["outcome"], "ok");
    assert_eq!(l["output_tokens"], 8);
    assert_eq!(l["input_tokens"], t.prompt_tokens);
    assert!(l["ttft_ms"].is_null() && l["tpot_ms"].is_null() && l["itl_ms"].is_null());
    assert!(ms(l, "e2e_ms") >= t.sent[0].at - t.arrival);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_errors_truncation_and_malformed_events_pass_through() {
    let err_body = br#"{"error":{"message":"out of KV cache"}}"#;
    let mut resp = format!("HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", err_body.len()).into_bytes();
    resp.extend_from_slice(err_body);
    let failing = start_raw(vec![resp], Duration::ZERO).await;

    let tok = |s: &str| {
        format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{s}\"}}}}]}}\n\n")
    };
    let events = [tok("a"), "data: {not json\n\n".to_string(), tok("b")];
    let mut pieces = vec![SSE_HEAD.to_vec()];
    pieces.extend(events.iter().map(|e| chunk(e.as_bytes())));
    pieces.push(b"0\r\n\r\n".to_vec()); // clean end of body, but no [DONE]
    let truncating = start_raw(pieces, Duration::from_millis(5)).await;

    let dir = temp_dir();
    let yaml = format!(
        "access_log: {{ path: {:?} }}\nbackends:\n  - {{ name: bad, url: \"http://{failing}\" }}\n  - {{ name: cut, url: \"http://{truncating}\" }}\nroutes:\n  - {{ name: a, match: {{ model: bad }}, backends: [bad] }}\n  - {{ name: b, backends: [cut] }}\n",
        dir.join("access.jsonl")
    );
    let gw = start_yaml(&yaml).await;
    let r500 = post(
        gw.data_addr,
        "/v1/chat/completions",
        r#"{"model":"bad","stream":true}"#,
        &[],
    )
    .await;
    assert_eq!(r500.status, 500);
    assert_eq!(
        r500.body(),
        err_body,
        "the backend's error body is passed through"
    );
    assert!(
        r500.headers.get("x-inferscope-error").is_none(),
        "not a gateway-made error"
    );
    let cut = post(
        gw.data_addr,
        "/v1/chat/completions",
        r#"{"model":"x","stream":true}"#,
        &[],
    )
    .await;
    assert_eq!(cut.status, 200);
    assert_eq!(
        cut.body(),
        events.concat().as_bytes(),
        "malformed event forwarded untouched"
    );

    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log[0]["outcome"], "backend_error");
    assert_eq!(log[0]["status"], 500);
    assert_eq!(log[1]["outcome"], "truncated");
    assert_eq!(log[1]["malformed_events"], 1);
    assert_eq!(log[1]["output_tokens"], 2);
    assert_eq!(log[1]["tokens_source"], "counted");
    assert_eq!(log[1]["itl_ms"]["count"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truth_comments_pass_through_and_bound_the_measurement() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut opts = inferscope::sim::SimOptions::new(exact(20.0, 5.0));
    opts.truth_comments = true;
    let sim = inferscope::sim::spawn(listener, opts, std::future::pending()).unwrap();
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", sim.addr)], &dir, "").await;
    let r = post(
        gw.data_addr,
        "/v1/chat/completions",
        &chat(true, 3, ""),
        &[],
    )
    .await;
    let body = String::from_utf8(r.body()).unwrap();
    // The comment before the first content event carries the simulator's true TTFT.
    let blocks: Vec<&str> = body.split("\n\n").collect();
    let first = blocks
        .iter()
        .find(|b| b.contains("\"content\":\" "))
        .unwrap();
    let t_us: u64 = first
        .lines()
        .next()
        .unwrap()
        .strip_prefix(": t_us=")
        .unwrap()
        .parse()
        .unwrap();
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(
        log[0]["outcome"], "ok",
        "comments are not events: nothing malformed"
    );
    assert_eq!(log[0]["malformed_events"], 0);
    assert_eq!(log[0]["output_tokens"], 3);
    assert!(ms(&log[0], "ttft_ms") + Duration::from_micros(1) >= Duration::from_micros(t_us));
}

/// hyper's HTTP/1.1 server with a response body that waits between frames, as a relayed stream
/// does: no wake-up is lost (every frame arrives, the stream ends), and the body is polled at
/// most three times a frame — the one that finds it ready, the one that waits for the next, and
/// the one hyper's dispatcher makes after every flush (a change to drop that one was measured,
/// −2.5% CPU per 64-chunk stream, and not kept: docs/patches/hyper/README.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paced_body_loses_no_wake_up_and_is_polled_at_most_three_times_a_frame() {
    use bytes::Bytes;
    use hyper::body::{Body, Frame};
    use std::convert::Infallible;
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const FRAMES: usize = 40;
    const FRAME: &[u8] = b"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n";

    struct Paced {
        left: usize,
        sleep: Pin<Box<tokio::time::Sleep>>,
        polls: Arc<AtomicUsize>,
    }

    impl Body for Paced {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            self.polls.fetch_add(1, Ordering::Relaxed);
            if self.left == 0 {
                return Poll::Ready(None);
            }
            std::task::ready!(self.sleep.as_mut().poll(cx));
            self.left -= 1;
            let next = tokio::time::Instant::now() + Duration::from_millis(2);
            self.sleep.as_mut().reset(next);
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(FRAME)))))
        }
    }

    let polls = Arc::new(AtomicUsize::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counted = Arc::clone(&polls);
    let server = tokio::spawn(async move {
        let (io, _) = listener.accept().await.unwrap();
        let service = hyper::service::service_fn(move |_req| {
            let body = Paced {
                left: FRAMES,
                sleep: Box::pin(tokio::time::sleep(Duration::from_millis(2))),
                polls: Arc::clone(&counted),
            };
            async move { Ok::<_, Infallible>(hyper::Response::new(body)) }
        });
        hyper::server::conn::http1::Builder::new()
            .serve_connection(hyper_util::rt::TokioIo::new(io), service)
            .await
            .unwrap();
    });

    let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
    client
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut got))
        .await
        .expect("a lost wake-up stalls the stream")
        .unwrap();
    server.await.unwrap();

    let text = String::from_utf8(got).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.ends_with("0\r\n\r\n"), "{text}");
    let frames = text.matches(std::str::from_utf8(FRAME).unwrap()).count();
    assert_eq!(frames, FRAMES);
    // Each frame: the poll that finds it ready, the one that waits for the next, the one after
    // the flush (plus the first wait and the end).
    let polls = polls.load(Ordering::Relaxed);
    assert!(
        (2 * FRAMES..=3 * FRAMES + 3).contains(&polls),
        "{polls} polls for {FRAMES} frames"
    );
}
