//! Fuzzing on stable Rust: `bolero` property tests that run under `cargo test` (about a second of
//! random inputs each; `BOLERO_RANDOM_TEST_TIME_MS=600000 cargo test --release --test fuzz` for
//! a long run, recorded in docs/SECURITY.md). Inputs are built from a dictionary of the tokens
//! each parser cares about, so random bytes reach deep into the formats. A crash found becomes a
//! regression test at the bottom of this file.
//!
//! - the SSE and NDJSON scanners, with the OpenAI classifier on every event: never panic, events
//!   stay inside their chunk, and cutting the stream into other chunks changes no event;
//! - every dialect's meter (Anthropic, Responses, TGI, Ollama, llama.cpp, OpenAI with token
//!   ids): never panics, and cutting the stream changes nothing the record says;
//! - the request inspector (`prepare_body`): never panics; an injected `include_usage` leaves a
//!   JSON object with the client's fields unchanged;
//! - the config loader: never panics; every error names a line inside the file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use bolero::check;
use bytes::Bytes;
use inferscope::dialect::Dialect;
use inferscope::sse::{Event, NdjsonScanner, SseScanner};

/// Expands each input byte into a token of `dict` (or itself, past the dictionary's end).
fn expand(input: &[u8], dict: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len() * 8);
    for &b in input {
        match dict.get(usize::from(b)) {
            Some(t) => out.extend_from_slice(t),
            None => out.push(b),
        }
    }
    out
}

const SSE_DICT: &[&[u8]] = &[
    b"data: ",
    b"data:",
    b"\n",
    b"\r\n",
    b"\r",
    b"\n\n",
    b"event: error\n",
    b": keep-alive\n",
    b"id: 7\n",
    b"retry: 10\n",
    b"[DONE]",
    br#"{"id":"c","choices":[{"index":0,"delta":{"content":"a"}}]}"#,
    br#"{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
    br#"{"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
    br#"{"error":{"message":"boom"}}"#,
    b"{",
    b"}",
    b"\"",
    b"\\",
    b"\xff\xfe",
    b"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
];

#[derive(Debug, PartialEq, Eq)]
struct Seen {
    event_type: Vec<u8>,
    data: Vec<u8>,
}

/// Feeds `stream` cut at `cuts` (offsets, taken modulo its length) and returns the events, after
/// checking each event's range lies in the chunk that completed it and classifying its data.
fn scan(stream: &[u8], cuts: &[u16], sse: bool, max_line: usize) -> Vec<Seen> {
    let mut points: Vec<usize> = cuts
        .iter()
        .map(|c| usize::from(*c) % (stream.len() + 1))
        .collect();
    points.push(0);
    points.push(stream.len());
    points.sort_unstable();
    points.dedup();
    let mut seen = Vec::new();
    let mut sse_scanner = SseScanner::new(max_line);
    let mut nd_scanner = NdjsonScanner::new(max_line);
    for w in points.windows(2) {
        let chunk = &stream[w[0]..w[1]];
        let mut on_event = |ev: Event<'_>| {
            assert!(ev.end <= chunk.len(), "event ends past its chunk");
            if let Some(s) = ev.start {
                assert!(s <= ev.end, "event starts after it ends");
            }
            let o = Dialect::OpenAi.classify(ev.data);
            let _ = (o.output, o.done, o.usage_only);
            let mut text = String::new();
            Dialect::OpenAi.append_content(ev.data, &mut text, 64);
            assert!(text.len() <= 64 + 4, "captured past the cap");
            seen.push(Seen {
                event_type: ev.event_type.to_vec(),
                data: ev.data.to_vec(),
            });
        };
        if sse {
            sse_scanner.feed(chunk, &mut on_event);
        } else {
            nd_scanner.feed(chunk, &mut on_event);
        }
    }
    seen
}

#[test]
fn sse_scanner_and_classifier_are_total_and_split_invariant() {
    check!()
        .with_type::<(Vec<u8>, Vec<u16>)>()
        .for_each(|(input, cuts)| {
            let stream = expand(input, SSE_DICT);
            for max_line in [48, inferscope::sse::DEFAULT_MAX_LINE] {
                let whole = scan(&stream, &[], true, max_line);
                let split = scan(&stream, cuts, true, max_line);
                assert_eq!(whole, split, "cutting the stream changed its events");
            }
        });
}

