//! Per-chunk cost of the data path (scan + classify + meter) and per-request cost of recording,
//! each next to a baseline measured in the same run: a bare `memchr` pass over the same bytes.
//!
//! Run: `cargo bench --bench data_path`. Results go to docs/performance.md (history in docs/perf-log/).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use http::Method;
use inferscope::accesslog::AccessLog;
use inferscope::dialect::{Dialect, Endpoint, StreamClassifier};
use inferscope::meter::{
    End, Framing, Held, ItlSample, MeasureOptions, Meter, MeterSettings, Metering, Outcome,
    RecordSink, RequestMeta, RequestRecord,
};
use inferscope::recorder::Recorder;
use inferscope::sse::SseScanner;
use inferscope::stats::Stats;
use inferscope::util::Ids;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// One vLLM-style content chunk (≈ 230 bytes), as one frame.
fn chunk(i: usize) -> Bytes {
    Bytes::from(format!(
        "data: {{\"id\":\"chatcmpl-b3f1c0e2a9d54\",\"object\":\"chat.completion.chunk\",\"created\":1764500000,\"model\":\"meta-llama/Llama-3.1-8B-Instruct\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" word{i}\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
    ))
}

/// A vLLM chat stream of `n` frames: role chunk, content chunks, finish, usage, `[DONE]`.
fn vllm_stream(n: usize) -> Vec<Bytes> {
    let head = r#"data: {"id":"chatcmpl-b3f1c0e2a9d54","object":"chat.completion.chunk","created":1764500000,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"#;
    let mut out = vec![Bytes::from(format!(
        "{head}\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
    ))];
    for i in 1..n.saturating_sub(3) {
        let text = if i % 8 == 0 {
            "\\n".to_string()
        } else {
            format!(" word{i}")
        };
        out.push(Bytes::from(format!(
            "{head}\"delta\":{{\"content\":\"{text}\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
        )));
    }
    out.push(Bytes::from(format!(
        "{head}\"delta\":{{\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}}]}}\n\n"
    )));
    out.push(Bytes::from_static(b"data: {\"id\":\"chatcmpl-b3f1c0e2a9d54\",\"object\":\"chat.completion.chunk\",\"created\":1764500000,\"model\":\"meta-llama/Llama-3.1-8B-Instruct\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"total_tokens\":268,\"completion_tokens\":256}}\n\n"));
    out.push(Bytes::from_static(b"data: [DONE]\n\n"));
    out
}

fn meta() -> RequestMeta {
    let mut m = RequestMeta::new(Method::POST, "/v1/chat/completions");
    m.route = Arc::from("chat");
    m.model = Arc::from("llama");
    m.backend = Arc::from("fp16");
    m.stream = true;
    m.t_sent = Some(Instant::now());
    m
}

/// A meter for a classified SSE stream, as the proxy makes for chat completions.
fn sse_meter(metering: &Arc<Metering>) -> Meter {
    let mut opts = MeasureOptions::default();
    opts.dialect = Some(Dialect::OpenAi);
    Meter::new(
        meta(),
        200,
        Framing::Sse(SseScanner::default()),
        opts,
        Arc::clone(metering),
        Held::default(),
    )
}

/// The gateway's sinks (stats, experiments; log and telemetry off) behind a metering.
fn metering() -> Arc<Metering> {
    let recorder = Arc::new(Recorder::new(Stats::new(64), AccessLog::disabled(), None));
    Metering::new(recorder, Arc::new(Ids::default()), MeterSettings::default())
}

const CHUNKS: usize = 256;

fn per_chunk(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let frames: Vec<Bytes> = (0..CHUNKS).map(chunk).collect();
    let metering = metering();

    let mut g = c.benchmark_group("per_chunk");
    g.throughput(Throughput::Elements(CHUNKS as u64));
    g.bench_function("baseline_memchr_newlines", |b| {
        b.iter(|| {
            let mut n = 0;
            for f in &frames {
                n += memchr::memchr_iter(b'\n', f).count();
            }
            black_box(n)
        })
    });
    g.bench_function("sse_scan_only", |b| {
        b.iter(|| {
            let mut s = SseScanner::default();
            let mut n = 0;
            for f in &frames {
                s.feed(f, |e| n += e.data.len());
            }
            black_box(n)
        })
    });
    // The classification alone, each event read in full by serde (what every chunk cost before
    // the fast path) and through a stream's learned shape.
    let datas: Vec<&[u8]> = frames
        .iter()
        .map(|f| f.strip_prefix(b"data: ").unwrap().trim_ascii())
        .collect();
    g.bench_function("classify_full", |b| {
        b.iter(|| {
            for d in &datas {
                black_box(Dialect::OpenAi.classify(d));
            }
        })
    });
    g.bench_function("classify_stream", |b| {
        b.iter(|| {
            let mut c = StreamClassifier::new(Dialect::OpenAi);
            for d in &datas {
                black_box(c.classify(d));
            }
        })
    });
    // A whole vLLM stream as it comes: the role chunk, content (one chunk in eight with an
    // escaped newline), the finish chunk, the usage chunk, `[DONE]`.
    let vllm: Vec<Bytes> = vllm_stream(CHUNKS);
    g.bench_function("scan_classify_meter_vllm_stream", |b| {
        b.iter(|| {
            let mut m = sse_meter(&metering);
            let now = Instant::now();
            for f in &vllm {
                black_box(m.observe(f, now));
            }
            black_box(&m);
        })
    });
    g.bench_function("scan_classify_meter", |b| {
        b.iter(|| {
            let mut m = sse_meter(&metering);
            let now = Instant::now();
            for f in &frames {
                black_box(m.observe(f, now));
            }
            black_box(&m);
        })
    });
    g.finish();
}

