//! Hostile clients: what one client controls cannot shut others out, and every request the
//! gateway refuses is still one access-log line. Connection-level limits (silent and trickling
//! connections, max connections, oversize and malformed heads), body-level ones (slow bodies,
//! the buffered-body budget, nesting depth) and label-level ones (model names).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Waits until the peer closes `s` (read returns 0 or an error); returns how long it took, or
/// `None` when it stayed open for `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> Option<Duration> {
    let t = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout_at(t + within, s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => return Some(t.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

const FAST_CLOSE: &str = "limits:\n  client_idle_timeout: 300ms\n  header_read_timeout: 300ms\n";

async fn gateway(
    extra: &str,
) -> (
    inferscope::sim::SimHandle,
    inferscope::app::Running,
    std::path::PathBuf,
) {
    let sim = start_sim(exact(5.0, 1.0), 1).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", sim.addr)], &dir, extra).await;
    (sim, gw, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_send_nothing_are_closed() {
    let (_sim, gw, dir) = gateway(FAST_CLOSE).await;
    // HTTP/1 (or anything): not a byte.
    let mut silent = TcpStream::connect(gw.data_addr).await.unwrap();
    // h2c: the preface and an empty SETTINGS frame, then nothing.
    let mut h2 = TcpStream::connect(gw.data_addr).await.unwrap();
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    // A preface trickled a byte at a time keeps the version sniff waiting: still closed.
    let mut trickle = TcpStream::connect(gw.data_addr).await.unwrap();
    let tricker = tokio::spawn(async move {
        for b in b"PRI * HTTP/2.0\r\n" {
            if trickle.write_all(&[*b]).await.is_err() {
                return Some(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        closed_within(&mut trickle, Duration::from_secs(3))
            .await
            .map(|_| ())
    });
    assert!(
        closed_within(&mut silent, Duration::from_secs(5))
            .await
            .is_some(),
        "silent connection stayed open"
    );
    // The h2 connection is closed the h2 way: a GOAWAY frame before the end.
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), h2.read_to_end(&mut got))
        .await
        .expect("h2c connection stayed open")
        .unwrap();
    let mut frames = Vec::new();
    let mut at = 0;
    while at + 9 <= got.len() {
        let len =
            usize::from(got[at]) << 16 | usize::from(got[at + 1]) << 8 | usize::from(got[at + 2]);
        frames.push(got[at + 3]);
        at += 9 + len;
    }
    assert!(
        frames.contains(&0x7),
        "no GOAWAY among frame types {frames:?}"
    );
    assert!(
        tricker.await.unwrap().is_some(),
        "trickled preface stayed open"
    );
    let (_, metrics) = admin_get(gw.admin_addr, "/metrics").await;
    let closed = metric(&metrics, "inferscope_client_connections_idle_closed_total");
    assert_eq!(closed, 2.0, "{metrics}");
    // Silence and a bare h2 connection are not requests; the trickled bytes began one that
    // never completed: one line, 408.
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0]["status"], 408);
    assert_eq!(log[0]["error"], "header_read_timeout");
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_closes_but_a_slow_answer_does_not() {
    // The simulator takes 1.5 s to its first token: five idle timeouts with no byte either way.
    let sim = start_sim(exact(1500.0, 1.0), 1).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", sim.addr)], &dir, FAST_CLOSE).await;
    let mut s = TcpStream::connect(gw.data_addr).await.unwrap();
    let body = chat(true, 3, "");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(b"0\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("response stalled")
            .unwrap();
        assert!(
            n > 0,
            "closed during the request: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&got).contains("[DONE]"));
    // Now idle between requests: closed.
    assert!(closed_within(&mut s, Duration::from_secs(5))
        .await
        .is_some());
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 1);
    assert_eq!(log[0]["outcome"], "ok");
    assert!(log[0]["client"].as_str().unwrap().starts_with("127.0.0.1:"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_max_connections_new_ones_wait_and_admin_stays_up() {
    let (_sim, gw, dir) = gateway("limits:\n  max_connections: 3\n").await;
    let mut hogs = Vec::new();
    for _ in 0..3 {
        hogs.push(TcpStream::connect(gw.data_addr).await.unwrap());
    }
    until(
        Duration::from_secs(5),
        "the gateway accepted all three",
        || async {
            let (_, m) = admin_get(gw.admin_addr, "/metrics").await;
            metric(&m, "inferscope_client_connections") == 3.0
        },
    )
    .await;
    let addr = gw.data_addr;
    let waiting =
        tokio::spawn(
            async move { post(addr, "/v1/chat/completions", &chat(false, 2, ""), &[]).await },
        );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "a fourth connection was served");
    let (status, _) = admin_get(gw.admin_addr, "/healthz").await;
    assert_eq!(status, 200);
    let (_, metrics) = admin_get(gw.admin_addr, "/metrics").await;
    assert_eq!(metric(&metrics, "inferscope_client_connections"), 3.0);
    assert!(metric(&metrics, "inferscope_client_connections_at_capacity_total") >= 1.0);
    drop(hogs.pop());
    let r = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("still waiting after a slot freed")
        .unwrap();
    assert_eq!(r.status, 200);
    drop(hogs);
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_connections_at_capacity_waits_in_the_backlog_not_dropped() {
    // At `max_connections` the kernel's backlog holds new connections. Tokio's and std's `bind`
    // ask for a backlog of 128: the 130th connection's SYN was dropped and its client waited a
    // second to retry. The gateway's listener asks for `limits.listen_backlog` (4,096).
    const BURST: usize = 200;
    assert_eq!(
        inferscope::config::Limits::default().listen_backlog,
        inferscope::server::DEFAULT_BACKLOG
    );
    // A kernel cap below the burst would make the test prove nothing: a failure, not a pass.
    let cap = inferscope::server::somaxconn();
    assert!(
        cap.is_some_and(|c| c as usize > BURST),
        "net.core.somaxconn is {cap:?}: the kernel caps any backlog there (sysctl -w net.core.somaxconn=4096)"
    );
    let (_sim, gw, dir) = gateway("limits:\n  max_connections: 1\n").await;
    let hog = TcpStream::connect(gw.data_addr).await.unwrap();
    until(
        Duration::from_secs(5),
        "the gateway accepted the hog",
        || async {
            let (_, m) = admin_get(gw.admin_addr, "/metrics").await;
            metric(&m, "inferscope_client_connections") == 1.0
        },
    )
    .await;
    let addr = gw.data_addr;
    let burst: Vec<_> = (0..BURST)
        .map(|_| {
            tokio::spawn(async move {
                tokio::time::timeout(Duration::from_millis(2500), TcpStream::connect(addr)).await
            })
        })
        .collect();
    let mut held = Vec::new();
    for t in burst {
        if let Ok(Ok(s)) = t.await.unwrap() {
            held.push(s);
        }
    }
    assert_eq!(held.len(), BURST, "connections the backlog did not hold");
    let (_, metrics) = admin_get(gw.admin_addr, "/metrics").await;
    assert_eq!(metric(&metrics, "inferscope_client_connections"), 1.0);
    drop((hog, held));
    let log = stop_and_read_log(gw, &dir).await;
    assert!(log.is_empty(), "{log:?}");
}

/// Sends raw bytes on a new connection and returns everything until the peer closes.
async fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got)).await;
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_the_http_layer_refuses_are_logged() {
    let (_sim, gw, dir) =
        gateway("limits:\n  max_header_count: 20\n  header_read_timeout: 300ms\n").await;
    // 431: more header fields than allowed.
    let mut many = String::from("GET /v1/models HTTP/1.1\r\nhost: x\r\n");
    for i in 0..40 {
        many.push_str(&format!("x-h{i}: v\r\n"));
    }
    many.push_str("\r\n");
    let r = raw_exchange(gw.data_addr, many.as_bytes()).await;
    assert!(r.starts_with("HTTP/1.1 431"), "{r}");
    // 400: conflicting lengths, a smuggling attempt.
    let smuggle = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ncontent-length: 7\r\n\r\nhello";
    let r = raw_exchange(gw.data_addr, smuggle).await;
    assert!(r.starts_with("HTTP/1.1 400"), "{r}");
    // 408: half a head, then nothing.
    let r = raw_exchange(gw.data_addr, b"POST /v1/chat/completions HTTP/1.1\r\nhost:").await;
    assert!(!r.contains("200 OK"), "{r}");
    let log = stop_and_read_log(gw, &dir).await;
    let mut seen: Vec<(u64, String)> = log
        .iter()
        .map(|l| {
            (
                l["status"].as_u64().unwrap(),
                l["error"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            (400, "bad_request_head".to_owned()),
            (408, "header_read_timeout".to_owned()),
            (431, "request_head_too_large".to_owned()),
        ]
    );
    for l in &log {
        assert_eq!(l["outcome"], "rejected");
        assert_eq!(l["method"], "-");
        assert_eq!(l["path"], "-");
        assert!(l["client"].as_str().unwrap().starts_with("127.0.0.1:"));
        assert!(!l["request_id"].as_str().unwrap().is_empty());
    }
}

/// Opens a connection and sends a chat request head declaring `len` body bytes, then `first`.
async fn start_body(addr: SocketAddr, len: usize, first: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(first).await.unwrap();
    s
}

/// Reads a response head's status line from `s` (waiting up to `within`).
async fn status_of(s: &mut TcpStream, within: Duration) -> Option<String> {
    status_line(s, within).await
}

async fn status_line<R: tokio::io::AsyncRead + Unpin>(
    s: &mut R,
    within: Duration,
) -> Option<String> {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let t = Instant::now();
    while !got.windows(2).any(|w| w == b"\r\n") {
        match tokio::time::timeout_at(t + within, s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => return None,
        }
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    text.lines().next().map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_silent_bodies_cannot_hold_every_slot() {
    let (_sim, gw, dir) = gateway(
        "limits:\n  max_concurrent_requests: 4\n  body_read_timeout: 500ms\n  body_min_bytes_per_sec: 100\n",
    )
    .await;
    let addr = gw.data_addr;
    // Two heads whose bodies never come, two bodies trickled a byte every 200 ms (5 B/s, under
    // the 100 B/s minimum once the 5 s grace is over).
    let mut hogs = Vec::new();
    for _ in 0..2 {
        hogs.push(tokio::spawn(async move {
            let mut s = start_body(addr, 1000, b"").await;
            status_of(&mut s, Duration::from_secs(10)).await
        }));
        hogs.push(tokio::spawn(async move {
            let s = start_body(addr, 1000, b"{").await;
            let (mut rd, mut wr) = s.into_split();
            let trickle = tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    if wr.write_all(b" ").await.is_err() {
                        break;
                    }
                }
            });
            let status = status_line(&mut rd, Duration::from_secs(10)).await;
            trickle.abort();
            status
        }));
    }
    let admin = gw.admin_addr;
    common::until(
        Duration::from_secs(5),
        "the four hogs admitted",
        || async move { common::metric(admin, "inferscope_in_flight_requests").await >= 4.0 },
    )
    .await;
    let r = post(addr, "/v1/chat/completions", &chat(false, 2, ""), &[]).await;
    assert_eq!(
        r.status, 503,
        "the slots were not held (the test proves nothing)"
    );
    for h in hogs {
        let status = tokio::time::timeout(Duration::from_secs(10), h)
            .await
            .expect("a slow body held its slot")
            .unwrap();
        assert_eq!(status.as_deref(), Some("HTTP/1.1 408 Request Timeout"));
    }
    let r = post(addr, "/v1/chat/completions", &chat(false, 2, ""), &[]).await;
    assert_eq!(r.status, 200);
    let log = stop_and_read_log(gw, &dir).await;
    let timeouts = log.iter().filter(|l| l["error"] == "body_timeout").count();
    assert_eq!(timeouts, 4, "{log:?}");
    assert_eq!(log.len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_past_the_global_budget_get_503_with_retry_after() {
    let (_sim, gw, dir) = gateway("limits:\n  max_buffered_body_bytes: 1000\n").await;
    let addr = gw.data_addr;
    let body = chat(false, 2, "");
    // Sends 900 of its 1000 body bytes (the chat body padded with spaces: still valid JSON) and
    // holds them while the rest does not come. The budget counts bytes held, not lengths
    // declared.
    let sent = format!("{body}{}", " ".repeat(900 - body.len()));
    let mut holder = start_body(addr, 1000, sent.as_bytes()).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = post(addr, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.headers["x-inferscope-error"], "body_budget");
    assert_eq!(r.headers["retry-after"], "1");
    // The holder's body completes, and its bytes are given back once its response ends.
    holder.write_all(" ".repeat(100).as_bytes()).await.unwrap();
    assert_eq!(
        status_of(&mut holder, Duration::from_secs(5))
            .await
            .as_deref(),
        Some("HTTP/1.1 200 OK")
    );
    drop(holder);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = post(addr, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(r.status, 200);
    // A head that only declares a large body holds nothing.
    let _head_only = start_body(addr, 1000, b"").await;
    let admin = gw.admin_addr;
    common::until(Duration::from_secs(5), "the head admitted", || async move {
        common::metric(admin, "inferscope_in_flight_requests").await >= 1.0
    })
    .await;
    let r = post(addr, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(r.status, 200);
    // It hangs up without its body: the client's cancellation, not a bad request.
    drop(_head_only);
    let log = stop_and_read_log(gw, &dir).await;
    let errors: Vec<&str> = log.iter().filter_map(|l| l["error"].as_str()).collect();
    assert_eq!(errors, ["body_budget", "client_disconnected"]);
    let last = log.last().unwrap();
    assert_eq!(
        (last["status"].as_u64(), last["outcome"].as_str()),
        (Some(499), Some("client_cancelled"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_nested_too_deep_is_a_400_not_the_fallback_route() {
    let (_sim, gw, dir) = gateway("").await;
    let n = 200;
    let body = format!(
        r#"{{"model":"demo","messages":[],"x":{}{}}}"#,
        "[".repeat(n),
        "]".repeat(n)
    );
    let r = post(gw.data_addr, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.headers["x-inferscope-error"], "json_too_deep");
    let msg: serde_json::Value = serde_json::from_slice(&r.body()).unwrap();
    assert!(msg["error"]["message"].as_str().unwrap().contains("128"));
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log[0]["backend"], "-", "it was forwarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_and_hostile_model_names_are_bounded_labels() {
    let (_sim, gw, dir) = gateway("").await;
    let huge = "m".repeat(2 << 20);
    for i in 0..3 {
        let body = format!(r#"{{"model":"{huge}{i}","messages":[],"max_tokens":2}}"#);
        let r = post(gw.data_addr, "/v1/chat/completions", &body, &[]).await;
        assert_eq!(r.status, 200);
    }
    // Controls, and a right-to-left override that would show `demo-4tpg` as `demo-gpt4`.
    let evil = r#"{"model":"a\n{\"fake\":1}\u001b[2J","messages":[],"max_tokens":2}"#;
    let bidi = r#"{"model":"demo-\u202e4tpg\u2066","messages":[],"max_tokens":2}"#;
    for body in [evil, bidi] {
        assert_eq!(
            post(gw.data_addr, "/v1/chat/completions", body, &[])
                .await
                .status,
            200
        );
    }
    let (_, stats) = admin_get(gw.admin_addr, "/stats").await;
    assert!(stats.len() < 256 << 10, "/stats is {} bytes", stats.len());
    let (_, metrics) = admin_get(gw.admin_addr, "/metrics").await;
    assert!(
        metrics.len() < 512 << 10,
        "/metrics is {} bytes",
        metrics.len()
    );
    assert!(!metrics.contains('\u{1b}'));
    assert!(!metrics.contains('\u{202e}') && !stats.contains('\u{202e}'));
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 5);
    let model = log[0]["model"].as_str().unwrap();
    assert_eq!(model.len(), 256 + '…'.len_utf8());
    assert!(model.ends_with('…'));
    assert_eq!(log[3]["model"], "a?{\"fake\":1}?[2J");
    assert_eq!(log[4]["model"], "demo-?4tpg?");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_sse_line_is_forwarded_not_held_while_usage_is_stripped() {
    // The backend starts an event and never ends its line: 24 pieces of 16 KiB, 40 ms apart.
    let mut pieces = vec![SSE_HEAD.to_vec(), chunk(b"data: {\"id\":\"c1\",\"x\":\"")];
    for _ in 0..24 {
        pieces.push(chunk(&[b'x'; 16 << 10]));
    }
    pieces.push(b"0\r\n\r\n".to_vec());
    let backend = start_raw(pieces, Duration::from_millis(40)).await;
    let dir = temp_dir();
    let gw = start_gateway(
        &[("raw", backend)],
        &dir,
        "limits:\n  max_event_bytes: 65536\n",
    )
    .await;
    // No include_usage: the gateway asks for it and strips the usage chunk, so it holds
    // incomplete events — but never more than max_event_bytes of one.
    let r = post(
        gw.data_addr,
        "/v1/chat/completions",
        &chat(true, 2, ""),
        &[],
    )
    .await;
    let total: usize = r.frames.iter().map(|f| f.1.len()).sum();
    assert!(total > 24 * (16 << 10), "{total}");
    let end = r.frames.last().unwrap().0;
    let early = r.time_of_byte(8 * (16 << 10)).unwrap();
    assert!(
        end.duration_since(early) > Duration::from_millis(400),
        "the line was held back: byte 128 KiB arrived {:?} before the end",
        end.duration_since(early)
    );
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_very_long_stream_keeps_a_bounded_gap_list_and_every_gap_counted() {
    let sim = start_sim(exact(1.0, 0.02), 1).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", sim.addr)], &dir, "").await;
    let r = post(
        gw.data_addr,
        "/v1/chat/completions",
        &chat(true, 6000, ""),
        &[],
    )
    .await;
    assert_eq!(r.status, 200);
    let (_, stats) = admin_get(gw.admin_addr, "/stats").await;
    let log = stop_and_read_log(gw, &dir).await;
    let gaps = log[0]["output_tokens"].as_u64().unwrap() - 1;
    assert!(gaps > inferscope::meter::MAX_ITL_SAMPLES as u64, "{gaps}");
    assert_eq!(log[0]["itl_ms"]["count"].as_u64(), Some(gaps));
    assert_eq!(
        log[0]["itl_us"].as_array().unwrap().len(),
        inferscope::meter::MAX_ITL_SAMPLES
    );
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    let counted = stats["groups"][0]["cumulative"]["itl"]["count"].as_u64();
    assert_eq!(counted, Some(gaps), "{stats}");
}

/// A backend that keeps every request head it receives (lower-cased) and answers each with what
/// `answer` makes of it, then closes.
async fn answering_backend(
    answer: impl Fn(&str) -> Vec<u8> + Send + Sync + 'static,
) -> (SocketAddr, std::sync::Arc<parking_lot::Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let heads = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let seen = std::sync::Arc::clone(&heads);
    let answer = std::sync::Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (seen, answer) = (std::sync::Arc::clone(&seen), std::sync::Arc::clone(&answer));
            tokio::spawn(async move {
                let head = read_request(&mut s).await;
                if head.is_empty() {
                    return;
                }
                let resp = answer(&head);
                seen.lock().push(head);
                let _ = s.write_all(&resp).await;
                let _ = s.shutdown().await;
            });
        }
    });
    (addr, heads)
}

/// A backend that keeps every request head it receives and answers a small chat completion.
async fn recording_backend() -> (SocketAddr, std::sync::Arc<parking_lot::Mutex<Vec<String>>>) {
    answering_backend(|_| {
        let body = r#"{"id":"x","object":"chat.completion","model":"demo","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_cannot_send_the_gateways_own_headers_upstream_and_are_named_in_forwarded() {
    let (backend, heads) = recording_backend().await;
    let dir = temp_dir();
    let gw = start_gateway(&[("rec", backend)], &dir, "").await;
    let r = post(
        gw.data_addr,
        "/v1/chat/completions",
        &chat(false, 2, ""),
        &[
            ("x-inferscope-shadow", "1"),
            ("x-inferscope-request-id", "forged"),
            ("x-inferscope-variant", "int8"),
            ("x-forwarded-for", "203.0.113.7"),
        ],
    )
    .await;
    assert_eq!(r.status, 200);
    let head = heads.lock()[0].clone();
    assert!(!head.contains("x-inferscope-"), "{head}");
    assert!(
        head.contains("\r\nx-forwarded-for: 203.0.113.7, 127.0.0.1"),
        "{head}"
    );
    assert!(
        head.contains("\r\nforwarded: for=127.0.0.1;proto=http"),
        "{head}"
    );
    let log = stop_and_read_log(gw, &dir).await;
    assert_ne!(log[0]["request_id"], "forged");
    assert!(log[0].get("shadow").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_streamed_through_to_the_backend_is_a_408() {
    // A backend that reads the whole body before it answers.
    let backend = start_raw(
        vec![b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec()],
        Duration::ZERO,
    )
    .await;
    let dir = temp_dir();
    let gw = start_gateway(
        &[("raw", backend)],
        &dir,
        "limits:\n  body_read_timeout: 500ms\n",
    )
    .await;
    // Not an inference endpoint: the body is streamed through, not read first.
    let mut s = TcpStream::connect(gw.data_addr).await.unwrap();
    s.write_all(b"POST /v1/files HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n0123456789")
        .await
        .unwrap();
    let t = Instant::now();
    let status = status_of(&mut s, Duration::from_secs(10)).await;
    assert_eq!(status.as_deref(), Some("HTTP/1.1 408 Request Timeout"));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    drop(s);
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 1);
    assert_eq!(log[0]["error"], "body_timeout");
    assert_eq!(log[0]["backend"], "raw", "it was streamed to the backend");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_h2_connection_gets_at_most_h2_max_streams_at_once() {
    use http_body_util::{BodyExt, Full};
    let sim = start_sim(exact(300.0, 1.0), 1).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", sim.addr)], &dir, "limits:\n  h2_max_streams: 4\n").await;
    let send = h2_connect(gw.data_addr).await;
    let addr = gw.data_addr;
    let mut reqs = Vec::new();
    for _ in 0..12 {
        let mut send = send.clone();
        reqs.push(tokio::spawn(async move {
            let req = http::Request::post(format!("http://{addr}/v1/chat/completions"))
                .header("content-type", "application/json")
                .body(Full::new(bytes::Bytes::from(chat(true, 2, ""))))
                .unwrap();
            // Streams opened before the client saw the server's SETTINGS are refused
            // (REFUSED_STREAM: never processed, safe to retry) — the limit working too.
            let resp = send.send_request(req).await.ok()?;
            let status = resp.status();
            let _ = resp.into_body().collect().await;
            Some(status)
        }));
    }
    let mut most = 0;
    while reqs.iter().any(|r| !r.is_finished()) {
        most = most.max(sim.active());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut served = 0;
    for r in reqs {
        if let Some(status) = r.await.unwrap() {
            assert_eq!(status, 200);
            served += 1;
        }
    }
    assert!(served >= 4, "{served}");
    assert!(
        most <= 4 && most > 0,
        "{most} streams at once on one connection"
    );
    assert_eq!(stop_and_read_log(gw, &dir).await.len(), served);
}

/// A backend answering a streamed chat with three output events and `[DONE]`, encoded as
/// `encoding` says: `Some("gzip")` gzips when the request accepts it, `Some("gzip!")` gzips
/// whatever was asked, `Some("br")` claims Brotli. It keeps each request's head.
async fn encoding_backend(
    encoding: &'static str,
) -> (SocketAddr, std::sync::Arc<parking_lot::Mutex<Vec<String>>>) {
    answering_backend(move |head| {
        use std::io::Write as _;
        let accepts = head
            .lines()
            .any(|l| l.starts_with("accept-encoding:") && l.contains("gzip"));
        let mut sse = String::new();
        for w in ["one", "two", "three"] {
            sse.push_str(&format!(
                "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"demo\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{w} \"}},\"finish_reason\":null}}]}}\n\n"
            ));
        }
        sse.push_str("data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"demo\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n");
        let (label, body) = match encoding {
            "gzip" | "gzip!" if accepts || encoding == "gzip!" => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                e.write_all(sse.as_bytes()).unwrap();
                (Some("gzip"), e.finish().unwrap())
            }
            "br" => (Some("br"), b"\x0b\x02\x80not really brotli".to_vec()),
            _ => (None, sse.into_bytes()),
        };
        let mut out = String::from("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n");
        if let Some(l) = label {
            out.push_str(&format!("content-encoding: {l}\r\n"));
        }
        out.push_str("\r\n");
        let mut bytes = out.into_bytes();
        // Three chunks, as a server flushing while it compresses would send them.
        for piece in body.chunks(body.len().div_ceil(3)) {
            bytes.extend(chunk(piece));
        }
        bytes.extend_from_slice(b"0\r\n\r\n");
        bytes
    })
    .await
}

/// A client that accepts gzip: the gateway asks measured endpoints for `identity`, so a backend
/// that honours it sends plain SSE (measured, `ok`); one that gzips anyway reaches the client as
/// it came and is measured through a decoded copy; an encoding the meter cannot read is `ok`
/// with `unmeasured_encoding`, never `truncated`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_streams_are_measured_or_say_why_not() {
    use std::io::Read as _;
    let (polite, polite_heads) = encoding_backend("gzip").await;
    let (stubborn, _) = encoding_backend("gzip!").await;
    let (brotli, _) = encoding_backend("br").await;
    let mut bodies = Vec::new();
    let mut log = Vec::new();
    for (name, backend) in [
        ("polite", polite),
        ("stubborn", stubborn),
        ("brotli", brotli),
    ] {
        let dir = temp_dir();
        let gw = start_gateway(&[(name, backend)], &dir, "").await;
        let r = post(
            gw.data_addr,
            "/v1/chat/completions",
            &chat(true, 3, ""),
            &[("accept-encoding", "gzip")],
        )
        .await;
        assert_eq!(r.status, 200, "{name}");
        bodies.push((r.headers.get("content-encoding").cloned(), r.body()));
        log.extend(stop_and_read_log(gw, &dir).await);
    }
    let head = polite_heads.lock()[0].clone();
    assert!(head.contains("accept-encoding: identity"), "{head}");
    assert!(!head.contains("gzip"), "{head}");
    assert_eq!(bodies[0].0, None);
    assert!(bodies[0].1.ends_with(b"data: [DONE]\n\n"));
    // The stubborn backend's gzip reaches the client untouched.
    assert_eq!(bodies[1].0.as_ref().unwrap(), "gzip");
    let mut text = String::new();
    flate2::read::GzDecoder::new(&bodies[1].1[..])
        .read_to_string(&mut text)
        .unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_eq!(log.len(), 3);
    for l in &log[..2] {
        assert_eq!(l["outcome"], "ok", "{l}");
        assert_eq!(l["output_tokens"], 3, "{l}");
        assert!(l["ttft_ms"].as_f64().is_some(), "{l}");
        assert!(l["error"].is_null(), "{l}");
    }
    assert_eq!(log[2]["outcome"], "ok", "{}", log[2]);
    assert_eq!(log[2]["error"], "unmeasured_encoding", "{}", log[2]);
}

/// An h2 client that opens its streams with a zero window and never sends WINDOW_UPDATE: no
/// response byte can leave, and its streams hold slots. With nothing moving either way for 5×
/// `client_idle_timeout` its connection is closed, every stream is logged, and the slots come
/// back; while they are held, the in-flight count and the limit agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_streams_a_client_never_opens_its_window_to_are_closed() {
    let (_sim, gw, dir) =
        gateway("limits:\n  client_idle_timeout: 300ms\n  max_concurrent_requests: 4\n").await;
    let stream = TcpStream::connect(gw.data_addr).await.unwrap();
    let (send, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .initial_stream_window_size(0)
            .handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let mut held = Vec::new();
    for _ in 0..4 {
        let req = http::Request::post("/v1/chat/completions")
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(chat(
                true, 50, "",
            ))))
            .unwrap();
        let resp = send.clone().send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        held.push(resp);
    }
    // The four streams fill the limit: another client is turned away, and the count says 4.
    let t = Instant::now();
    let other = post(
        gw.data_addr,
        "/v1/chat/completions",
        &chat(false, 2, ""),
        &[],
    )
    .await;
    assert_eq!(
        other.status, 503,
        "a fifth request while four slots are held"
    );
    assert_eq!(
        common::metric(gw.admin_addr, "inferscope_in_flight_requests").await,
        4.0
    );
    // Closed after 5 × 300 ms of silence, and the slots are free again.
    until(
        Duration::from_secs(10),
        "the stuck connection is closed",
        || async { conn.is_finished() },
    )
    .await;
    assert!(
        t.elapsed() >= Duration::from_millis(1200),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(
        common::metric(
            gw.admin_addr,
            "inferscope_client_connections_stalled_closed_total"
        )
        .await,
        1.0
    );
    until(Duration::from_secs(5), "the slots come back", || async {
        post(
            gw.data_addr,
            "/v1/chat/completions",
            &chat(false, 2, ""),
            &[],
        )
        .await
        .status
            == 200
    })
    .await;
    drop(held);
    let log = stop_and_read_log(gw, &dir).await;
    let stuck: Vec<_> = log.iter().filter(|l| l["protocol"] == "HTTP/2.0").collect();
    assert_eq!(stuck.len(), 4, "{log:?}");
    for l in stuck {
        assert_eq!(l["outcome"], "client_cancelled", "{l}");
        assert_eq!(l["error"], "client_stalled", "{l}");
    }
}

/// Connects to `addr` from the loopback address `from` (127.0.0.0/8: a client of its own).
async fn connect_from(from: [u8; 4], addr: SocketAddr) -> std::io::Result<TcpStream> {
    let sock = tokio::net::TcpSocket::new_v4()?;
    sock.bind(SocketAddr::from((from, 0)))?;
    sock.connect(addr).await
}

/// One uploader of the slow-upload attacker: a 100 KB body sent at ~1.1 KB/s (just above the
/// default minimum pace), from 127.0.0.2, reconnecting whenever it is cut. Counts its cuts.
async fn slow_uploader(addr: SocketAddr, cuts: std::sync::Arc<std::sync::atomic::AtomicU64>) {
    loop {
        let Ok(s) = connect_from([127, 0, 0, 2], addr).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let (mut rd, mut wr) = s.into_split();
        let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{";
        if wr.write_all(head.as_bytes()).await.is_err() {
            continue;
        }
        let drip = async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if wr.write_all(&[b' '; 110]).await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        // Whatever answer comes (408 cut, 503 refused), or the connection closing, it starts over.
        tokio::select! {
            _ = status_line(&mut rd, Duration::from_secs(120)) => {}
            () = drip => {}
        }
        cuts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The slow-upload attacker of the second hostile review: 20 uploads at 1.1 KB/s from one address
/// hold all 20 slots of a 20-slot gateway, reconnecting when cut. Another address's requests still
/// get through (each within a few retries): under pressure the body pace tightens and cuts the
/// uploads, and the attacker, holding more than its share while another client waits, is refused
/// more slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_uploads_from_one_address_cannot_keep_others_out() {
    let (_sim, gw, dir) = gateway("limits:\n  max_concurrent_requests: 20\n").await;
    let addr = gw.data_addr;
    let cuts = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let attackers: Vec<_> = (0..20)
        .map(|_| tokio::spawn(slow_uploader(addr, std::sync::Arc::clone(&cuts))))
        .collect();
    until(
        Duration::from_secs(5),
        "the attacker holds every slot",
        || async { common::metric(gw.admin_addr, "inferscope_in_flight_requests").await >= 20.0 },
    )
    .await;
    // Ten requests from 127.0.0.1, one after another, each retried on 503 (as its Retry-After
    // says, but faster): each gets through within 5 s.
    let mut tries = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        let mut n = 0;
        loop {
            n += 1;
            let r = post(addr, "/v1/chat/completions", &chat(false, 2, ""), &[]).await;
            if r.status == 200 {
                break;
            }
            assert_eq!(r.status, 503, "only refusals for want of room");
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "a request from another address was kept out for 5 s ({n} tries)"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tries.push(n);
    }
    for a in attackers {
        a.abort();
    }
    assert!(
        cuts.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "the uploads were never cut"
    );
    let log = stop_and_read_log(gw, &dir).await;
    let from_others: Vec<_> = log
        .iter()
        .filter(|l| {
            l["client"]
                .as_str()
                .is_some_and(|c| c.starts_with("127.0.0.1:"))
        })
        .collect();
    assert_eq!(
        from_others.iter().filter(|l| l["status"] == 200).count(),
        10
    );
    let shared = log.iter().filter(|l| l["error"] == "client_share").count();
    eprintln!("tries per request: {tries:?}; attacker refused its share {shared} times");
}

/// Connections: once `overload_at` of `max_connections` are open, an address holding its fair
/// share among the addresses holding any has a new connection closed at once, while another
/// address still gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_pressure_one_address_cannot_take_every_connection() {
    let (_sim, gw, _dir) = gateway("limits:\n  max_connections: 8\n").await;
    let addr = gw.data_addr;
    // A normal client holds one kept-alive connection.
    let mut normal = Client::connect(addr).await;
    assert_eq!(
        normal
            .send("POST", "/v1/chat/completions", &chat(false, 2, ""), &[])
            .await
            .status,
        200
    );
    // The hog opens connections from 127.0.0.2 until one is closed on it at once.
    let mut hog = Vec::new();
    let mut refused_after = None;
    for i in 0..8 {
        let mut s = connect_from([127, 0, 0, 2], addr).await.unwrap();
        if closed_within(&mut s, Duration::from_millis(300))
            .await
            .is_some()
        {
            refused_after = Some(i);
            break;
        }
        hog.push(s);
    }
    // With 6 open (5 of them the hog's), 0.75 × 8 is reached: the hog's share among two
    // addresses is 4, and it holds 5.
    assert_eq!(
        refused_after,
        Some(5),
        "the hog got {} connections",
        hog.len()
    );
    assert_eq!(
        common::metric(
            gw.admin_addr,
            "inferscope_client_connections_share_refused_total"
        )
        .await,
        1.0
    );
    // The other address still gets in, on its kept connection and on a new one.
    assert_eq!(
        normal
            .send("POST", "/v1/chat/completions", &chat(false, 2, ""), &[])
            .await
            .status,
        200
    );
    let r = post(addr, "/v1/chat/completions", &chat(false, 2, ""), &[]).await;
    assert_eq!(r.status, 200);
    drop(hog);
}
