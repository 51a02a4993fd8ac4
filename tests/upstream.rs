//! The upstream connection pool, seen from the backend's side: a counting TCP relay sits between
//! the gateway and the simulator and reports every connection the gateway opened.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

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
    tokio::time::sleep(Duration::from_millis(100)).await;
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
