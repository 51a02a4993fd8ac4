//! The upstream connection pool, seen from the backend's side: a counting TCP relay sits between
//! the gateway and the simulator and reports every connection the gateway opened.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A loopback relay to `target` that counts accepted connections and, with `idle_close`, closes a
/// connection that has been quiet that long (like a backend's keep-alive timeout: uvicorn's is 5 s).
async fn relay(target: SocketAddr, idle_close: Option<Duration>) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        loop {
            let Ok((mut down, _)) = listener.accept().await else {
                return;
            };
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let Ok(mut up) = TcpStream::connect(target).await else {
                    return;
                };
                let (mut a, mut b) = (vec![0u8; 16384], vec![0u8; 16384]);
                let quiet = idle_close.unwrap_or(Duration::from_secs(3600));
                loop {
                    tokio::select! {
                        n = down.read(&mut a) => match n {
                            Ok(0) | Err(_) => return,
                            Ok(n) => if up.write_all(&a[..n]).await.is_err() { return },
                        },
                        n = up.read(&mut b) => match n {
                            Ok(0) | Err(_) => return,
                            Ok(n) => if down.write_all(&b[..n]).await.is_err() { return },
                        },
                        () = tokio::time::sleep(quiet) => return,
                    }
                }
            });
        }
    });
    (addr, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_requests_reuse_one_upstream_connection() {
    let sim = start_sim(exact(2.0, 1.0), 1).await;
    let (via, accepted) = relay(sim.addr, None).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", via)], &dir, "").await;
    let mut client = Client::connect(gw.data_addr).await;
    // Streamed (chunked) and whole (content-length) responses alternate: both hand the
    // connection back when they end.
    for i in 0..12 {
        let r = client
            .send(
                "POST",
                "/v1/chat/completions",
                &chat(i % 2 == 0, 6, ""),
                &[],
            )
            .await;
        assert_eq!(r.status, 200);
        let body = String::from_utf8(r.body()).unwrap();
        if i % 2 == 0 {
            assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
        } else {
            assert!(body.contains("\"completion_tokens\":6"), "{body}");
        }
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "one keep-alive connection"
    );
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 12);
    assert!(log.iter().all(|l| l["outcome"] == "ok"), "{log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_the_backend_closed_while_idle_are_not_used() {
    let sim = start_sim(exact(2.0, 1.0), 2).await;
    // The backend side closes every connection after 150 ms of quiet.
    let (via, accepted) = relay(sim.addr, Some(Duration::from_millis(150))).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", via)], &dir, "").await;
    for i in 0..4 {
        let r = post(
            gw.data_addr,
            "/v1/chat/completions",
            &chat(i % 2 == 0, 4, ""),
            &[],
        )
        .await;
        assert_eq!(r.status, 200, "request {i} on a closed pooled connection");
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        4,
        "each request found its pooled connection closed and opened a new one"
    );
    let log = stop_and_read_log(gw, &dir).await;
    assert!(
        log.iter()
            .all(|l| l["outcome"] == "ok" && l["attempts"] == 1),
        "no failed attempt: {log:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_mid_stream_closes_the_upstream_connection() {
    // 200 tokens 10 ms apart: the client leaves long before the end.
    let sim = start_sim(exact(2.0, 10.0), 3).await;
    let (via, accepted) = relay(sim.addr, None).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", via)], &dir, "").await;
    let mut client = Client::connect(gw.data_addr).await;
    let r = client
        .send_until("POST", "/v1/chat/completions", &chat(true, 200, ""), &[], 5)
        .await;
    assert_eq!(r.status, 200);
    drop(r);
    drop(client);
    let admin = gw.admin_addr;
    until(
        Duration::from_secs(5),
        "the abandoned request recorded",
        || async move { recorded(admin).await == 1 },
    )
    .await;
    // The next request cannot reuse the abandoned connection: a new one is opened.
    let r = post(
        gw.data_addr,
        "/v1/chat/completions",
        &chat(true, 3, ""),
        &[],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    let log = stop_and_read_log(gw, &dir).await;
    let outcomes: Vec<&str> = log.iter().map(|l| l["outcome"].as_str().unwrap()).collect();
    assert!(
        outcomes.contains(&"client_cancelled") && outcomes.contains(&"ok"),
        "{outcomes:?}"
    );
}

/// What a scripted backend received: the connection a request came on (numbered from 0), its
/// head, and its body as decoded.
#[derive(Debug, Clone)]
struct Got {
    conn: usize,
    head: String,
    body: Vec<u8>,
}

/// Reads up to and including the next CRLF CRLF (or CRLF) from `s` through `buf`.
async fn read_until(s: &mut TcpStream, buf: &mut Vec<u8>, end: &[u8]) -> Option<Vec<u8>> {
    loop {
        if let Some(i) = buf.windows(end.len()).position(|w| w == end) {
            let line = buf.drain(..i + end.len()).collect();
            return Some(line);
        }
        let mut chunk = [0u8; 4096];
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

async fn read_exact_buf(s: &mut TcpStream, buf: &mut Vec<u8>, n: usize) -> Option<Vec<u8>> {
    while buf.len() < n {
        let mut chunk = [0u8; 4096];
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
        }
    }
    Some(buf.drain(..n).collect())
}

/// A request body as its head frames it (Content-Length or chunked).
async fn read_body(s: &mut TcpStream, buf: &mut Vec<u8>, head: &str) -> Option<Vec<u8>> {
    let lower = head.to_ascii_lowercase();
    if lower.contains("\r\ntransfer-encoding: chunked\r\n") {
        let mut body = Vec::new();
        loop {
            let line = read_until(s, buf, b"\r\n").await?;
            let size = String::from_utf8_lossy(&line);
            let size = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
            if size == 0 {
                read_until(s, buf, b"\r\n").await?;
                return Some(body);
            }
            body.extend(read_exact_buf(s, buf, size).await?);
            read_exact_buf(s, buf, 2).await?;
        }
    }
    let len = lower
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    read_exact_buf(s, buf, len).await
}

/// A backend that answers the n-th request it gets (over all its connections) with
/// `answers[n % len]` — closing the connection after it when its flag says so — and records
/// what it got. With `early`, it answers as soon as it has the head and reads the body after.
async fn scripted(
    answers: Vec<(Vec<u8>, bool)>,
    early: bool,
) -> (SocketAddr, Arc<std::sync::Mutex<Vec<Got>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let got = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&got);
    let next = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        let mut conns = 0;
        while let Ok((mut s, _)) = listener.accept().await {
            let (answers, seen, next) = (answers.clone(), Arc::clone(&seen), Arc::clone(&next));
            let conn = conns;
            conns += 1;
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let Some(head) = read_until(&mut s, &mut buf, b"\r\n\r\n").await else {
                        return;
                    };
                    let head = String::from_utf8_lossy(&head).into_owned();
                    let (answer, close) =
                        &answers[next.fetch_add(1, Ordering::SeqCst) % answers.len()];
                    if early {
                        // Recorded with the head: the body may never come.
                        let _ = s.write_all(answer).await;
                        seen.lock().unwrap().push(Got {
                            conn,
                            head: head.clone(),
                            body: Vec::new(),
                        });
                    }
                    let Some(body) = read_body(&mut s, &mut buf, &head).await else {
                        return;
                    };
                    if !early {
                        seen.lock().unwrap().push(Got { conn, head, body });
                    }
                    if !early && s.write_all(answer).await.is_err() {
                        return;
                    }
                    if *close {
                        let _ = s.shutdown().await;
                        return;
                    }
                }
            });
        }
    });
    (addr, got)
}