#[test]
fn ndjson_scanner_and_classifier_are_total_and_split_invariant() {
    check!()
        .with_type::<(Vec<u8>, Vec<u16>)>()
        .for_each(|(input, cuts)| {
            let stream = expand(input, SSE_DICT);
            for max_line in [48, inferscope::sse::DEFAULT_MAX_LINE] {
                let whole = scan(&stream, &[], false, max_line);
                let split = scan(&stream, cuts, false, max_line);
                assert_eq!(whole, split, "cutting the stream changed its events");
            }
        });
}

/// Fragments of every dialect's events: the documented shapes, and values at their edges.
const DIALECT_DICT: &[&[u8]] = &[
    b"data: ",
    b"data:",
    b"event: message_delta\n",
    b"\n",
    b"\n\n",
    b"\r\n",
    br#"{"type":"message_start","message":{"id":"m","model":"c","usage":{"input_tokens":3,"output_tokens":1}}}"#,
    br#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}"#,
    br#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":4}}"#,
    br#"{"type":"message_stop"}"#,
    br#"{"type":"error","error":{"type":"overloaded_error"}}"#,
    br#"{"type":"ping"}"#,
    br#"{"type":"response.created","response":{"id":"r","usage":null}}"#,
    br#"{"type":"response.output_text.delta","delta":"x"}"#,
    br#"{"type":"response.completed","response":{"status":"completed","output":[{"type":"function_call","arguments":"{}"}],"usage":{"input_tokens":2,"output_tokens":5}}}"#,
    br#"{"type":"response.incomplete","response":{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"}}}"#,
    br#"{"token":{"id":1,"text":"a","special":false},"generated_text":null,"details":null}"#,
    br#"{"token":{"id":2,"text":"</s>","special":true},"generated_text":"a","details":{"finish_reason":"eos_token","generated_tokens":2,"input_length":4}}"#,
    br#"{"error":"x","error_type":"validation"}"#,
    br#"{"model":"l","message":{"role":"assistant","content":"a"},"done":false}"#,
    br#"{"response":"b","done":false}"#,
    br#"{"done":true,"done_reason":"length","prompt_eval_count":3,"eval_count":3,"prompt_eval_duration":5,"eval_duration":-1}"#,
    br#"{"content":"a","stop":false,"tokens":[1,2]}"#,
    br#"{"content":"","stop":true,"tokens_predicted":2.0,"tokens_evaluated":-1,"stop_type":"eos","timings":{"prompt_ms":1e300,"predicted_ms":-3}}"#,
    br#"{"choices":[{"delta":{"content":"a"},"token_ids":[1,2,3]}],"usage":{"completion_tokens":7}}"#,
    b"[DONE]",
    b"{",
    b"}",
    b"\"",
    b"\\",
    b"\xff",
    b"null",
    b"[",
    b"]",
    b"1e999",
];

/// Every dialect's meter: never panics, and how the stream is cut changes nothing it records.
#[test]
fn dialect_meters_are_total_and_split_invariant() {
    check!()
        .with_type::<(Vec<u8>, Vec<u16>)>()
        .for_each(|(input, cuts)| {
            let stream = expand(input, DIALECT_DICT);
            let mut points: Vec<usize> = cuts
                .iter()
                .map(|c| usize::from(*c) % (stream.len() + 1))
                .collect();
            points.extend([0, stream.len()]);
            points.sort_unstable();
            points.dedup();
            let pieces: Vec<&[u8]> = points.windows(2).map(|w| &stream[w[0]..w[1]]).collect();
            for (path, ctype) in [
                ("/v1/chat/completions", "text/event-stream"),
                ("/v1/messages", "text/event-stream"),
                ("/v1/responses", "text/event-stream"),
                ("/generate_stream", "text/event-stream"),
                ("/api/chat", "application/x-ndjson"),
                ("/completion", "text/event-stream"),
                ("/v1/messages", "application/json"),
                ("/api/generate", "application/json"),
            ] {
                let whole = common::meter::measure(path, ctype, &[&stream]);
                let split = common::meter::measure(path, ctype, &pieces);
                assert_eq!(
                    (
                        whole.output_tokens,
                        &whole.finish,
                        whole.outcome,
                        whole.malformed
                    ),
                    (
                        split.output_tokens,
                        &split.finish,
                        split.outcome,
                        split.malformed
                    ),
                    "{path}: cutting the stream changed its record"
                );
                assert_eq!(
                    (
                        &whole.tokens_source,
                        &whole.event_tokens,
                        whole.input_tokens
                    ),
                    (
                        &split.tokens_source,
                        &split.event_tokens,
                        split.input_tokens
                    ),
                    "{path}: cutting the stream changed its record"
                );
                assert_eq!(whole.engine, split.engine, "{path}");
            }
        });
}

