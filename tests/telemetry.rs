//! OpenTelemetry export against real OTLP receivers (gRPC and HTTP/protobuf): the span tree, its
//! names and kinds, attribute values equal to what the access log and `/stats` report, trace
//! context continued from the client and passed to the backend, metrics, opt-in content, and a
//! dead collector that costs the data path nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::otlp::*;
use common::*;
use inferscope::stats::TTFT_BOUNDS;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

fn yaml(dir: &std::path::Path, sim: SocketAddr, telemetry: &str) -> String {
    format!(
        "access_log: {{ path: {:?} }}\nbackends:\n  - {{ name: sim, url: \"http://{sim}\", provider: vllm }}\nroutes:\n  - {{ name: chat, backends: [sim] }}\ntelemetry:\n{telemetry}",
        dir.join("access.jsonl")
    )
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

async fn spans_match_the_log(protocol: &str) {
    let (addr, collected) = if protocol == "grpc" {
        start_grpc().await
    } else {
        start_http().await
    };
    let sim = start_sim(exact(20.0, 5.0), 1).await;
    let dir = temp_dir();
    let telemetry = format!(
        "  otlp: {{ endpoint: \"http://{addr}\", protocol: {protocol}, headers: {{ authorization: \"Bearer t0k\" }}, timeout: 5s }}\n  service_name: gw-test\n  resource: {{ deployment.environment: test }}\n  batch: {{ interval: 50ms }}\n  metrics_interval: 60s\n"
    );
    let gw = start_yaml(&yaml(&dir, sim.addr, &telemetry)).await;
    let tp = format!("00-{TRACE}-{PARENT}-01");
    let r = post(
        gw.data_addr,
        "/v1/chat/completions",
        &chat(true, 6, r#","temperature":0.5"#),
        &[("traceparent", &tp)],
    )
    .await;
    assert_eq!(r.status, 200);
    let (_, stats) = admin_get(gw.admin_addr, "/stats").await;
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    let log = stop_and_read_log(gw, &dir).await;
    let line = &log[0];
    assert_eq!(
        line["trace_id"], TRACE,
        "the access log's trace is the client's trace"
    );

    let spans = collected.spans();
    assert_eq!(spans.len(), 2, "one SERVER span and one CLIENT span");
    let (res, server) = spans
        .iter()
        .find(|(_, s)| s.kind == SpanKind::Server as i32)
        .unwrap()
        .clone();
    let (_, client) = spans
        .iter()
        .find(|(_, s)| s.kind == SpanKind::Client as i32)
        .unwrap()
        .clone();
    assert_eq!(attr_str(&res, "service.name").as_deref(), Some("gw-test"));
    assert_eq!(
        attr_str(&res, "deployment.environment").as_deref(),
        Some("test")
    );
    assert_eq!(hex(&server.trace_id), TRACE);
    assert_eq!(hex(&client.trace_id), TRACE);
    assert_eq!(
        hex(&server.parent_span_id),
        PARENT,
        "the SERVER span continues the client's span"
    );
    assert_eq!(
        client.parent_span_id, server.span_id,
        "the CLIENT span is the SERVER span's child"
    );
    assert_eq!(server.name, "POST /v1/chat/completions");
    assert_eq!(client.name, "chat demo");

    // The backend joined the trace under the CLIENT span.
    let t = sim.truth().remove(0);
    assert_eq!(
        t.traceparent,
        Some(format!("00-{TRACE}-{}-01", hex(&client.span_id)))
    );

    let a = &client.attributes;
    assert_eq!(
        attr_str(a, "gen_ai.operation.name").as_deref(),
        Some("chat")
    );
    assert_eq!(attr_str(a, "gen_ai.provider.name").as_deref(), Some("vllm"));
    assert_eq!(
        attr_str(a, "gen_ai.system").as_deref(),
        Some("vllm"),
        "semconv 1.36 name too, by default"
    );
    assert_eq!(attr_str(a, "gen_ai.request.model").as_deref(), Some("demo"));
    assert_eq!(
        attr_str(a, "gen_ai.response.model").as_deref(),
        Some("demo")
    );
    assert_eq!(
        attr_str(a, "gen_ai.response.id").as_deref(),
        Some("chatcmpl-sim-0")
    );
    assert_eq!(attr_i64(a, "gen_ai.request.max_tokens"), Some(6));
    assert_eq!(attr_f64(a, "gen_ai.request.temperature"), Some(0.5));
    assert_eq!(
        attr_i64(a, "gen_ai.usage.output_tokens"),
        line["output_tokens"].as_i64()
    );
    assert_eq!(
        attr_i64(a, "gen_ai.usage.input_tokens"),
        line["input_tokens"].as_i64()
    );
    assert_eq!(attr_i64(a, "server.port"), Some(i64::from(sim.addr.port())));
    assert_eq!(attr_str(a, "inferscope.outcome").as_deref(), Some("ok"));
    assert_eq!(
        attr_str(a, "inferscope.tokens_source").as_deref(),
        Some("usage")
    );
    match attr(a, "gen_ai.response.finish_reasons") {
        Some(opentelemetry_proto::tonic::common::v1::any_value::Value::ArrayValue(v)) => {
            assert_eq!(v.values.len(), 1)
        }
        other => panic!("finish_reasons: {other:?}"),
    }
    // Same measurement, different units: seconds on the span, milliseconds (µs precision) in the log.
    for (attr_name, log_key) in [
        ("inferscope.ttft", "ttft_ms"),
        ("inferscope.tpot", "tpot_ms"),
        ("gen_ai.response.time_to_first_chunk", "ttfc_ms"),
        ("inferscope.e2e", "e2e_ms"),
        ("inferscope.upstream_ttft", "upstream_ttft_ms"),
    ] {
        let span_s = attr_f64(a, attr_name).unwrap_or_else(|| panic!("{attr_name} missing"));
        let log_ms = line[log_key].as_f64().unwrap();
        assert!(
            (span_s * 1000.0 - log_ms).abs() < 0.002,
            "{attr_name}: {span_s} s vs {log_ms} ms"
        );
    }
    let stats_ttft = stats["groups"][0]["cumulative"]["ttft"]["p50"]
        .as_f64()
        .unwrap();
    let span_ttft_ms = attr_f64(a, "inferscope.ttft").unwrap() * 1000.0;
    assert!(
        (stats_ttft - span_ttft_ms).abs() <= span_ttft_ms * 0.001 + 0.002,
        "/stats {stats_ttft} vs span {span_ttft_ms}"
    );
    assert_eq!(
        attr_i64(a, "inferscope.itl.count"),
        line["itl_ms"]["count"].as_i64()
    );

    // Real times: the server span lasts the whole stream; the client span starts at the upstream
    // send; the first-token event sits at TTFT.
    let e2e_ns = (line["e2e_ms"].as_f64().unwrap() * 1e6) as i128;
    let server_ns = i128::from(server.end_time_unix_nano) - i128::from(server.start_time_unix_nano);
    assert!(
        (server_ns - e2e_ns).abs() < 2_000,
        "server span {server_ns} ns vs e2e {e2e_ns} ns"
    );
    assert!(client.start_time_unix_nano >= server.start_time_unix_nano);
    assert_eq!(client.end_time_unix_nano, server.end_time_unix_nano);
    let ev = client
        .events
        .iter()
        .find(|e| e.name == "inferscope.first_token")
        .expect("first-token event");
    let ttft_ns = (line["ttft_ms"].as_f64().unwrap() * 1e6) as i128;
    assert!(
        (i128::from(ev.time_unix_nano) - i128::from(server.start_time_unix_nano) - ttft_ns).abs()
            < 2_000
    );

    // Content is never recorded unless opted in.
    assert!(
        attr(a, "gen_ai.input.messages").is_none() && attr(a, "gen_ai.output.messages").is_none()
    );
    assert!(collected
        .auth
        .lock()
        .unwrap()
        .iter()
        .all(|h| h.as_deref() == Some("Bearer t0k")));

    // Metrics, flushed at shutdown, with the conventions' bucket boundaries.
    let ttft = collected.metric("gen_ai.server.time_to_first_token");
    let hist = ttft.iter().find_map(|m| match &m.data {
        Some(opentelemetry_proto::tonic::metrics::v1::metric::Data::Histogram(h)) => {
            h.data_points.first().cloned()
        }
        _ => None,
    });
    let hist = hist.expect("a TTFT histogram point");
    assert_eq!(hist.count, 1);
    assert_eq!(hist.explicit_bounds, TTFT_BOUNDS.to_vec());
    assert!((hist.sum.unwrap() * 1000.0 - line["ttft_ms"].as_f64().unwrap()).abs() < 0.002);
    let pt_attrs = &hist.attributes;
    assert_eq!(
        attr_str(pt_attrs, "gen_ai.request.model").as_deref(),
        Some("demo")
    );
    assert_eq!(
        attr_str(pt_attrs, "inferscope.backend").as_deref(),
        Some("sim")
    );
    assert!(!collected.metric("gen_ai.client.token.usage").is_empty());
    assert!(!collected
        .metric("gen_ai.server.request.duration")
        .is_empty());
    assert!(!collected
        .metric("gen_ai.server.time_per_output_token")
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_grpc_spans_and_metrics() {
    spans_match_the_log("grpc").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_http_protobuf_spans_and_metrics() {
    spans_match_the_log("http/protobuf").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_is_captured_only_when_opted_in_and_new_traces_start_here() {
    let (addr, collected) = start_http().await;
    let sim = start_sim(exact(5.0, 2.0), 2).await;
    let dir = temp_dir();
    let telemetry = format!("  otlp: {{ endpoint: \"http://{addr}\", protocol: http/protobuf }}\n  capture_content: true\n  format: openinference\n");
    let gw = start_yaml(&yaml(&dir, sim.addr, &telemetry)).await;
    let r = post(
        gw.data_addr,
        "/v1/chat/completions",
        &chat(true, 4, ""),
        &[],
    )
    .await;
    assert_eq!(r.status, 200);
    let log = stop_and_read_log(gw, &dir).await;
    let spans = collected.spans();
    let (_, client) = spans
        .iter()
        .find(|(_, s)| s.kind == SpanKind::Client as i32)
        .unwrap();
    let trace = hex(&client.trace_id);
    assert_eq!(
        log[0]["trace_id"],
        trace.as_str(),
        "a new trace, the one logged"
    );
    let t = sim.truth().remove(0);
    assert!(t
        .traceparent
        .as_deref()
        .is_some_and(|tp| tp.starts_with(&format!("00-{trace}-"))));
    let input = attr_str(&client.attributes, "gen_ai.input.messages").expect("input captured");
    assert!(input.contains("say something short"), "{input}");
    let output = attr_str(&client.attributes, "gen_ai.output.messages").expect("output captured");
    // The words the simulator generated, in order, are the captured output.
    let body = String::from_utf8(t.bytes).unwrap();
    let words: String = body
        .split("\"content\":\"")
        .skip(2) // the role chunk's empty content, then each token
        .map(|s| s.split('"').next().unwrap_or(""))
        .collect();
    assert!(output.contains(&words), "{output} should contain {words:?}");
    assert_eq!(
        attr_str(&client.attributes, "openinference.span.kind").as_deref(),
        Some("LLM")
    );
    assert_eq!(
        attr_i64(&client.attributes, "llm.token_count.completion"),
        Some(4)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_collector_costs_the_data_path_nothing() {
    let dead = common::DEAD;
    let sim = start_sim(exact(5.0, 2.0), 3).await;
    let dir = temp_dir();
    let telemetry = format!("  otlp: {{ endpoint: \"http://{dead}\", protocol: grpc, timeout: 300ms }}\n  batch: {{ interval: 20ms, max_batch: 2 }}\n");
    let gw = start_yaml(&yaml(&dir, sim.addr, &telemetry)).await;
    for _ in 0..5 {
        let r = post(
            gw.data_addr,
            "/v1/chat/completions",
            &chat(true, 3, ""),
            &[],
        )
        .await;
        assert_eq!(r.status, 200);
        assert!(r.body().ends_with(b"data: [DONE]\n\n"));
    }
    let recorder = std::sync::Arc::clone(&gw.recorder);
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 5);
    assert!(log.iter().all(|l| l["outcome"] == "ok"));
    let c = &recorder.telemetry.as_ref().unwrap().counters;
    assert!(
        c.span_export_failures.load(Ordering::Relaxed) >= 1,
        "failures are counted"
    );
    assert_eq!(c.spans_exported.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histograms_export_as_base2_exponential_on_request() {
    let sim = start_sim(exact(20.0, 2.0), 1).await;
    let (otlp, collected) = start_grpc().await;
    let dir = temp_dir();
    let telemetry = format!(
        "  otlp: {{ endpoint: \"http://{otlp}\", protocol: grpc, timeout: 5s }}\n  metrics_interval: 60s\n  histograms: exponential\n"
    );
    let gw = start_yaml(&yaml(&dir, sim.addr, &telemetry)).await;
    for _ in 0..5 {
        let r = post(
            gw.data_addr,
            "/v1/chat/completions",
            &chat(true, 4, ""),
            &[],
        )
        .await;
        assert_eq!(r.status, 200);
    }
    let log = stop_and_read_log(gw, &dir).await;
    use opentelemetry_proto::tonic::metrics::v1::metric::Data;
    let ttft = collected.metric("gen_ai.server.time_to_first_token");
    assert!(
        !ttft
            .iter()
            .any(|m| matches!(m.data, Some(Data::Histogram(_)))),
        "no explicit-bucket TTFT histogram"
    );
    let p = ttft
        .iter()
        .find_map(|m| match &m.data {
            Some(Data::ExponentialHistogram(h)) => h.data_points.first().cloned(),
            _ => None,
        })
        .expect("an exponential TTFT histogram point");
    assert_eq!(p.count, 5);
    // Bucket i of scale s holds (base^i, base^(i+1)] with base = 2^(2^-s): every logged TTFT
    // lies in the populated range, and the resolution is fine (few samples: a high scale).
    let base = 2f64.powf(2f64.powi(-p.scale));
    let pos = p.positive.clone().expect("positive buckets");
    let lo = base.powi(pos.offset);
    let hi = base.powi(pos.offset + pos.bucket_counts.len() as i32);
    assert_eq!(pos.bucket_counts.iter().sum::<u64>(), 5);
    for l in &log {
        let s = l["ttft_ms"].as_f64().unwrap() / 1000.0;
        assert!(
            lo * 0.999 < s && s <= hi * 1.001,
            "{s} outside ({lo}, {hi}]"
        );
    }
    assert!(p.scale >= 5, "scale {}", p.scale);
    assert!(p.min.unwrap() > 0.019 && p.max.unwrap() < 1.0, "{p:?}");
}

/// Every access-log line arrives as an OTLP log record with the line's fields as attributes and
/// the request's trace ids, over both protocols.
async fn access_log_as_log_records(protocol: &str) {
    let sim = start_sim(exact(5.0, 1.0), 1).await;
    let (otlp, collected) = if protocol == "grpc" {
        start_grpc().await
    } else {
        start_http().await
    };
    let dir = temp_dir();
    let telemetry = format!(
        "  otlp: {{ endpoint: \"http://{otlp}\", protocol: {protocol}, timeout: 5s }}\n  export_metrics: false\n  export_logs: true\n  batch: {{ interval: 50ms }}\n"
    );
    let gw = start_yaml(&yaml(&dir, sim.addr, &telemetry)).await;
    for stream in [true, false, true] {
        let r = post(
            gw.data_addr,
            "/v1/chat/completions",
            &chat(stream, 3, ""),
            &[],
        )
        .await;
        assert_eq!(r.status, 200);
    }
    let r = post(gw.data_addr, "/v1/nowhere", "{}", &[]).await;
    assert_eq!(r.status, 404);
    let log = stop_and_read_log(gw, &dir).await;
    let records = collected.log_records();
    assert_eq!(records.len(), log.len(), "one record per access-log line");
    for line in &log {
        let id = line["request_id"].as_str().unwrap();
        let rec = records
            .iter()
            .find(|r| attr_str(&r.attributes, "request_id").as_deref() == Some(id))
            .unwrap_or_else(|| panic!("no record for {id}"));
        assert_eq!(rec.event_name, "inferscope.access");
        assert_eq!(hex(&rec.trace_id), line["trace_id"].as_str().unwrap());
        for key in ["route", "backend", "outcome", "path", "clock"] {
            assert_eq!(
                attr_str(&rec.attributes, key).as_deref(),
                line[key].as_str(),
                "{key}"
            );
        }
        assert_eq!(attr_i64(&rec.attributes, "status"), line["status"].as_i64());
        match line["ttft_ms"].as_f64() {
            Some(ms) => assert_eq!(attr_f64(&rec.attributes, "ttft_ms"), Some(ms)),
            None => assert!(attr(&rec.attributes, "ttft_ms").is_none()),
        }
        let ok = line["outcome"] == "ok";
        assert_eq!(rec.severity_text, if ok { "INFO" } else { "WARN" });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_log_as_otlp_log_records_grpc() {
    access_log_as_log_records("grpc").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_log_as_otlp_log_records_http() {
    access_log_as_log_records("http/protobuf").await;
}
