//! Where each request's time went: the engine's own span of the request (vLLM's `llm_request`,
//! here the simulator's, carrying its ground truth) received over OTLP on the admin listener,
//! joined to the gateway's record by trace id and parent span, and split into the gateway's
//! time, the engine's queue, prefill and decode, and the rest — parts that add up to the TTFT and
//! E2E the gateway measured. Requests held in the engine's queue far longer than their
//! neighbours are flagged starved and counted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use inferscope::sim::{self, Faults, SimOptions, SpanExport};
use serde_json::Value;
use std::collections::HashMap;
use std::time::Duration;
use tokio::net::TcpListener;

/// A simulator exporting its spans to `admin` every `delay` (`None`: no spans), on `listener`.
fn sim_with_spans(
    listener: TcpListener,
    admin: Option<std::net::SocketAddr>,
    faults: Faults,
) -> sim::SimHandle {
    let mut p = exact(30.0, 4.0);
    p.max_batch = Some(4);
    p.faults = faults;
    let mut opts = SimOptions::new(p);
    opts.record_truth = true;
    opts.spans = admin.map(|a| SpanExport {
        endpoint: format!("http://{a}/v1/traces").parse().unwrap(),
        delay: Duration::from_millis(100),
    });
    sim::spawn(listener, opts, std::future::pending()).unwrap()
}

