//! Every dialect, event by event: documented streams (tests/fixtures/dialects/) measured the same
//! however the bytes are cut, and the simulator speaking each dialect through the gateway,
//! measured against its ground truth.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::meter::{measure, Seen};
use common::*;
use inferscope::dialect::Dialect;
use inferscope::sim::ChunkKind;
use serde_json::Value;
use std::time::Duration;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/fixtures/dialects/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

/// Measures `input` whole, then cut in two at every offset and in three at many: every cut
/// must give the same record, each event measured once (the events' instants differ by cut, the
/// counts must not). Returns the record of the whole.
fn every_split(path: &str, ctype: &str, input: &[u8]) -> Seen {
    let whole = measure(path, ctype, &[input]);
    // Cut into one piece per byte, every event is completed by its own frame.
    let bytes: Vec<&[u8]> = input.chunks(1).collect();
    let fine = measure(path, ctype, &bytes);
    for i in 0..=input.len() {
        let two = measure(path, ctype, &[&input[..i], &input[i..]]);
        assert_eq!(
            (two.output_tokens, &two.finish, two.outcome, &two.content),
            (
                whole.output_tokens,
                &whole.finish,
                whole.outcome,
                &whole.content
            ),
            "{path}: split at {i}"
        );
        assert_eq!(
            (
                &two.tokens_source,
                &two.event_tokens,
                two.input_tokens,
                &two.engine,
                &two.id
            ),
            (
                &whole.tokens_source,
                &whole.event_tokens,
                whole.input_tokens,
                &whole.engine,
                &whole.id
            ),
            "{path}: split at {i}"
        );
        for j in (i..=input.len()).step_by(13) {
            let three = measure(path, ctype, &[&input[..i], &input[i..j], &input[j..]]);
            assert_eq!(
                (
                    three.output_tokens,
                    &three.finish,
                    three.outcome,
                    three.malformed
                ),
                (
                    whole.output_tokens,
                    &whole.finish,
                    whole.outcome,
                    whole.malformed
                ),
                "{path}: split at {i},{j}"
            );
        }
    }
    assert_eq!(fine, whole, "{path}: byte by byte");
    whole
}

const SSE: &str = "text/event-stream";

#[test]
fn anthropic_messages_stream() {
    let s = every_split("/v1/messages", SSE, &fixture("anthropic.sse"));
    assert_eq!((s.outcome, s.error), ("ok", None));
    assert_eq!(s.output_events, 2);
    assert_eq!((s.output_tokens, s.input_tokens), (Some(15), Some(25)));
    assert_eq!(
        (s.tokens_source, s.event_tokens),
        (Some("usage"), Some("derived"))
    );
    assert_eq!(s.finish.as_deref(), Some("stop"), "end_turn is a stop");
    assert_eq!(
        s.id.as_deref(),
        Some("msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY")
    );
    assert_eq!(s.model.as_deref(), Some("claude-opus-4-1"));
    assert_eq!(s.content.as_deref(), Some("Hello! How can I\u{a0}help?"));
    assert_eq!(s.malformed, 0);
}

#[test]
fn openai_responses_stream() {
    let s = every_split("/v1/responses", SSE, &fixture("responses.sse"));
    assert_eq!((s.outcome, s.output_events), ("ok", 3));
    assert_eq!((s.output_tokens, s.input_tokens), (Some(11), Some(37)));
    assert_eq!(
        (s.tokens_source, s.event_tokens),
        (Some("usage"), Some("derived"))
    );
    assert_eq!(s.finish.as_deref(), Some("stop"));
    assert_eq!(
        s.id.as_deref(),
        Some("resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654")
    );
    assert_eq!(s.content.as_deref(), Some("Hi there!"));
}