/// Writes a request head and its body in `pieces`, 20 ms apart, on a new connection; returns the
/// response's status line and body (read to the connection's close).
async fn upload(addr: SocketAddr, head: &str, pieces: &[&[u8]]) -> (String, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    for p in pieces {
        tokio::time::sleep(Duration::from_millis(20)).await;
        s.write_all(p).await.unwrap();
    }
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (
        head.lines().next().unwrap_or("").to_owned(),
        body.to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_stream_through_with_their_framing_on_one_connection() {
    let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec();
    let (backend, got) = scripted(vec![(ok, false)], false).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("raw", backend)], &dir, "").await;
    // Not an inference endpoint: bodies are streamed through as they come.
    let (status, body) = upload(
        gw.data_addr,
        "POST /v1/files HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: 11\r\n\r\n",
        &[b"hello", b" world"],
    )
    .await;
    assert_eq!((status.as_str(), body.as_str()), ("HTTP/1.1 200 OK", "ok"));
    let (status, body) = upload(
        gw.data_addr,
        "POST /v1/files HTTP/1.1\r\nhost: x\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n",
        &[b"5\r\nhello\r\n", b"6\r\n world\r\n", b"0\r\n\r\n"],
    )
    .await;
    assert_eq!((status.as_str(), body.as_str()), ("HTTP/1.1 200 OK", "ok"));
    let got = got.lock().unwrap().clone();
    assert_eq!(got.len(), 2);
    assert!(
        got[0].head.contains("\r\ncontent-length: 11\r\n"),
        "{}",
        got[0].head
    );
    assert!(
        got[1].head.contains("\r\ntransfer-encoding: chunked\r\n")
            && !got[1].head.contains("content-length"),
        "{}",
        got[1].head
    );
    for g in &got {
        assert_eq!(g.body, b"hello world");
        assert_eq!(g.conn, 0, "the second upload reused the first's connection");
    }
    let log = stop_and_read_log(gw, &dir).await;
    assert!(log.iter().all(|l| l["outcome"] == "ok"), "{log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_response_framing_is_relayed_and_its_connection_reused_where_it_can_be() {
    let answers = vec![
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
              5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-checksum: 1\r\n\r\n"
                .to_vec(),
            false,
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec(),
            false,
        ),
        (b"HTTP/1.1 204 No Content\r\n\r\n".to_vec(), false),
        (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Made It\r\ncontent-length: 4\r\n\r\nmade"
                .to_vec(),
            false,
        ),
        (b"HTTP/1.0 200 OK\r\n\r\nto the close".to_vec(), true),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec(),
            false,
        ),
    ];
    let (backend, got) = scripted(answers, false).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("raw", backend)], &dir, "").await;
    let mut client = Client::connect(gw.data_addr).await;
    let mut seen = Vec::new();
    for _ in 0..6 {
        let r = client.send("GET", "/v1/models", "", &[]).await;
        seen.push((r.status, String::from_utf8(r.body()).unwrap()));
    }
    assert_eq!(
        seen,
        [
            (200, "hello world".to_owned()),
            (200, "ok".to_owned()),
            (204, String::new()),
            (201, "made".to_owned()),
            (200, "to the close".to_owned()),
            (200, "ok".to_owned()),
        ]
    );
    let conns: Vec<usize> = got.lock().unwrap().iter().map(|g| g.conn).collect();
    // Everything on one connection until the body read to its close ended it.
    assert_eq!(conns, [0, 0, 0, 0, 0, 1]);
    let log = stop_and_read_log(gw, &dir).await;
    assert!(log.iter().all(|l| l["outcome"] == "ok"), "{log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_before_the_upload_ends_is_relayed_and_its_connection_not_reused() {
    let refuse = b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 7\r\n\r\ntoo big".to_vec();
    let (backend, got) = scripted(vec![(refuse, false)], true).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("raw", backend)], &dir, "").await;
    // The backend answers after the head; the rest of the body comes 300 ms later.
    let mut s = TcpStream::connect(gw.data_addr).await.unwrap();
    s.write_all(b"POST /v1/files HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n01234")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let head = tokio::time::timeout(
        Duration::from_secs(5),
        read_until(&mut s, &mut buf, b"\r\n\r\n"),
    )
    .await
    .expect("the answer came before the body was complete")
    .unwrap();
    assert!(
        head.starts_with(b"HTTP/1.1 413 "),
        "{}",
        String::from_utf8_lossy(&head)
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = s.write_all(b"56789").await;
    drop(s);
    // The next request does not reuse that connection: the backend may still wait for the rest.
    let (status, _) = upload(
        gw.data_addr,
        "POST /v1/files HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: 2\r\n\r\n",
        &[b"ok"],
    )
    .await;
    assert_eq!(status, "HTTP/1.1 413 Payload Too Large");
    // The backend notes a head just after it answers it.
    let seen = Arc::clone(&got);
    until(
        Duration::from_secs(5),
        "the backend noted both heads",
        || {
            let n = seen.lock().unwrap().len();
            async move { n == 2 }
        },
    )
    .await;
    let conns: Vec<usize> = got.lock().unwrap().iter().map(|g| g.conn).collect();
    assert_eq!(conns, [0, 1]);
    let _ = stop_and_read_log(gw, &dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_head_past_its_limit_is_a_502() {
    let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
    for _ in 0..70 {
        head.extend_from_slice(format!("x-filler: {}\r\n", "a".repeat(1000)).as_bytes());
    }
    head.extend_from_slice(b"content-length: 2\r\n\r\nok");
    let (backend, _) = scripted(vec![(head, false)], false).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("raw", backend)], &dir, "").await;
    let r = post(gw.data_addr, "/v1/files", "", &[]).await;
    assert_eq!(r.status, 502);
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log[0]["error"], "upstream_failed", "{log:?}");
}