/// The chunk shapes servers send, each with `{t}` (the text), `{c}` (`created`) and `{f}`
/// (a finish reason) to fill: vLLM and SGLang chat, the simulator, legacy completions, a hosted
/// API's padding, llama.cpp's per-chunk timestamp, reasoning output, and shapes the fast path
/// must decline (tool calls, content parts, both `delta` and `message`, an escaped key).
const SHAPES: &[&str] = &[
    r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":{c},"model":"m","choices":[{"index":0,"delta":{"content":"{t}"},"logprobs":null,"finish_reason":{f}}]}"#,
    r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":{c},"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"{t}"},"logprobs":null,"finish_reason":{f},"matched_stop":null}]}"#,
    r#"{"id":"cmpl-1","object":"text_completion","created":{c},"model":"m","choices":[{"index":0,"text":"{t}","logprobs":null,"finish_reason":{f},"stop_reason":null}]}"#,
    r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":{c},"model":"gpt","service_tier":"default","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"content":"{t}"},"logprobs":null,"finish_reason":{f}}],"obfuscation":"{t}"}"#,
    r#"{"choices":[{"finish_reason":{f},"index":0,"delta":{"content":"{t}"}}],"created":{c},"id":"chatcmpl-1","model":"m","system_fingerprint":"b1","object":"chat.completion.chunk"}"#,
    r#"{"id":"c","choices":[{"index":0,"delta":{"reasoning_content":"{t}","content":null},"finish_reason":{f}}],"created":{c}}"#,
    r#"{"id":"c","choices":[{"index":0,"delta":{"content":"{t}"},"finish_reason":{f}},{"index":1,"delta":{"content":"{t}"},"finish_reason":null}]}"#,
    r#"{"id":"c","choices":[{"index":0,"delta":{"content":"{t}"},"finish_reason":{f},"token_ids":[1,2]}],"usage":{"prompt_tokens":3,"completion_tokens":{c}}}"#,
    r#"{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{t}"}}]},"finish_reason":{f}}]}"#,
    r#"{"id":"c","choices":[{"index":0,"delta":{"content":[{"type":"text","text":"{t}"}]},"finish_reason":{f}}]}"#,
    r#"{"id":"c","choices":[{"index":0,"delta":{"content":"{t}"},"message":{"content":"{t}"}}]}"#,
    r#"{"id":"c","choices":[{"index":0,"delta":{"con\u0074ent":"{t}"}}],"created":{c}}"#,
    r#" {"id" : "c" ,"model":null, "choices" : [ { "delta" : { "content" : "{t}" } } ] , "created" : {c} } "#,
    r#"{"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":{c}}}"#,
];

/// Texts at the edges of what a hole accepts.
const TEXTS: &[&str] = &[
    "",
    " the",
    "a",
    "caf\u{e9} \u{1f600}",
    "line\\nbreak",
    "\\\"quoted\\\"",
    "\\\\",
    "\\/\\b\\f\\r\\t",
    "\\u00e9",
    "\\ud800",
    "\\x",
    "\\",
    "\"",
    "\t",
    "\u{7f}",
    "{\"content\":\"",
];

const CREATED: &[&str] = &[
    "1764500000",
    "1",
    "0",
    "-0",
    "-7",
    "01",
    "1.5",
    "1e3",
    "\"1\"",
    "null",
    "99999999999999999999",
];
const FINISH: &[&str] = &["null", "\"length\"", "\"stop\"", "\"weird\""];

/// The fast path (a stream's learned chunk shape) says of every event what the full OpenAI
/// classifier says: over generated streams of the shapes servers send, with texts, timestamps
/// and finish reasons at the edges of what it accepts, and with bytes overwritten anywhere.
#[test]
fn fast_path_agrees_with_the_full_classifier() {
    check!()
        .with_type::<Vec<(u8, u8, u8, u8, u16, u8)>>()
        .for_each(|events| {
            let mut fast = inferscope::dialect::StreamClassifier::new(Dialect::OpenAi);
            for &(shape, text, created, finish, at, byte) in events {
                let text = TEXTS[usize::from(text) % TEXTS.len()];
                let mut data = SHAPES[usize::from(shape) % SHAPES.len()]
                    .replace("{t}", text)
                    .replace("{c}", CREATED[usize::from(created) % CREATED.len()])
                    .replace("{f}", FINISH[usize::from(finish) % FINISH.len()])
                    .into_bytes();
                // One in four events has a byte overwritten (an invalid UTF-8 byte, a quote, a
                // brace, a digit, whatever the input says).
                if at % 4 == 0 {
                    let i = usize::from(at / 4) % data.len();
                    data[i] = byte;
                }
                assert_eq!(
                    fast.classify(&data),
                    Dialect::OpenAi.classify(&data),
                    "{}",
                    String::from_utf8_lossy(&data)
                );
            }
        });
}

