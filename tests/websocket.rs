//! Upgraded connections through the gateway: a WebSocket handshake reaches the backend with its
//! `Upgrade`, `Connection` and `Sec-WebSocket-*` headers, the backend's 101 reaches the client,
//! bytes are relayed both ways untouched, and the session is one access-log line when it ends —
//! status 101, its duration, the bytes each way. A refused handshake and an unreachable backend
//! are answered and logged like any request.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Reads an HTTP head (through the blank line) and returns it.
async fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).await.unwrap() == 0 {
            break;
        }
        head.push(b[0]);
    }
    String::from_utf8(head).unwrap()
}

/// A backend that switches protocols (or answers `refuse` instead) and then echoes every byte.
async fn echo_backend(
    refuse: Option<&'static str>,
) -> (SocketAddr, Arc<parking_lot::Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let heads = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let seen = Arc::clone(&heads);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let head = read_head(&mut s).await;
                seen.lock().push(head);
                if let Some(r) = refuse {
                    let _ = s.write_all(r.as_bytes()).await;
                    return;
                }
                let _ = s
                    .write_all(
                        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                          Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n",
                    )
                    .await;
                let mut buf = [0u8; 4096];
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if s.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    }
                }
                let _ = s.shutdown().await;
            });
        }
    });
    (addr, heads)
}

const HANDSHAKE: &str = "GET /v1/realtime?model=gpt-realtime HTTP/1.1\r\nHost: gateway\r\n\
    Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
    Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: realtime\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_session_is_relayed_and_logged_when_it_ends() {
    let (backend, heads) = echo_backend(None).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("rt", backend)], &dir, "").await;
    let mut c = TcpStream::connect(gw.data_addr).await.unwrap();
    c.write_all(HANDSHAKE.as_bytes()).await.unwrap();
    let head = read_head(&mut c).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("upgrade: websocket"), "{head}");
    assert!(
        lower.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{head}"
    );
    // What reached the backend: the upgrade asked for, the WebSocket headers kept.
    let up = heads.lock()[0].to_ascii_lowercase();
    for h in [
        "get /v1/realtime?model=gpt-realtime http/1.1",
        "upgrade: websocket",
        "connection: upgrade",
        "sec-websocket-key: dghlihnhbxbszsbub25jzq==",
        "sec-websocket-protocol: realtime",
        "x-forwarded-for: 127.0.0.1",
    ] {
        assert!(up.contains(h), "{h} not in {up}");
    }
    // Bytes both ways, untouched (a text frame "hello", then a kilobyte).
    let frame = [0x81u8, 0x05, b'h', b'e', b'l', b'l', b'o'];
    c.write_all(&frame).await.unwrap();
    let mut back = [0u8; 7];
    c.read_exact(&mut back).await.unwrap();
    assert_eq!(back, frame);
    let big: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
    c.write_all(&big).await.unwrap();
    let mut back = vec![0u8; 1000];
    c.read_exact(&mut back).await.unwrap();
    assert_eq!(back, big);
    // The session lasts a while (its length is logged).
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The client closes; the backend closes in turn; the session ends.
    c.shutdown().await.unwrap();
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
    let admin = gw.admin_addr;
    until(
        Duration::from_secs(5),
        "the session recorded",
        || async move { recorded(admin).await == 1 },
    )
    .await;
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 1, "{log:?}");
    let l = &log[0];
    assert_eq!(l["status"], 101, "{l}");
    assert_eq!(l["outcome"], "ok", "{l}");
    assert_eq!(l["path"], "/v1/realtime", "{l}");
    assert_eq!(l["backend"], "rt", "{l}");
    assert_eq!(l["bytes_in"], 1007, "{l}");
    assert_eq!(l["bytes_out"], 1007, "{l}");
    assert!(
        l["e2e_ms"].as_f64().unwrap() >= 300.0,
        "the session's length: {l}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_and_unreachable_handshakes_are_answered_and_logged() {
    let (backend, _) = echo_backend(Some(
        "HTTP/1.1 403 Forbidden\r\ncontent-type: text/plain\r\ncontent-length: 6\r\n\r\nno key",
    ))
    .await;
    let dir = temp_dir();
    let yaml = format!(
        "access_log: {{ path: {:?} }}\nbackends:\n  - {{ name: no, url: \"http://{backend}\" }}\n  - {{ name: dead, url: \"http://{DEAD}\" }}\n\
         routes:\n  - {{ name: a, match: {{ path_prefix: /a }}, backends: [no] }}\n  - {{ name: b, backends: [dead] }}\n",
        dir.join("access.jsonl")
    );
    let gw = start_yaml(&yaml).await;
    for path in ["/a/realtime", "/b/realtime"] {
        let mut c = TcpStream::connect(gw.data_addr).await.unwrap();
        c.write_all(
            HANDSHAKE
                .replace("/v1/realtime?model=gpt-realtime", path)
                .as_bytes(),
        )
        .await
        .unwrap();
        let resp = read_head(&mut c).await;
        let want = if path == "/a/realtime" {
            "HTTP/1.1 403"
        } else {
            "HTTP/1.1 502"
        };
        assert!(resp.starts_with(want), "{path}: {resp}");
    }
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!(
        (log[0]["status"].as_u64(), log[0]["outcome"].as_str()),
        (Some(403), Some("client_error"))
    );
    assert_eq!(log[0]["error"], "upgrade_refused");
    assert_eq!(log[1]["status"], 502, "{}", log[1]);
    assert_eq!(log[1]["outcome"], "backend_error", "{}", log[1]);
}