#[test]
fn tgi_generate_stream_counts_each_token_event() {
    let s = every_split("/generate_stream", SSE, &fixture("tgi.sse"));
    assert_eq!((s.outcome, s.output_events), ("ok", 4));
    assert_eq!((s.output_tokens, s.input_tokens), (Some(4), Some(6)));
    assert_eq!(
        (s.tokens_source, s.event_tokens),
        (Some("usage"), Some("exact"))
    );
    assert_eq!(s.finish.as_deref(), Some("length"));
    assert_eq!(s.content.as_deref(), Some(" What is deep learning"));
    // Without `details`: the events alone count the tokens, the EOS token included.
    let s = every_split("/generate_stream", SSE, &fixture("tgi-no-details.sse"));
    assert_eq!(
        (s.outcome, s.output_tokens, s.input_tokens),
        ("ok", Some(3), None)
    );
    assert_eq!(
        (s.tokens_source, s.event_tokens),
        (Some("events"), Some("exact"))
    );
    assert_eq!(
        s.content.as_deref(),
        Some(" Deep learning"),
        "special tokens are not text"
    );
}

#[test]
fn ollama_ndjson_with_engine_timings() {
    let s = every_split(
        "/api/chat",
        "application/x-ndjson",
        &fixture("ollama-chat.ndjson"),
    );
    assert_eq!((s.outcome, s.output_events), ("ok", 3));
    assert_eq!((s.output_tokens, s.input_tokens), (Some(4), Some(26)));
    assert_eq!(
        (s.tokens_source, s.event_tokens),
        (Some("usage"), Some("derived"))
    );
    assert_eq!(s.finish.as_deref(), Some("stop"));
    assert_eq!(
        s.engine,
        Some((
            Some(Duration::from_nanos(342_546_000)),
            Some(Duration::from_nanos(4_535_599_000))
        ))
    );
    assert_eq!(s.content.as_deref(), Some("The sky is blue"));
}

#[test]
fn llamacpp_completion_with_timings() {
    let s = every_split("/completion", SSE, &fixture("llamacpp.sse"));
    assert_eq!((s.outcome, s.output_events), ("ok", 2));
    assert_eq!((s.output_tokens, s.input_tokens), (Some(2), Some(5)));
    assert_eq!(s.finish.as_deref(), Some("length"), "stop_type limit");
    assert_eq!(
        s.engine,
        Some((
            Some(Duration::from_micros(25_412)),
            Some(Duration::from_micros(31_500))
        ))
    );
    assert_eq!(s.model.as_deref(), Some("gpt-3.5-turbo"));
}

#[test]
fn vllm_token_ids_make_per_event_counts_exact() {
    let s = every_split("/v1/chat/completions", SSE, &fixture("vllm-token-ids.sse"));
    assert_eq!((s.outcome, s.output_events), ("ok", 2));
    assert_eq!(s.output_tokens, Some(3));
    assert_eq!(
        (s.tokens_source, s.event_tokens),
        (Some("events"), Some("exact"))
    );
}

/// A stream cut before its terminal event is truncated, in every dialect.
#[test]
fn a_stream_without_its_terminal_event_is_truncated() {
    for (path, name, ctype) in [
        ("/v1/messages", "anthropic.sse", SSE),
        ("/v1/responses", "responses.sse", SSE),
        ("/generate_stream", "tgi.sse", SSE),
        ("/api/chat", "ollama-chat.ndjson", "application/x-ndjson"),
        ("/completion", "llamacpp.sse", SSE),
        ("/v1/chat/completions", "vllm-token-ids.sse", SSE),
    ] {
        let f = fixture(name);
        let sep: &[u8] = if ctype == SSE { b"\n\n" } else { b"\n" };
        // Drop the last event: everything up to the separator before it.
        let body = &f[..f.len() - sep.len()];
        let cut = body
            .windows(sep.len())
            .rposition(|w| w == sep)
            .map_or(0, |p| p + sep.len());
        let s = measure(path, ctype, &[&f[..cut]]);
        assert_eq!(
            (s.outcome, s.error),
            ("truncated", Some("no_terminal_event")),
            "{path}"
        );
    }
}

