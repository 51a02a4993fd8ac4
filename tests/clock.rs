//! The gateway's clock: requests are timed from the kernel's receive stamp of their first byte,
//! so a gateway that waits for a CPU still reports the TTFT its client felt; its own delay is
//! reported (`accept_delay_ms`, `forward_lag_ms`) instead of hidden or blamed on the backend; the
//! user-space clock is the fallback and the record says which was used.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use serde_json::Value;
use std::time::Duration;

/// A gateway (config `extra` added) in front of a simulator (TTFT 30 ms, 2 ms a token) on a runtime
/// with one worker thread, ready, with receive stamping on.
fn one_worker_gateway(
    extra: &str,
) -> (
    tokio::runtime::Runtime,
    std::path::PathBuf,
    inferscope::app::Running,
    inferscope::sim::SimHandle,
) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let dir = temp_dir();
    let (gw, sim) = rt.block_on(async {
        let sim = start_sim(exact(30.0, 2.0), 1).await;
        let gw = start_gateway(&[("s", sim.addr)], &dir, extra).await;
        // Let the kernel switch receive stamping on (deferred after the first socket asks).
        tokio::time::sleep(Duration::from_millis(200)).await;
        (gw, sim)
    });
    (rt, dir, gw, sim)
}

/// One streamed request to a gateway whose only worker thread is blocked for `stall` from just
/// before the request is sent: the client's TTFT (send → first content byte) and the log line.
fn stalled_request(kernel_clock: bool, stall: Duration) -> (Duration, Value) {
    let extra = format!("limits: {{ kernel_clock: {kernel_clock} }}\n");
    let (rt, dir, gw, _sim) = one_worker_gateway(&extra);
    let data = gw.data_addr;
    // The client runs on its own thread and runtime: it is not starved.
    let client = std::thread::spawn(move || {
        let crt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        crt.block_on(async move {
            let mut c = Client::connect(data).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            let r = c
                .send("POST", "/v1/chat/completions", &chat(true, 4, ""), &[])
                .await;
            assert_eq!(r.status, 200);
            // The first frame that carries content (the role chunk has none).
            let body = r.body();
            let text = String::from_utf8_lossy(&body);
            let first_content = text.find("\"content\":\" ").unwrap();
            r.time_of_byte(first_content + 1).unwrap() - r.t_send
        })
    });
    // Block the gateway's only worker from shortly before the request is sent.
    std::thread::sleep(Duration::from_millis(80));
    rt.spawn(async move { std::thread::sleep(stall) });
    let client_ttft = client.join().unwrap();
    let log = rt.block_on(stop_and_read_log(gw, &dir));
    assert_eq!(log.len(), 1);
    (client_ttft, log[0].clone())
}

#[test]
fn a_starved_gateway_still_reports_the_ttft_its_client_felt() {
    let stall = Duration::from_millis(300);
    let (client_ttft, line) = stalled_request(true, stall);
    assert_eq!(line["clock"], "kernel", "{line}");
    let logged = ms(&line, "ttft_ms");
    let diff = client_ttft.as_secs_f64() - logged.as_secs_f64();
    // The client's TTFT includes the stall; so does the logged one now.
    assert!(
        client_ttft > Duration::from_millis(250),
        "the stall happened: {client_ttft:?}"
    );
    assert!(
        diff.abs() < 0.03,
        "client {client_ttft:?} vs logged {logged:?}"
    );
    // The gateway says it was late, by about the stall.
    let accept = ms(&line, "accept_delay_ms");
    assert!(
        accept > Duration::from_millis(150) && accept < stall + Duration::from_millis(50),
        "{line}"
    );
}