/// Sends `GET /v1/models` through `gw` after each pause in `pauses` (the first before any
/// pause) and returns which backend connection each request came on.
async fn conns_after(
    gw: &inferscope::app::Running,
    got: &std::sync::Mutex<Vec<Got>>,
    pauses: &[Duration],
) -> Vec<usize> {
    let mut client = Client::connect(gw.data_addr).await;
    assert_eq!(client.send("GET", "/v1/models", "", &[]).await.status, 200);
    for pause in pauses {
        tokio::time::sleep(*pause).await;
        assert_eq!(client.send("GET", "/v1/models", "", &[]).await.status, 200);
    }
    got.lock().unwrap().iter().map(|g| g.conn).collect()
}

/// One backend `raw` at `addr` with `fields` added to its entry.
fn one_backend(dir: &std::path::Path, addr: SocketAddr, fields: &str) -> String {
    format!(
        "access_log: {{ path: {:?} }}\nbackends:\n  - {{ name: raw, url: \"http://{addr}\"{fields} }}\n\
         routes:\n  - name: main\n    backends: [raw]\n",
        dir.join("access.jsonl")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_let_go_before_the_backend_would_close_them() {
    let (short, long) = (Duration::from_millis(50), Duration::from_millis(1500));
    let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec();
    // The backend's `idle_timeout`: reused within it, a new connection after it.
    let (backend, got) = scripted(vec![(ok.clone(), false)], false).await;
    let dir = temp_dir();
    let gw = start_yaml(&one_backend(&dir, backend, ", idle_timeout: 1s")).await;
    assert_eq!(
        conns_after(&gw, &got, &[short, long, short]).await,
        [0, 0, 1, 1]
    );
    let log = stop_and_read_log(gw, &dir).await;
    assert!(log.iter().all(|l| l["outcome"] == "ok"), "{log:?}");

    // A backend that says `Keep-Alive: timeout=1` is left after half a second, under a longer
    // `idle_timeout` (the default, 4 s).
    let hinted =
        b"HTTP/1.1 200 OK\r\nkeep-alive: timeout=1\r\ncontent-length: 2\r\n\r\nok".to_vec();
    let (backend, got) = scripted(vec![(hinted, false)], false).await;
    let dir = temp_dir();
    let gw = start_yaml(&one_backend(&dir, backend, "")).await;
    let pauses = [short, Duration::from_millis(1200), short];
    assert_eq!(conns_after(&gw, &got, &pauses).await, [0, 0, 1, 1]);
    gw.shutdown();

    // `0s`: no connection is reused.
    let (backend, got) = scripted(vec![(ok, false)], false).await;
    let dir = temp_dir();
    let gw = start_yaml(&one_backend(&dir, backend, ", idle_timeout: 0s")).await;
    assert_eq!(conns_after(&gw, &got, &[short, short]).await, [0, 1, 2]);
    gw.shutdown();
}

/// Parses a chunked body strictly: every size line is hex digits without leading zeros (what the
/// gateway writes) and is followed by exactly that many bytes and CRLF. Returns the sizes and the
/// body, or what was wrong.
fn dechunk_strict(mut b: &[u8]) -> Result<(Vec<usize>, Vec<u8>), String> {
    let (mut sizes, mut body) = (Vec::new(), Vec::new());
    loop {
        let eol = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("a size line without CRLF")?;
        let line = std::str::from_utf8(&b[..eol]).map_err(|e| e.to_string())?;
        let n = usize::from_str_radix(line, 16).map_err(|e| format!("size line {line:?}: {e}"))?;
        if line != format!("{n:X}") && line != format!("{n:x}") {
            return Err(format!(
                "size line {line:?} is not {n}'s hex without leading zeros"
            ));
        }
        b = &b[eol + 2..];
        if n == 0 {
            return if b == b"\r\n" {
                Ok((sizes, body))
            } else {
                Err(format!("{} bytes after the last chunk", b.len()))
            };
        }
        if b.len() < n + 2 || &b[n..n + 2] != b"\r\n" {
            return Err(format!("a chunk of {n} bytes not followed by CRLF"));
        }
        sizes.push(n);
        body.extend_from_slice(&b[..n]);
        b = &b[n + 2..];
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunk_sizes_of_every_hex_width_reach_the_client_intact() {
    // One chunk of each size, alone on the wire (so each is its own frame through the gateway),
    // across every boundary where the size's hex digits grow.
    let sizes = [
        1usize, 9, 10, 15, 16, 17, 255, 256, 4095, 4096, 4097, 70_000,
    ];
    let mut want = Vec::new();
    let mut pieces = vec![b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec()];
    for (i, &n) in sizes.iter().enumerate() {
        let data: Vec<u8> = (0..n).map(|j| b'a' + ((i + j) % 26) as u8).collect();
        let mut piece = format!("{n:x}\r\n").into_bytes();
        piece.extend_from_slice(&data);
        piece.extend_from_slice(b"\r\n");
        pieces.push(piece);
        want.extend_from_slice(&data);
    }
    pieces.push(b"0\r\n\r\n".to_vec());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        let head = read_until(&mut s, &mut buf, b"\r\n\r\n").await.unwrap();
        read_body(&mut s, &mut buf, &String::from_utf8_lossy(&head)).await;
        for p in pieces {
            s.write_all(&p).await.unwrap();
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
    });
    let dir = temp_dir();
    let gw = start_gateway(&[("raw", backend)], &dir, "").await;
    // The body as the client's socket got it, framing and all (the data is ASCII).
    let (status, raw) = upload(
        gw.data_addr,
        "GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        &[],
    )
    .await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    let (seen, body) = dechunk_strict(raw.as_bytes()).unwrap();
    assert!(
        body == want,
        "the body changed on the way ({} of {} bytes)",
        body.len(),
        want.len()
    );
    // Each small chunk arrived alone and left as its own frame, with its own size line; the
    // large ones are read in pieces of up to 16 KiB, which still take four digits.
    for n in [1, 9, 10, 15, 16, 17, 255, 256] {
        assert!(seen.contains(&n), "no chunk of {n} bytes in {seen:?}");
    }
    assert!(seen.iter().any(|&n| n >= 0x1000), "{seen:?}");
    let log = stop_and_read_log(gw, &dir).await;
    assert!(log.iter().all(|l| l["outcome"] == "ok"), "{log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_that_arrive_together_leave_together_intact_over_http1_and_h2() {
    // A backend that writes 40 events, each its own chunk, in one write: the gateway reads them
    // in one or a few reads and hands each read on as one chunk (HTTP/1.1) or frame (h2),
    // without copying them together. The client gets the same bytes; the meter still reads
    // every event.
    let events = 40;
    let mut want = Vec::new();
    let mut wire = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
        transfer-encoding: chunked\r\n\r\n"
        .to_vec();
    for i in 0..=events {
        let ev = if i == events {
            "data: [DONE]\n\n".to_owned()
        } else {
            format!(
                "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"demo\",\
                 \"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" w{i}\"}},\"finish_reason\":null}}]}}\n\n"
            )
        };
        wire.extend_from_slice(format!("{:x}\r\n{ev}\r\n", ev.len()).as_bytes());
        want.extend_from_slice(ev.as_bytes());
    }
    wire.extend_from_slice(b"0\r\n\r\n");
    let backend = start_raw(vec![wire], Duration::ZERO).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("raw", backend)], &dir, "").await;
    let body = chat(true, 64, "");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, raw) = upload(gw.data_addr, &head, &[]).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    let (sizes, got) = dechunk_strict(raw.as_bytes()).unwrap();
    assert!(
        got == want,
        "the body changed on the way:\n{}",
        String::from_utf8_lossy(&got)
    );
    // One chunk per event would be 41; a read's worth of events goes as one.
    assert!(sizes.len() <= 8, "{} chunks: {sizes:?}", sizes.len());

    // The same over h2 (cleartext, prior knowledge).
    let tcp = TcpStream::connect(gw.data_addr).await.unwrap();
    let (mut h2, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = http::Request::post("http://localhost/v1/chat/completions")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap();
    let resp = h2.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let got = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert!(
        got == want,
        "the body changed on the way:\n{}",
        String::from_utf8_lossy(&got)
    );

    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 2, "{log:?}");
    for l in &log {
        assert_eq!(l["outcome"], "ok", "{l}");
        assert_eq!(l["output_tokens"], events, "every event read: {l}");
        assert_eq!(l["itl_ms"]["count"], events - 1, "{l}");
    }
}