/// Each dialect's classifier never panics on cut, mangled or foreign events.
#[test]
fn classifiers_take_any_event() {
    let events: Vec<Vec<u8>> = ["anthropic.sse", "responses.sse", "tgi.sse", "llamacpp.sse"]
        .iter()
        .flat_map(|n| {
            fixture(n)
                .split(|b| *b == b'\n')
                .map(|l| l.strip_prefix(b"data:").unwrap_or(l).to_vec())
                .collect::<Vec<_>>()
        })
        .chain(
            fixture("ollama-chat.ndjson")
                .split(|b| *b == b'\n')
                .map(<[u8]>::to_vec),
        )
        .collect();
    for d in Dialect::ALL {
        for e in &events {
            for cut in 0..e.len() {
                let _ = d.classify(&e[..cut]);
                let mut s = String::new();
                d.append_content(&e[..cut], &mut s, 8);
                assert!(s.len() <= 8);
            }
        }
    }
}

// ---- the simulator speaking each dialect, through the gateway ----

struct Case {
    path: &'static str,
    body: &'static str,
    /// What the record must say of tokens.
    tokens_source: &'static str,
    event_tokens: &'static str,
    /// The record has the prompt's count and the finish reason.
    input: bool,
    /// The record has the engine's own timings.
    engine: bool,
}

const MAX: u64 = 8;

fn cases() -> Vec<Case> {
    vec![
        Case {
            path: "/v1/messages",
            body: r#"{"model":"demo","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"say something short"}]}"#,
            tokens_source: "usage",
            event_tokens: "derived",
            input: true,
            engine: false,
        },
        Case {
            path: "/v1/responses",
            body: r#"{"model":"demo","max_output_tokens":8,"stream":true,"input":"say something short"}"#,
            tokens_source: "usage",
            event_tokens: "derived",
            input: true,
            engine: false,
        },
        Case {
            path: "/generate_stream",
            body: r#"{"inputs":"say something short","parameters":{"max_new_tokens":8,"details":true}}"#,
            tokens_source: "usage",
            event_tokens: "exact",
            input: true,
            engine: false,
        },
        Case {
            path: "/generate_stream",
            body: r#"{"inputs":"say something short","parameters":{"max_new_tokens":8}}"#,
            tokens_source: "events",
            event_tokens: "exact",
            input: false,
            engine: false,
        },
        Case {
            path: "/api/chat",
            body: r#"{"model":"demo","messages":[{"role":"user","content":"say something short"}],"options":{"num_predict":8}}"#,
            tokens_source: "usage",
            event_tokens: "derived",
            input: true,
            engine: true,
        },
        Case {
            path: "/api/generate",
            body: r#"{"model":"demo","prompt":"say something short","options":{"num_predict":8}}"#,
            tokens_source: "usage",
            event_tokens: "derived",
            input: true,
            engine: true,
        },
        Case {
            path: "/completion",
            body: r#"{"prompt":"say something short","n_predict":8,"stream":true}"#,
            tokens_source: "usage",
            event_tokens: "derived",
            input: true,
            engine: true,
        },
    ]
}