#[test]
fn with_the_user_clock_the_same_stall_goes_unseen() {
    let (client_ttft, line) = stalled_request(false, Duration::from_millis(300));
    assert_eq!(line["clock"], "user", "{line}");
    assert!(line["accept_delay_ms"].is_null());
    let logged = ms(&line, "ttft_ms");
    // What the kernel clock fixes: the log misses most of the stall.
    assert!(
        client_ttft.as_secs_f64() - logged.as_secs_f64() > 0.15,
        "client {client_ttft:?} vs logged {logged:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_instrument_reports_its_clock_lag_and_heartbeat() {
    let sim = start_sim(exact(5.0, 2.0), 1).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("s", sim.addr)], &dir, "").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    for _ in 0..3 {
        let r = post(
            gw.data_addr,
            "/v1/chat/completions",
            &chat(true, 6, ""),
            &[],
        )
        .await;
        assert_eq!(r.status, 200);
    }
    let (_, stats) = admin_get(gw.admin_addr, "/stats").await;
    let stats: Value = serde_json::from_str(&stats).unwrap();
    let inst = &stats["instrument"];
    assert_eq!(inst["clock"], "kernel", "{inst}");
    // The frames of the streams beat (their forward lag is the lateness); between and after
    // requests nothing does.
    let hb = &inst["heartbeat"];
    assert!(hb["frame_beats"].as_u64().unwrap() >= 3, "{inst}");
    assert_eq!(
        hb["beats"].as_u64().unwrap(),
        hb["frame_beats"].as_u64().unwrap() + hb["timer_beats"].as_u64().unwrap()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, later) = admin_get(gw.admin_addr, "/stats").await;
    let later: Value = serde_json::from_str(&later).unwrap();
    let timer = |v: &Value| {
        v["instrument"]["heartbeat"]["timer_beats"]
            .as_u64()
            .unwrap()
    };
    // At most the beat the timer was sleeping for when the last request ended.
    assert!(timer(&later) <= timer(&stats) + 1, "{later}");
    assert!(inst["runtime"]["workers"].as_u64().unwrap() >= 1);
    let all = &stats["rollups"]["all"]["cumulative"];
    assert_eq!(all["accept_delay"]["count"], 3, "{all}");
    assert_eq!(all["forward_lag"]["count"], 3, "{all}");
    let (_, metrics) = admin_get(gw.admin_addr, "/metrics").await;
    for series in [
        "inferscope_heartbeat_lateness_seconds_count",
        "inferscope_accept_delay_seconds_count",
        "inferscope_forward_lag_seconds_count",
        "inferscope_runtime_busy_seconds_total",
        "inferscope_clock_steps_total",
    ] {
        assert!(metrics.contains(series), "{series}");
    }
    let log = stop_and_read_log(gw, &dir).await;
    for l in &log {
        assert_eq!(l["clock"], "kernel");
        // On an idle host the gateway's own delays are small.
        assert!(ms(l, "accept_delay_ms") < Duration::from_millis(50), "{l}");
        assert!(ms(l, "forward_lag_ms") < Duration::from_millis(50), "{l}");
        // The backend's TTFT is the simulator's 5 ms or a little more, measured from the read.
        let up = ms(l, "upstream_ttft_ms");
        assert!(
            up >= Duration::from_millis(5) && up < Duration::from_millis(60),
            "{l}"
        );
    }
}

/// Reads a chunked streamed response from `s` to its terminating chunk; returns when the first
/// content byte arrived.
fn read_stream(s: &mut std::net::TcpStream) -> std::time::Instant {
    use std::io::Read as _;
    let mut got = Vec::new();
    let mut first = None;
    let mut buf = [0u8; 4096];
    while !got.ends_with(b"\r\n0\r\n\r\n") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
        if first.is_none() && got.windows(12).any(|w| w == b"\"content\":\" ") {
            first = Some(std::time::Instant::now());
        }
    }
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    first.expect("a content chunk")
}