/// A backend that takes the handshake and never answers: the route's head timeout
/// (`timeouts.first_token`) applies, the client gets a 504 and the log says `upstream_timeout`.
/// A client that gives up first is logged 499 (no 101 was ever sent), and nothing holds its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_the_backend_never_answers_times_out_and_is_logged_as_sent() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = listener.local_addr().unwrap();
    let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let heads = Arc::clone(&seen);
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut s, _)) = listener.accept().await {
            read_head(&mut s).await;
            heads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            held.push(s);
        }
    });
    let dir = temp_dir();
    let yaml = format!(
        "access_log: {{ path: {:?} }}\nlimits: {{ max_concurrent_requests: 1 }}\nbackends:\n  - {{ name: mute, url: \"http://{backend}\" }}\n\
         routes:\n  - {{ name: quick, match: {{ path_prefix: /quick }}, backends: [mute], timeouts: {{ first_token: 300ms }} }}\n  - {{ name: slow, backends: [mute] }}\n",
        dir.join("access.jsonl")
    );
    let gw = start_yaml(&yaml).await;
    // A handshake on the quick route, answered (or not) within 5 s.
    let quick = || async {
        let mut c = TcpStream::connect(gw.data_addr).await.unwrap();
        let hs = HANDSHAKE.replace("/v1/realtime", "/quick/realtime");
        c.write_all(hs.as_bytes()).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), read_head(&mut c))
            .await
            .expect("the handshake was not timed out")
    };
    let resp = quick().await;
    assert!(resp.starts_with("HTTP/1.1 504"), "{resp}");
    // A client that gives up while the backend is silent (the route allows 120 s).
    let mut c = TcpStream::connect(gw.data_addr).await.unwrap();
    c.write_all(HANDSHAKE.as_bytes()).await.unwrap();
    until(
        Duration::from_secs(5),
        "the backend saw the second handshake",
        || async { seen.load(std::sync::atomic::Ordering::SeqCst) == 2 },
    )
    .await;
    drop(c);
    // Its slot (the only one) is free again: a request gets through to the backend.
    until(Duration::from_secs(5), "the slot is freed", || async {
        quick().await.starts_with("HTTP/1.1 504")
    })
    .await;
    let log = stop_and_read_log(gw, &dir).await;
    assert!(log.len() >= 3, "{log:?}");
    assert_eq!(log[0]["status"], 504, "{}", log[0]);
    assert_eq!(log[0]["error"], "upstream_timeout", "{}", log[0]);
    let gone = log.iter().find(|l| l["route"] == "slow").unwrap();
    assert_eq!(gone["status"], 499, "{gone}");
    assert_eq!(gone["outcome"], "client_cancelled", "{gone}");
    assert!(log.iter().all(|l| l["status"] != 101), "{log:?}");
}