fn record_path(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let recorder = Recorder::new(Stats::new(64), AccessLog::disabled(), None);
    let mut record = RequestRecord::without_body(meta(), 200, Outcome::Ok, None, 15_000);
    record.ttft = Some(Duration::from_millis(120));
    record.ttfc = Some(Duration::from_millis(3));
    record.tpot = Some(Duration::from_millis(21));
    record.e2e = Duration::from_millis(1500);
    record.upstream_ttft = Some(Duration::from_millis(119));
    record.overhead = Some(Duration::from_micros(80));
    record.itl = (0..64)
        .map(|i| ItlSample::new(Duration::from_micros(20_000 + i * 37), 1))
        .collect();
    record.input_tokens = Some(100);
    record.output_tokens = Some(64);
    let mut g = c.benchmark_group("per_request");
    g.bench_function("record_64_token_stream", |b| {
        b.iter(|| {
            recorder.record(&Arc::new(black_box(record.clone())));
        })
    });
    // The request inspector on a chat body, short and long (a 32 KiB prompt in 8 messages),
    // beside what it did before: the whole body parsed into a `serde_json::Value`.
    let chat = |words: usize| {
        let text = vec!["word"; words].join(" ");
        let msgs: Vec<String> = (0..8)
            .map(|i| {
                format!(
                    r#"{{"role":"{}","content":"{text}\n"}}"#,
                    ["user", "assistant"][i % 2]
                )
            })
            .collect();
        Bytes::from(format!(
            r#"{{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{}],"stream":true,"max_tokens":256,"temperature":0.7,"user":"alice"}}"#,
            msgs.join(",")
        ))
    };
    for (name, body) in [("short", chat(2)), ("32k", chat(820))] {
        g.bench_function(format!("inspect_body_{name}"), |b| {
            b.iter(|| {
                black_box(
                    inferscope::proxy::prepare_body(body.clone(), Endpoint::ChatCompletions, None)
                        .unwrap(),
                )
            })
        });
        g.bench_function(format!("inspect_body_{name}_as_value"), |b| {
            b.iter(|| black_box(serde_json::from_slice::<serde_json::Value>(&body).unwrap()))
        });
    }
    g.bench_function("finish_meter_64_chunks", |b| {
        let frames: Vec<Bytes> = (0..64).map(chunk).collect();
        let shared = metering();
        b.iter(|| {
            let mut m = sse_meter(&shared);
            let now = Instant::now();
            for f in &frames {
                m.observe(f, now);
            }
            Box::new(m).finish(End::Complete);
        })
    });
    g.finish();
}

/// One scrape of 16 groups (4 variants × 4 backends, 2,000 requests each): the text exposition,
/// the protobuf one with native histograms, and the `/stats?format=hdr` export, side by side.
fn scrape(c: &mut Criterion) {
    use inferscope::util::prometheus::Writer;
    let stats = Stats::new(64);
    let mut n = 0u64;
    for v in 0..4 {
        for b in 0..4 {
            for i in 0..2000u64 {
                n = n
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let mut m = meta();
                m.variant = Arc::from(format!("v{v}").as_str());
                m.backend = Arc::from(format!("b{b}").as_str());
                let mut r = RequestRecord::without_body(m, 200, Outcome::Ok, None, 0);
                r.ttft = Some(Duration::from_micros(20_000 + (n >> 40) % 200_000));
                r.tpot = Some(Duration::from_micros(10_000 + (n >> 30) % 20_000));
                r.e2e = Duration::from_micros(500_000 + i * 97);
                r.itl = (0..16)
                    .map(|k| ItlSample::new(Duration::from_micros(9_000 + (n >> k) % 30_000), 1))
                    .collect();
                stats.record(&r);
            }
        }
    }
    let snap = stats.snapshot();
    let mut g = c.benchmark_group("scrape_16_groups");
    g.bench_function("text", |b| {
        b.iter(|| {
            let mut w = Writer::new();
            inferscope::stats::write_prometheus(&mut w, black_box(&snap), &[]);
            w.into_body().1.len()
        })
    });
    g.bench_function("protobuf_native", |b| {
        b.iter(|| {
            let mut w = Writer::protobuf();
            inferscope::stats::write_prometheus(&mut w, black_box(&snap), &[]);
            w.into_body().1.len()
        })
    });
    g.bench_function("hdr_export", |b| {
        b.iter(|| {
            serde_json::to_string(&inferscope::stats::hdr::export(black_box(&snap)))
                .map_or(0, |s| s.len())
        })
    });
    g.finish();
    let size = |proto: bool| {
        let mut w = if proto {
            Writer::protobuf()
        } else {
            Writer::new()
        };
        inferscope::stats::write_prometheus(&mut w, &snap, &[]);
        w.into_body().1.len()
    };
    println!(
        "scrape bytes: text {}, protobuf+native {}, hdr export {}",
        size(false),
        size(true),
        serde_json::to_string(&inferscope::stats::hdr::export(&snap)).map_or(0, |s| s.len())
    );
}

criterion_group!(benches, per_chunk, record_path, scrape);
criterion_main!(benches);