/// Every fixture, and streams of each realistic shape, through both paths: equal answers, and
/// the ordinary shapes are in fact answered by the fast path (or the check above proves little).
#[test]
fn fast_path_agrees_on_fixtures_and_takes_ordinary_streams() {
    for entry in std::fs::read_dir("tests/fixtures/dialects").unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        for dialect in Dialect::ALL {
            let mut fast = inferscope::dialect::StreamClassifier::new(dialect);
            let mut check = |ev: Event<'_>| {
                assert_eq!(
                    fast.classify(ev.data),
                    dialect.classify(ev.data),
                    "{path:?}"
                );
            };
            SseScanner::default().feed(&bytes, &mut check);
            NdjsonScanner::default().feed(&bytes, &mut check);
        }
    }
    for (i, shape) in SHAPES[..7].iter().enumerate() {
        let mut fast = inferscope::dialect::StreamClassifier::new(Dialect::OpenAi);
        for (n, text) in ["", " the", " cat", "\\n", " sat", " on"]
            .iter()
            .enumerate()
        {
            let data = shape
                .replace("{t}", text)
                .replace("{c}", &format!("{}", 1764500000 + n))
                .replace("{f}", "null");
            assert_eq!(
                fast.classify(data.as_bytes()),
                Dialect::OpenAi.classify(data.as_bytes())
            );
        }
        assert!(
            fast.fast_hits() >= 4,
            "shape {i}: {} hits",
            fast.fast_hits()
        );
    }
}

const JSON_DICT: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b":",
    b",",
    b"\"model\"",
    b"\"stream\"",
    b"\"stream_options\"",
    b"\"include_usage\"",
    b"\"messages\"",
    b"\"user\"",
    b"\"max_tokens\"",
    b"true",
    b"false",
    b"null",
    b"1e999",
    b"-0.5",
    b"\"m\"",
    b"\"\\u0000\"",
    b"\"\\ud800\"",
    b" ",
    br#"{"role":"user","content":"hi"}"#,
];

#[test]
fn request_inspector_is_total_and_keeps_the_clients_fields() {
    check!().with_type::<Vec<u8>>().for_each(|input| {
        let body = expand(input, JSON_DICT);
        let before: Option<serde_json::Map<String, serde_json::Value>> =
            serde_json::from_slice(&body).ok();
        let Ok(p) = inferscope::proxy::prepare_body(
            Bytes::from(body.clone()),
            inferscope::dialect::Endpoint::ChatCompletions,
            Some(256),
        ) else {
            return; // nested too deep: refused with a 400
        };
        if !p.strip_usage {
            assert_eq!(&p.body[..], &body[..], "the body changed without a reason");
            return;
        }
        let after: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&p.body)
            .unwrap_or_else(|e| panic!("the rewritten body is not JSON ({e})"));
        let before = before.expect("usage injected into a body that was not a JSON object");
        assert_eq!(
            after["stream_options"]["include_usage"],
            serde_json::Value::Bool(true)
        );
        for (k, v) in &before {
            if k != "stream_options" {
                assert_eq!(after.get(k), Some(v), "field {k} changed");
            }
        }
    });
}

/// What the inspector said of a body: model, user, stream, usage injected, the body forwarded,
/// and max tokens, temperature and top_p (`None`: refused, nested too deep).
type Inspected = Option<(
    Option<String>,
    Option<String>,
    bool,
    bool,
    Vec<u8>,
    [Option<f64>; 3],
)>;