fn ms_of(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The gateway starts before the simulator (which must know the admin address) and after its
/// listener is bound (the gateway must know the simulator's).
async fn gateway_for(
    addr: std::net::SocketAddr,
    dir: &std::path::Path,
    spans: &str,
) -> inferscope::app::Running {
    let yaml = format!(
        "access_log: {{ path: {:?} }}\n\
         backends:\n  - name: engine\n    url: \"http://{addr}\"\n    engine_spans: {spans}\n\
         routes:\n  - name: main\n    backends: [engine]\n",
        dir.join("access.jsonl"),
    );
    start_yaml(&yaml).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_spans_are_joined_their_parts_add_up_and_starved_requests_are_flagged() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dir = temp_dir();
    let gw = gateway_for(
        listener.local_addr().unwrap(),
        &dir,
        "{ wait: 5s, starved_min: 100ms }",
    )
    .await;
    // Every 8th request waits 400 ms more in the engine's queue.
    let faults = Faults {
        queue_hold_every: Some(8),
        queue_hold_ms: 400.0,
        ..Faults::default()
    };
    let sim = sim_with_spans(listener, Some(gw.admin_addr), faults);
    // Two clients, twelve requests each; every fourth not streamed.
    let mut clients = Vec::new();
    for c in 0..2 {
        let addr = gw.data_addr;
        clients.push(tokio::spawn(async move {
            for i in 0..12 {
                let stream = (c + i) % 4 != 0;
                chat_ok(addr, stream, 6).await;
            }
        }));
    }
    for c in clients {
        c.await.unwrap();
    }
    let admin = gw.admin_addr;
    until(
        Duration::from_secs(10),
        "every span joined",
        || async move {
            let (_, s) = admin_get(admin, "/stats").await;
            let s: Value = serde_json::from_str(&s).unwrap();
            s["rollups"]["all"]["cumulative"]["engine_spans"]["joined"] == 24
        },
    )
    .await;
    let (_, prom) = admin_get(admin, "/metrics").await;
    let starved_total: f64 = prom
        .lines()
        .filter(|l| l.starts_with("inferscope_starved_requests_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert_eq!(starved_total, 3.0, "{prom}");
    assert!(
        prom.contains("inferscope_engine_queue_seconds_count{"),
        "{prom}"
    );

    let truth: HashMap<String, sim::Truth> = sim
        .truth()
        .into_iter()
        .map(|t| (t.response_id.clone().unwrap(), t))
        .collect();
    let lines = stop_and_read_log(gw, &dir).await;
    assert_eq!(lines.len(), 24);
    let mut starved = Vec::new();
    for l in &lines {
        assert_eq!(l["engine_span"], "joined", "{l}");
        let id = l["response_id"].as_str().unwrap();
        assert_eq!(l["engine_request_id"], id, "{l}");
        let t = &truth[id];
        let e = t.engine().unwrap();
        // The engine's numbers are the simulator's truth (µs rounding of seconds as f64).
        for (field, d) in [
            ("engine_queue_ms", e.queue),
            ("engine_prefill_ms", e.prefill),
            ("engine_decode_ms", e.decode),
        ] {
            let got = ms_of(&l[field]);
            let want = d.as_secs_f64() * 1000.0;
            assert!((got - want).abs() <= 0.002, "{field}: {got} vs {want}: {l}");
        }
        // The parts add up to what the gateway measured; the rest (network, HTTP servers) is
        // never negative against a simulator whose times are inside the gateway's.
        let sum = |o: &Value| o.as_object().unwrap().values().map(ms_of).sum::<f64>();
        let e2e = &l["e2e_parts_ms"];
        assert!((sum(e2e) - ms_of(&l["e2e_ms"])).abs() <= 0.005, "{l}");
        assert!(ms_of(&e2e["rest"]) >= 0.0, "{l}");
        assert_eq!(ms_of(&e2e["gateway"]), ms_of(&l["overhead_ms"]), "{l}");
        if l["stream"] == true {
            let ttft = &l["ttft_parts_ms"];
            assert!((sum(ttft) - ms_of(&l["ttft_ms"])).abs() <= 0.004, "{l}");
            assert!(ms_of(&ttft["rest"]) >= 0.0, "{l}");
        } else {
            assert!(l.get("ttft_parts_ms").is_none(), "{l}");
        }
        if l["starved"] == true {
            starved.push(t.index);
        }
    }
    starved.sort_unstable();
    assert_eq!(starved, vec![7, 15, 23], "the held requests, and only they");
}

#[tokio::test]
async fn a_record_whose_span_never_comes_is_written_when_its_wait_ends() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dir = temp_dir();
    let gw = gateway_for(listener.local_addr().unwrap(), &dir, "{ wait: 300ms }").await;
    let _sim = sim_with_spans(listener, None, Faults::default());
    let log = dir.join("access.jsonl");
    // A request the engine refuses gets no span: its line does not wait for one.
    let refused = post(gw.data_addr, "/v1/chat/completions", "{not json", &[]).await;
    assert_eq!(refused.status, 400);
    chat_ok(gw.data_addr, true, 3).await;
    let sent = tokio::time::Instant::now();
    // Written after the wait, while the gateway runs (not at shutdown).
    until(Duration::from_secs(5), "the line written", || {
        let log = log.clone();
        async move {
            std::fs::read_to_string(&log).is_ok_and(|t| t.contains("\"engine_span\":\"missing\""))
        }
    })
    .await;
    assert!(sent.elapsed() >= Duration::from_millis(250));
    let (_, s) = admin_get(gw.admin_addr, "/stats").await;
    let s: Value = serde_json::from_str(&s).unwrap();
    let e = &s["rollups"]["all"]["cumulative"]["engine_spans"];
    assert_eq!(
        (e["joined"].as_u64(), e["missing"].as_u64()),
        (Some(0), Some(1)),
        "{s}"
    );
    let lines = stop_and_read_log(gw, &dir).await;
    assert_eq!(lines.len(), 2);
    assert_eq!(
        lines[0]["status"], 400,
        "the refused request's line came first"
    );
    assert!(lines[0].get("engine_span").is_none(), "{}", lines[0]);
    assert_eq!(lines[1]["engine_span"], "missing");
    assert!(lines[1].get("engine_queue_ms").is_none());
}

/// OTLP/gRPC, as vLLM exports by default (`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc`), from a real
/// gRPC client (tonic) over HTTP/2 without TLS, behind the admin token.
#[tokio::test]
async fn a_span_exported_over_grpc_is_joined_and_the_admin_token_guards_the_receiver() {
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{any_value::Value as V, AnyValue, KeyValue};
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    std::env::set_var("ENGINE_SPANS_TEST_TOKEN", "s3cret");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dir = temp_dir();
    let yaml = format!(
        "access_log: {{ path: {:?} }}\nadmin: {{ token_env: ENGINE_SPANS_TEST_TOKEN }}\n\
         backends:\n  - name: engine\n    url: \"http://{}\"\n    engine_spans: {{ wait: 20s }}\n\
         routes:\n  - name: main\n    backends: [engine]\n",
        dir.join("access.jsonl"),
        listener.local_addr().unwrap(),
    );
    let gw = start_yaml(&yaml).await;
    let sim = sim_with_spans(listener, None, Faults::default());
    chat_ok(gw.data_addr, true, 3).await;
    // The trace and parent the engine was given.
    let tp = sim.truth()[0].traceparent.clone().unwrap();
    let parts: Vec<&str> = tp.split('-').collect();
    assert_eq!(
        parts[3], "01",
        "an engine that sends spans is told the trace is sampled"
    );
    let hex = |s: &str| {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect::<Vec<u8>>()
    };
    let secs = |k: &str, v: f64| KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(V::DoubleValue(v)),
        }),
        ..Default::default()
    };
    let export = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans {
                spans: vec![Span {
                    trace_id: hex(parts[1]),
                    span_id: vec![1; 8],
                    parent_span_id: hex(parts[2]),
                    name: "llm_request".into(),
                    attributes: vec![
                        secs("gen_ai.latency.time_in_queue", 0.002),
                        secs("gen_ai.latency.time_in_model_prefill", 0.025),
                        secs("gen_ai.latency.time_in_model_decode", 0.007),
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let mut client = TraceServiceClient::connect(format!("http://{}", gw.admin_addr))
        .await
        .unwrap();
    let denied = client.export(export.clone()).await.unwrap_err();
    assert_eq!(denied.code(), tonic::Code::Unauthenticated, "{denied:?}");
    let mut req = tonic::Request::new(export);
    req.metadata_mut()
        .insert("authorization", "Bearer s3cret".parse().unwrap());
    client.export(req).await.unwrap();
    let lines = stop_and_read_log(gw, &dir).await;
    assert_eq!(lines.len(), 1);
    let l = &lines[0];
    assert_eq!(l["engine_span"], "joined", "{l}");
    assert_eq!(
        (ms_of(&l["engine_queue_ms"]), ms_of(&l["engine_decode_ms"])),
        (2.0, 7.0)
    );
    // Joined at once, not at the 20 s wait (nor at shutdown, which would mark it missing).
}