/// A client that writes a request's head and body in two segments 20 ms apart, while the
/// gateway's only worker is held from before the head until well after the body, so the gateway
/// reads both at once: the request is timed from the head's arrival, not the body's.
#[test]
fn a_head_and_body_written_apart_are_timed_from_the_head() {
    use std::io::Write as _;
    let (rt, dir, gw, _sim) = one_worker_gateway("");
    let body = chat(true, 4, "");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    let mut s = std::net::TcpStream::connect(gw.data_addr).unwrap();
    s.set_nodelay(true).unwrap();
    // A keep-alive connection in steady use, as a benchmark client's is.
    for _ in 0..3 {
        s.write_all(format!("{head}{body}").as_bytes()).unwrap();
        read_stream(&mut s);
    }
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    rt.spawn(async move {
        held_tx.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(80));
    });
    held_rx.recv().unwrap();
    let sent = std::time::Instant::now();
    s.write_all(head.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    s.write_all(body.as_bytes()).unwrap();
    let client_ttft = read_stream(&mut s) - sent;
    drop(s);
    let log = rt.block_on(stop_and_read_log(gw, &dir));
    assert_eq!(log.len(), 4);
    let line = &log[3];
    assert_eq!(line["clock"], "kernel", "{line}");
    let logged = ms(line, "ttft_ms");
    assert!(
        client_ttft > Duration::from_millis(100),
        "the hold happened: {client_ttft:?}"
    );
    // Before the first byte's stamp was kept, the log was short by the 20 ms between the writes.
    let diff = client_ttft.as_secs_f64() - logged.as_secs_f64();
    assert!(
        diff.abs() < 0.005,
        "client {client_ttft:?} vs logged {logged:?}: {line}"
    );
    // The gateway says how late it read the head: from before the body until the hold ended.
    let accept = ms(line, "accept_delay_ms");
    assert!(accept > Duration::from_millis(50), "{line}");
}

const FIRST: &[u8] = b"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
const SECOND: &[u8] = b"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" there\"}}]}\n\n";

/// A stream whose first token is ready at once; asked for the next frame, it holds the thread
/// (a preemption) before answering. The server polls a body for more before it writes what it
/// was handed, so the first token is handed on, then held, then written.
struct HeldAfterFirst {
    step: u8,
    hold: Duration,
}

impl http_body::Body for HeldAfterFirst {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        self.step += 1;
        let data: &'static [u8] = match self.step {
            1 => FIRST,
            2 => {
                std::thread::sleep(self.hold);
                SECOND
            }
            3 => b"data: [DONE]\n\n",
            _ => return std::task::Poll::Ready(None),
        };
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(bytes::Bytes::from_static(
            data,
        )))))
    }
}

/// The gateway is held between handing the first token's frame to the server and the write that
/// sends it: the record times the token when it was written, and says how late that was.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_frame_held_between_its_hand_off_and_its_write_is_timed_at_the_write() {
    use inferscope::meter::MeterLayer;
    let hold = Duration::from_millis(80);
    let records = common::meter::Collect::default();
    let service = tower::ServiceBuilder::new()
        .layer(MeterLayer::new(records.clone()))
        .service_fn(
            move |_req: http::Request<hyper::body::Incoming>| async move {
                let body = HeldAfterFirst { step: 0, hold };
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .header("content-type", "text/event-stream")
                        .body(body)
                        .unwrap(),
                )
            },
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(inferscope::server::run(
        listener,
        hyper_util::service::TowerToHyperService::new(service),
        inferscope::server::ServerOptions::default(),
        std::future::pending::<()>(),
    ));
    // The client on a thread of its own: it sees the first token when it is written.
    let client = std::thread::spawn(move || {
        use std::io::{Read as _, Write as _};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        let sent = std::time::Instant::now();
        s.write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}",
        )
        .unwrap();
        let mut got = Vec::new();
        let mut first = None;
        let mut buf = [0u8; 4096];
        while !got.ends_with(b"\r\n0\r\n\r\n") {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0);
            got.extend_from_slice(&buf[..n]);
            if first.is_none() && got.windows(4).any(|w| w == b"\"Hi\"") {
                first = Some(std::time::Instant::now() - sent);
            }
        }
        first.unwrap()
    });
    let client_ttft = tokio::task::spawn_blocking(move || client.join().unwrap())
        .await
        .unwrap();
    until(Duration::from_secs(5), "the record", || {
        let n = records.0.lock().len();
        async move { n == 1 }
    })
    .await;
    let r = std::sync::Arc::clone(&records.0.lock()[0]);
    let logged = r.ttft.unwrap();
    assert!(client_ttft >= hold, "the hold came first: {client_ttft:?}");
    // Before the write was the clock, the record said ~0 ms: the token was handed on at once.
    assert!(
        logged + Duration::from_millis(5) >= client_ttft && logged <= client_ttft,
        "client {client_ttft:?} vs logged {logged:?}"
    );
    let lag = r.handoff_lag.unwrap();
    assert!(lag >= hold - Duration::from_millis(5), "{lag:?}");
    assert!(r.forward_lag.unwrap() >= lag, "{r:?}");
}