/// The request inspector as it was, over a whole `serde_json::Value`: the oracle the borrowed
/// view is checked against.
fn reference_inspect(body: &[u8], endpoint: inferscope::dialect::Endpoint) -> Inspected {
    use serde_json::Value;
    let mut stream = endpoint.streams_by_default();
    let mut v = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(v)) => v,
        Err(e) if e.to_string().starts_with("recursion limit exceeded") => return None,
        _ => return Some((None, None, stream, false, body.to_vec(), [None; 3])),
    };
    let model = v.get("model").and_then(Value::as_str).map(str::to_owned);
    let user = v
        .get("user")
        .or_else(|| v.get("metadata").and_then(|m| m.get("user_id")))
        .and_then(Value::as_str)
        .map(str::to_owned);
    if endpoint.stream_in_body() {
        if let Some(s) = v.get("stream").and_then(Value::as_bool) {
            stream = s;
        }
    }
    let param = |names: &[&str]| inferscope::dialect::request_param(&v, names);
    let params = [
        param(&inferscope::dialect::MAX_TOKENS_PARAMS)
            .and_then(Value::as_u64)
            .map(|n| n as f64),
        param(&["temperature"]).and_then(Value::as_f64),
        param(&["top_p"]).and_then(Value::as_f64),
    ];
    let mut out = (model, user, stream, false, body.to_vec(), params);
    if !(endpoint.is_openai() && stream) {
        return Some(out);
    }
    match v.get_mut("stream_options") {
        Some(Value::Object(opts)) => {
            if opts.get("include_usage").and_then(Value::as_bool) == Some(true) {
                return Some(out);
            }
            opts.insert("include_usage".into(), Value::Bool(true));
            out.4 = serde_json::to_vec(&v).unwrap();
            out.3 = true;
        }
        Some(_) => {}
        None => {
            if let Some(end) = body.iter().rposition(|b| *b == b'}') {
                out.4 = [
                    &body[..end],
                    br#","stream_options":{"include_usage":true}"#,
                    &body[end..],
                ]
                .concat();
                out.3 = true;
            }
        }
    }
    Some(out)
}

/// More of what the inspector reads: every key it knows, where each dialect keeps it, and
/// values of every type at their edges.
const INSPECT_DICT: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b":",
    b",",
    b"\"model\"",
    b"\"mod\\u0065l\"",
    b"\"stream\"",
    b"\"stream_options\"",
    b"\"include_usage\"",
    b"\"user\"",
    b"\"metadata\"",
    b"\"user_id\"",
    b"\"parameters\"",
    b"\"options\"",
    b"\"max_tokens\"",
    b"\"max_new_tokens\"",
    b"\"num_predict\"",
    b"\"temperature\"",
    b"\"top_p\"",
    b"true",
    b"false",
    b"null",
    b"12",
    b"-3",
    b"0.5",
    b"12.0",
    b"1e999",
    b"18446744073709551616",
    b"\"m\"",
    b"\"a\\nb\"",
    b"\"\\ud800\"",
    b"\"\xff\"",
    b" ",
    br#"{"role":"user","content":"hi"}"#,
];

const INSPECT_KEYS: &[&str] = &[
    "model",
    "mod\\u0065l",
    "stream",
    "stream_options",
    "user",
    "metadata",
    "parameters",
    "options",
    "max_tokens",
    "max_new_tokens",
    "num_predict",
    "max_completion_tokens",
    "max_output_tokens",
    "n_predict",
    "temperature",
    "top_p",
    "messages",
    "x",
];

const INSPECT_VALUES: &[&str] = &[
    r#""m""#,
    r#""a\nb""#,
    r#""\ud800""#,
    "true",
    "false",
    "null",
    "12",
    "-3",
    "0.5",
    "12.0",
    "1e999",
    "18446744073709551616",
    "[1,2]",
    "{}",
    r#"{"user_id":"u"}"#,
    r#"{"user_id":7}"#,
    r#"{"include_usage":true}"#,
    r#"{"include_usage":false,"x":1}"#,
    r#"{"include_usage":"yes"}"#,
    r#"{"max_tokens":5,"temperature":0.2,"top_p":1}"#,
    r#"{"num_predict":-1}"#,
    r#"{"max_new_tokens":9,"max_new_tokens":10}"#,
    r#"[{"role":"user","content":"hi"}]"#,
    r#"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"#,
];

/// A JSON object of the inspector's keys and values (keys given twice, values of every type),
/// then, when `cut` says so, one byte overwritten.
fn inspect_body(entries: &[(u8, u8)], cut: u16, byte: u8) -> Vec<u8> {
    let mut body = String::from("{");
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 {
            body.push_str(if k % 3 == 0 { " , " } else { "," });
        }
        let key = INSPECT_KEYS[usize::from(*k) % INSPECT_KEYS.len()];
        let value = INSPECT_VALUES[usize::from(*v) % INSPECT_VALUES.len()];
        body.push_str(&format!("\"{key}\":{value}"));
    }
    body.push('}');
    let mut body = body.into_bytes();
    if cut % 3 == 0 {
        let i = usize::from(cut / 3) % body.len();
        body[i] = byte;
    }
    body
}

