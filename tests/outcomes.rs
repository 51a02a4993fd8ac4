//! Outcomes as the client experienced them: a response the client received whole is `ok` even
//! when the client closes before reading the body's last framing bytes; an empty-bodied backend
//! error is a backend failure. (A client leaving mid-stream stays `client_cancelled`:
//! tests/lifecycle.rs.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends `body` to `path` over a raw HTTP/1.1 connection, reads until `marker` appears in what
/// arrived, and closes the connection at once without reading further (as Python clients do after
/// `data: [DONE]`). Returns what arrived.
async fn read_until_then_close(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    marker: &[u8],
) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: inferscope.test\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(marker.len()).any(|w| w == marker) {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("the marker never arrived")
            .unwrap();
        assert!(n > 0, "connection closed before the marker");
        got.extend_from_slice(&buf[..n]);
    }
    drop(s);
    got
}

fn event(json: &str) -> String {
    format!("data: {json}\n\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_closing_after_done_before_the_terminator_is_ok() {
    let events = [
        event(r#"{"id":"c1","choices":[{"index":0,"delta":{"role":"assistant"}}]}"#),
        event(r#"{"id":"c1","choices":[{"index":0,"delta":{"content":"a"}}]}"#),
        event(r#"{"id":"c1","choices":[{"index":0,"delta":{"content":"b"}}]}"#),
        event(r#"{"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#),
        "data: [DONE]\n\n".to_string(),
    ];
    let mut first = SSE_HEAD.to_vec();
    for e in &events {
        first.extend(chunk(e.as_bytes()));
    }
    // Everything up to `[DONE]` at once; the chunked terminator 50 ms later, as uvicorn-based
    // servers can send it.
    let backend = start_raw(
        vec![first, b"0\r\n\r\n".to_vec()],
        Duration::from_millis(50),
    )
    .await;
    let dir = temp_dir();
    let gw = start_gateway(&[("raw", backend)], &dir, "").await;
    let asked = chat(true, 2, r#","stream_options":{"include_usage":true}"#);
    let plain = chat(true, 2, "");
    for body in [&asked, &plain] {
        let got = read_until_then_close(
            gw.data_addr,
            "POST",
            "/v1/chat/completions",
            body,
            b"data: [DONE]\n\n",
        )
        .await;
        assert!(got.starts_with(b"HTTP/1.1 200"));
    }
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 2);
    let total: usize = events.iter().map(String::len).sum();
    for line in &log {
        assert_eq!(line["outcome"], "ok", "{line}");
        assert_eq!(line["error"], serde_json::Value::Null, "{line}");
        assert_eq!(line["status"], 200);
        assert_eq!(line["finish_reason"], "stop");
        assert_eq!(line["output_tokens"], 2);
        assert_eq!(
            line["bytes_out"], total,
            "every event was handed on: {line}"
        );
        // E2E ends when the client had it all, not when the terminator came (50 ms later).
        assert!(ms(line, "e2e_ms") < Duration::from_millis(45), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_and_tiny_bodies_are_ok_once_handed_on() {
    let sim = start_sim(exact(1.0, 1.0), 1).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", sim.addr)], &dir, "").await;
    // vLLM answers `/health` with `content-length: 0`.
    let mut c = Client::connect(gw.data_addr).await;
    let health = c.send("GET", "/health", "", &[]).await;
    assert_eq!(health.status, 200);
    assert_eq!(health.headers["content-length"], "0");
    let models = c.send("GET", "/v1/models", "", &[]).await;
    assert_eq!(models.status, 200);
    // A client that closes as soon as it has the head of an empty response.
    let got = read_until_then_close(gw.data_addr, "GET", "/health", "", b"\r\n\r\n").await;
    assert!(got.starts_with(b"HTTP/1.1 200"));
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 3);
    for line in &log {
        assert_eq!(line["outcome"], "ok", "{line}");
    }
    assert_eq!(log[0]["bytes_out"], 0);
    assert_eq!(log[1]["bytes_out"], models.body().len());
    assert_eq!(log[2]["bytes_out"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_answering_empty_500s_is_ejected() {
    let failing = start_raw(
        vec![b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n".to_vec()],
        Duration::ZERO,
    )
    .await;
    let good = start_sim(exact(1.0, 1.0), 2).await;
    let dir = temp_dir();
    let yaml = format!(
        "access_log: {{ path: {:?} }}\nbackends:\n  - {{ name: bad, url: \"http://{failing}\", outlier: {{ consecutive_failures: 2, base_ejection: 60s }} }}\n  - {{ name: good, url: \"http://{}\" }}\nroutes:\n  - name: main\n    backends: [bad, good]\n    retry: {{ attempts: 0 }}\n",
        dir.join("access.jsonl"),
        good.addr
    );
    let gw = start_yaml(&yaml).await;
    let mut statuses = Vec::new();
    for _ in 0..8 {
        let r = post(
            gw.data_addr,
            "/v1/chat/completions",
            &chat(true, 2, ""),
            &[],
        )
        .await;
        statuses.push(r.status);
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 500).count(),
        2,
        "two empty 500s reach the client, then the backend is ejected: {statuses:?}"
    );
    let bad = backend_stats(gw.admin_addr, "bad").await;
    assert_eq!(bad["ejected"], true, "{bad}");
    let log = stop_and_read_log(gw, &dir).await;
    let failed: Vec<_> = log.iter().filter(|l| l["status"] == 500).collect();
    assert_eq!(failed.len(), 2);
    for l in failed {
        assert_eq!(l["outcome"], "backend_error", "{l}");
        assert_eq!(l["bytes_out"], 0);
    }
}

/// A backend that sends `head` and one chunk of a body, then closes the connection mid-body.
async fn cut_off(content_type: &str, piece: &str) -> std::net::SocketAddr {
    let mut resp = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    resp.extend(chunk(piece.as_bytes()));
    start_raw(vec![resp], Duration::ZERO).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_cut_off_upstream_is_aborted_not_ended() {
    // A non-streamed JSON answer (embeddings) broken mid-body: the client must not get a
    // complete-looking 200.
    let json = cut_off("application/json", r#"{"data":[{"embedding":[0.12,"#).await;
    let sse = cut_off(
        "text/event-stream",
        "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
    )
    .await;
    let dir = temp_dir();
    let yaml = format!(
        "access_log: {{ path: {:?} }}\nbackends:\n  - {{ name: json, url: \"http://{json}\" }}\n  - {{ name: sse, url: \"http://{sse}\" }}\nroutes:\n  - {{ name: e, match: {{ path_prefix: /v1/embeddings }}, backends: [json] }}\n  - {{ name: c, backends: [sse] }}\n",
        dir.join("access.jsonl")
    );
    let gw = start_yaml(&yaml).await;
    let r = post(gw.data_addr, "/v1/embeddings", r#"{"input":"x"}"#, &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body(), br#"{"data":[{"embedding":[0.12,"#);
    assert!(r.aborted, "HTTP/1: closed without the terminating chunk");

    // Over h2c the stream is reset: the client's body read fails.
    let mut send = h2_connect(gw.data_addr).await;
    let req = http::Request::post(format!("http://{}/v1/chat/completions", gw.data_addr))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(chat(
            true, 5, "",
        ))))
        .unwrap();
    // Reset after the head and what arrived, or — when the reset overtakes the queued head —
    // before it: either way the client's read fails.
    let failed = match send.send_request(req).await {
        Ok(resp) => http_body_util::BodyExt::collect(resp.into_body())
            .await
            .is_err(),
        Err(e) => e.to_string().contains("stream error") || format!("{e:?}").contains("Reset"),
    };
    assert!(failed, "h2: the stream is reset, not ended");

    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 2);
    for line in &log {
        assert_eq!(line["outcome"], "truncated", "{line}");
        assert_eq!(line["error"], "upstream_body_error", "{line}");
    }
}