/// The engine timings the simulator wrote in its last event, in ms.
fn engine_in(last: &Value) -> (f64, f64) {
    if let Some(t) = last.get("timings") {
        (
            t["prompt_ms"].as_f64().unwrap(),
            t["predicted_ms"].as_f64().unwrap(),
        )
    } else {
        (
            last["prompt_eval_duration"].as_f64().unwrap() / 1e6,
            last["eval_duration"].as_f64().unwrap() / 1e6,
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulator_speaks_every_dialect_and_the_gateway_measures_it() {
    let sim = start_sim(exact(40.0, 10.0), 3).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", sim.addr)], &dir, "").await;
    let cases = cases();
    let mut got = Vec::new();
    for c in &cases {
        let r = post(gw.data_addr, c.path, c.body, &[]).await;
        assert_eq!(r.status, 200, "{}", c.path);
        got.push(r);
    }
    let truth = sim.truth();
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), cases.len());
    for ((c, r), (t, line)) in cases.iter().zip(&got).zip(truth.iter().zip(&log)) {
        let what = format!("{} {}", c.path, c.body);
        assert_eq!(
            r.body(),
            t.bytes,
            "{what}: the client gets the backend's bytes"
        );
        assert_eq!(line["outcome"], "ok", "{what}: {line}");
        assert_eq!(line["stream"], true, "{what}");
        assert_eq!(line["output_tokens"], MAX, "{what}: {line}");
        assert_eq!(line["tokens_source"], c.tokens_source, "{what}");
        assert_eq!(line["event_tokens"], c.event_tokens, "{what}");
        if c.input {
            assert_eq!(line["input_tokens"], t.prompt_tokens, "{what}");
            assert_eq!(line["finish_reason"], "length", "{what}");
        } else {
            // TGI without `details` says neither.
            assert!(line["input_tokens"].is_null(), "{what}");
            assert!(line["finish_reason"].is_null(), "{what}");
        }
        // TTFT: the first token's write, as the simulator timed it, plus the way through.
        let truth_ttft = t.ttft().unwrap().as_secs_f64() * 1e3;
        let ttft = line["ttft_ms"].as_f64().unwrap();
        assert!(
            ttft >= truth_ttft - 1.0 && ttft < truth_ttft + 40.0,
            "{what}: ttft {ttft} ms, truth {truth_ttft} ms"
        );
        // One inter-token gap per output event after the first.
        let events: u64 = t
            .sent
            .iter()
            .filter_map(|s| match s.kind {
                ChunkKind::Content { tokens } if c.path == "/generate_stream" => {
                    Some(u64::from(tokens))
                }
                ChunkKind::Content { .. } => Some(1),
                _ => None,
            })
            .sum();
        assert_eq!(line["itl_ms"]["count"], events - 1, "{what}");
        if c.engine {
            let last = t.sent.last().unwrap();
            let text = std::str::from_utf8(&t.bytes[last.range.clone()]).unwrap();
            let v: Value = serde_json::from_str(text.trim().trim_start_matches("data: ")).unwrap();
            let (prefill, decode) = engine_in(&v);
            let near = |a: f64, b: f64| (a - b).abs() < 0.002;
            assert!(
                near(line["engine_prefill_ms"].as_f64().unwrap(), prefill),
                "{what}: {line}"
            );
            assert!(
                near(line["engine_decode_ms"].as_f64().unwrap(), decode),
                "{what}: {line}"
            );
        } else {
            assert!(line.get("engine_prefill_ms").is_none(), "{what}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_bodies_in_every_dialect() {
    let sim = start_sim(exact(20.0, 5.0), 4).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", sim.addr)], &dir, "").await;
    let cases = [
        (
            "/v1/messages",
            r#"{"model":"demo","max_tokens":6,"messages":[{"role":"user","content":"hi there"}]}"#,
            true,
        ),
        (
            "/v1/responses",
            r#"{"model":"demo","max_output_tokens":6,"input":"hi there"}"#,
            true,
        ),
        (
            "/generate",
            r#"{"inputs":"hi there","parameters":{"max_new_tokens":6,"details":true}}"#,
            false,
        ),
        (
            "/api/chat",
            r#"{"model":"demo","stream":false,"messages":[{"role":"user","content":"hi there"}],"options":{"num_predict":6}}"#,
            true,
        ),
        (
            "/api/generate",
            r#"{"model":"demo","stream":false,"prompt":"hi there","options":{"num_predict":6}}"#,
            true,
        ),
        (
            "/completion",
            r#"{"prompt":"hi there","n_predict":6}"#,
            true,
        ),
    ];
    for (path, body, _) in cases {
        let r = post(gw.data_addr, path, body, &[]).await;
        assert_eq!(r.status, 200, "{path}");
        let v: Value = serde_json::from_slice(&r.body()).unwrap();
        assert!(v.is_object(), "{path}");
    }
    let truth = sim.truth();
    let log = stop_and_read_log(gw, &dir).await;
    for ((path, _, input), (t, line)) in cases.iter().zip(truth.iter().zip(&log)) {
        assert_eq!(line["outcome"], "ok", "{path}: {line}");
        assert_eq!(line["stream"], false, "{path}");
        assert_eq!(line["output_tokens"], 6, "{path}: {line}");
        assert_eq!(line["tokens_source"], "usage", "{path}");
        assert_eq!(line["finish_reason"], "length", "{path}");
        if *input {
            assert_eq!(line["input_tokens"], t.prompt_tokens, "{path}");
        }
    }
}