/// The borrowed view reads what the whole `Value` read: the same model, user, stream flag,
/// parameters, the same forwarded bytes, and the same refusal of a body nested too deep. Over
/// objects built from the keys it knows (one byte overwritten in a third of them), and over
/// streams of JSON tokens.
#[test]
fn request_inspector_agrees_with_the_value_it_replaced() {
    check!()
        .with_type::<(Vec<(u8, u8)>, u16, u8, Vec<u8>)>()
        .for_each(|(entries, cut, byte, tokens)| {
            inspect_both(&inspect_body(entries, *cut, *byte));
            inspect_both(&expand(tokens, INSPECT_DICT));
        });
}

fn inspect_both(body: &[u8]) {
    use inferscope::dialect::Endpoint;
    {
        for endpoint in [
            Endpoint::ChatCompletions,
            Endpoint::Completions,
            Endpoint::Messages,
            Endpoint::GenerateStream,
            Endpoint::OllamaChat,
        ] {
            let want = reference_inspect(body, endpoint);
            let got = inferscope::proxy::prepare_body(Bytes::from(body.to_vec()), endpoint, None)
                .ok()
                .map(|p| {
                    (
                        p.model,
                        p.user,
                        p.stream,
                        p.strip_usage,
                        p.body.to_vec(),
                        [
                            p.params.max_tokens.map(|n| n as f64),
                            p.params.temperature,
                            p.params.top_p,
                        ],
                    )
                });
            assert_eq!(got, want, "{endpoint:?}: {}", String::from_utf8_lossy(body));
        }
    }
}

const YAML_DICT: &[&[u8]] = &[
    b"\n",
    b"  ",
    b"- ",
    b": ",
    b"backends:",
    b"routes:",
    b"limits:",
    b"access_log:",
    b"telemetry:",
    b"name: a",
    b"url: \"http://127.0.0.1:1\"",
    b"sim: { profile: fp16 }",
    b"backends: [a]",
    b"match: { model: m }",
    b"experiment:",
    b"variants:",
    b"weight: 0",
    b"max_event_bytes: 0",
    b"shutdown_grace: 30s",
    b"shutdown_grace: forever",
    b"{",
    b"}",
    b"[",
    b"]",
    b"&a ",
    b"*a",
    b"!!binary ",
    b"'",
    b"#",
];

#[test]
fn config_loader_is_total_and_names_a_line() {
    check!().with_type::<Vec<u8>>().for_each(|input| {
        let text = String::from_utf8_lossy(&expand(input, YAML_DICT)).into_owned();
        if let Err(e) = inferscope::config::parse(&text, "fuzz.yaml") {
            let shown = e.to_string();
            assert!(shown.starts_with("fuzz.yaml"), "{shown}");
            if let Some(line) = e.line {
                assert!(
                    line <= text.lines().count() + 1,
                    "line {line} past the end: {shown}"
                );
            }
        }
    });
}

// Regression tests: inputs fuzzing found, kept as they were found.

/// Found by `ndjson_scanner_…` and `sse_scanner_…`: a line over the cap was measured when it
/// arrived inside one chunk and skipped when it spanned two, so how TCP cut the stream changed
/// what was measured.
#[test]
fn regression_an_oversized_line_is_skipped_however_the_stream_is_cut() {
    let line = [b"data: ".as_slice(), &[b'x'; 100], b"\n\n"].concat();
    for sse in [true, false] {
        let whole = scan(&line, &[], sse, 48);
        assert!(whole.is_empty(), "{whole:?}");
        assert_eq!(whole, scan(&line, &[30], sse, 48));
    }
}

/// Found by `config_loader_is_total_…`: the YAML parser counts U+0085 as a line break, so an error
/// at the end of `"\u{85}\n"` was said to be on line 3 of a file an editor shows as one line.
#[test]
fn regression_a_next_line_character_does_not_move_the_error_past_the_end() {
    let e = inferscope::config::parse("\u{85}\n", "fuzz.yaml").unwrap_err();
    assert_eq!(e.line, Some(2), "{e}");
}
