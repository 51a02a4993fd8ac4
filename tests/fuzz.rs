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
//! - the config loader: never panics; every error names a line inside the file;
//! - the upstream HTTP/1.1 client: reads generated responses, cut anywhere, as hyper's does.
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

/// The chunk shapes servers send, each with `{t}` (the text), `{c}` (`created`, or a token
/// count) and `{f}` (a finish reason) to fill: vLLM and SGLang chat, the simulator, legacy
/// completions, a hosted API's padding, llama.cpp's per-chunk timestamp, reasoning output, usage
/// chunks (a hosted API's with its details), and shapes the fast path must decline (tool calls,
/// content parts, both `delta` and `message`, an escaped key).
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
    r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1764500000,"model":"gpt","system_fingerprint":"fp_1","choices":[],"usage":{"prompt_tokens":{c},"completion_tokens":16,"total_tokens":{c},"prompt_tokens_details":{"cached_tokens":{c},"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":{c},"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"obfuscation":"{t}"}"#,
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

/// Ids the streams give their chunks: plain, UTF-8, and escaped ones the fast path refuses.
const IDS: &[&str] = &[
    "c",
    "chatcmpl-9f2",
    "caf\u{e9}",
    "a\\u0041",
    "q\\\"",
    "",
    "\t",
];

/// The fast path (learned chunk shapes, a stream's own and those its backend's streams share)
/// says of every event what the full OpenAI classifier says: over generated streams of the shapes
/// servers send, with ids, texts, timestamps and finish reasons at the edges of what it accepts,
/// with bytes overwritten anywhere, and with new streams starting from the shapes the earlier
/// ones learned.
#[test]
fn fast_path_agrees_with_the_full_classifier() {
    use inferscope::dialect::{Shapes, StreamClassifier};
    check!()
        .with_type::<Vec<(u8, u8, u8, u8, u16, u8)>>()
        .for_each(|events| {
            let shapes = std::sync::Arc::new(Shapes::default());
            let new_stream = || StreamClassifier::sharing(Dialect::OpenAi, shapes.clone());
            let mut fast = new_stream();
            let mut names = true;
            for &(shape, text, created, finish, at, byte) in events {
                // One event in eight starts a new stream (with another id); half of the new
                // streams have their id and model already (the shapes then skip reading them).
                if at % 8 == 1 {
                    fast = new_stream();
                    names = at % 16 == 1;
                    if !names {
                        fast.names_known();
                    }
                }
                let id = IDS[usize::from(at / 8) % IDS.len()];
                let text = TEXTS[usize::from(text) % TEXTS.len()];
                let mut data = SHAPES[usize::from(shape) % SHAPES.len()]
                    .replace("\"id\":\"c", &format!("\"id\":\"{id}c"))
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
                let mut got = fast.classify(&data);
                let want = Dialect::OpenAi.classify(&data);
                if !names {
                    // Left out by a shape, else the full classifier's.
                    got.id = got.id.or_else(|| want.id.clone());
                    got.model = got.model.or_else(|| want.model.clone());
                }
                assert_eq!(got, want, "{}", String::from_utf8_lossy(&data));
            }
        });
}

/// A stream's chunks of one kind differ in their text only, and after the first ones a stream's
/// template reads them (`dialect::shape`'s notes): streams of one shape each, with their
/// `created` and finish reason fixed and their texts at the edges of what a hole accepts, some
/// with a byte overwritten, some with another kind of chunk between, through both paths.
#[test]
fn the_template_agrees_with_the_full_classifier() {
    use inferscope::dialect::{Shapes, StreamClassifier};
    check!()
        .with_type::<(u8, u8, u8, Vec<(u8, u16, u8)>)>()
        .for_each(|(shape, created, finish, events)| {
            let shapes = std::sync::Arc::new(Shapes::default());
            let mut fast = StreamClassifier::sharing(Dialect::OpenAi, shapes);
            let fill = |shape: u8, text: &str| {
                SHAPES[usize::from(shape) % SHAPES.len()]
                    .replace("{t}", text)
                    .replace("{c}", CREATED[usize::from(*created) % CREATED.len()])
                    .replace("{f}", FINISH[usize::from(*finish) % FINISH.len()])
                    .into_bytes()
            };
            for (n, &(text, at, byte)) in events.iter().enumerate() {
                if n == 1 {
                    fast.names_known();
                }
                let text = TEXTS[usize::from(text) % TEXTS.len()];
                // One event in eight is of another shape; one in four has a byte overwritten.
                let mut data = if at % 8 == 3 {
                    fill(shape.wrapping_add(1), text)
                } else {
                    fill(*shape, text)
                };
                if at % 4 == 0 {
                    let i = usize::from(at / 4) % data.len();
                    data[i] = byte;
                }
                let mut got = fast.classify(&data);
                let want = Dialect::OpenAi.classify(&data);
                if n >= 1 {
                    got.id = got.id.or_else(|| want.id.clone());
                    got.model = got.model.or_else(|| want.model.clone());
                }
                assert_eq!(got, want, "{}", String::from_utf8_lossy(&data));
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
    // The ordinary content shapes and the usage chunks (their counts are holes too).
    for (i, shape) in SHAPES
        .iter()
        .enumerate()
        .filter(|&(i, _)| !(7..13).contains(&i))
    {
        // Two streams of one backend: the second reads through what the first learned.
        let shapes = std::sync::Arc::new(inferscope::dialect::Shapes::default());
        let mut hits = [0; 2];
        for (stream, id) in ["c", "chatcmpl-2b"].into_iter().enumerate() {
            let mut fast =
                inferscope::dialect::StreamClassifier::sharing(Dialect::OpenAi, shapes.clone());
            for (n, text) in ["", " the", " cat", "\\n", " sat", " on"]
                .iter()
                .enumerate()
            {
                let data = shape
                    .replace("\"id\":\"c", &format!("\"id\":\"{id}"))
                    .replace("{t}", text)
                    .replace("{c}", &format!("{}", 1764500000 + n))
                    .replace("{f}", "null");
                assert_eq!(
                    fast.classify(data.as_bytes()),
                    Dialect::OpenAi.classify(data.as_bytes())
                );
            }
            hits[stream] = fast.fast_hits();
        }
        assert!(hits[0] >= 4, "shape {i}: {hits:?} hits");
        assert_eq!(hits[1], 6, "shape {i}: {hits:?} hits");
    }
}

/// A frame that is one whole single-line event a learned shape reads skips the SSE scan for line
/// ends; the record must be what the scan gives. Streams of the shapes servers send, each event
/// written in one of the ways SSE allows (no space after `data:`, two, CRLF, an `event:` line, a
/// comment before it, its data over two `data` lines, cut so that its second line is not a field
/// at all, or without its blank line, so the next event's data joins it), are measured as one frame, as one frame per event, one per line and cut
/// anywhere: every record is the same.
#[test]
fn single_event_frames_measure_as_the_scanned_stream() {
    check!()
        .with_type::<(Vec<(u8, u8, u8, u8)>, Vec<u16>)>()
        .for_each(|(events, cuts)| {
            let mut stream = Vec::new();
            let mut events_at = vec![0];
            for &(shape, text, style, split) in events.iter().take(32) {
                let doc = SHAPES[usize::from(shape) % SHAPES.len()]
                    .replace("{t}", TEXTS[usize::from(text) % TEXTS.len()])
                    .replace("{c}", CREATED[usize::from(text / 16) % CREATED.len()])
                    .replace("{f}", FINISH[usize::from(style / 16) % FINISH.len()]);
                // A few places to break the data at: after the brace, in the middle, near the end.
                let at = match split % 3 {
                    0 => 1,
                    1 => doc.len() / 2,
                    _ => doc.len() - 2,
                };
                let at = (0..=at)
                    .rev()
                    .find(|&i| doc.is_char_boundary(i))
                    .unwrap_or(0);
                let (a, b) = doc.split_at(at);
                let block = match style % 13 {
                    0..=4 => format!("data: {doc}\n\n"),
                    5 => format!("data:{doc}\n\n"),
                    6 => format!("data:  {doc}\n\n"),
                    7 => format!("data: {doc}\r\n\r\n"),
                    8 => format!("event: x\ndata: {doc}\n\n"),
                    9 => format!(": keep-alive\n\ndata: {doc}\n\n"),
                    10 => format!("data: {a}\ndata: {b}\n\n"),
                    11 => format!("data: {a}\n{b}\n\n"),
                    _ => format!("data: {doc}\n"),
                };
                stream.extend_from_slice(block.as_bytes());
                events_at.push(stream.len());
            }
            stream.extend_from_slice(b"data: [DONE]\n\n");
            events_at.push(stream.len());
            let pieces = |mut at: Vec<usize>| -> Vec<Vec<u8>> {
                at.extend([0, stream.len()]);
                at.sort_unstable();
                at.dedup();
                at.windows(2).map(|w| stream[w[0]..w[1]].to_vec()).collect()
            };
            let lines: Vec<usize> = (1..stream.len())
                .filter(|&i| stream[i - 1] == b'\n')
                .collect();
            let anywhere: Vec<usize> = cuts
                .iter()
                .map(|c| usize::from(*c) % (stream.len() + 1))
                .collect();
            let path = "/v1/chat/completions";
            let ctype = "text/event-stream";
            let whole = common::meter::measure(path, ctype, &[&stream]);
            for cut in [events_at, lines, anywhere] {
                let pieces = pieces(cut);
                let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
                let mut split = common::meter::measure(path, ctype, &refs);
                // One frame puts every event at one instant; the count of output events is
                // compared through the tokens (one per event here but for reported counts).
                split.output_events = whole.output_events;
                assert_eq!(split, whole, "{}", String::from_utf8_lossy(&stream));
            }
        });
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
/// Status lines a generated response starts with (a 1xx head before a final one, bare LF line
/// ends, a custom and an empty reason phrase, a status that is not three digits).
const STATUS_LINES: &[&[u8]] = &[
    b"HTTP/1.1 200 OK\r\n",
    b"HTTP/1.0 200 OK\r\n",
    b"HTTP/1.1 204 No Content\r\n",
    b"HTTP/1.1 304 Not Modified\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n",
    b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\n",
    b"HTTP/1.1 429 Slow Down\r\n",
    b"HTTP/1.1 500 \r\n",
    b"HTTP/1.1 101 Switching Protocols\r\n",
    b"HTTP/1.1 200 OK\n",
    b"HTTP/1.1 99 Odd\r\n",
    b"HTTP/1.1 200 OK\r\n",
];

/// Header lines of generated responses; the last few are broken (folded, no colon, DEL, a
/// lone LF).
const FIELDS: &[&[u8]] = &[
    b"content-length: 5\r\n",
    b"Content-Length: 0\r\n",
    b"content-length: 5, 5\r\n",
    b"content-length: 3,5\r\n",
    b"content-length: +5\r\n",
    b"content-length: 18446744073709551615\r\n",
    b"transfer-encoding: chunked\r\n",
    b"Transfer-Encoding: gzip, chunked\r\n",
    b"transfer-encoding: chunked, gzip\r\n",
    b"transfer-encoding: chunked\r\n",
    b"connection: close\r\n",
    b"connection: keep-alive\r\n",
    b"Connection: Keep-Alive, Upgrade\r\n",
    b"x-a: b\r\n",
    b"x-a: \xff\x80\r\n",
    b"content-type: text/event-stream\r\n",
    b"x-b:c\r\n",
    b"x-e:\r\n",
    b"x:\tv \r\n",
    b" folded\r\n",
    b"bad header\r\n",
    b"x-del: \x7f\r\n",
    b"\n",
];

/// Bytes after the head: stray line ends, size lines, data, trailers, bytes that break them.
const BODY: &[&[u8]] = &[
    b"hello",
    b"5\r\nhello\r\n",
    b"0\r\n\r\n",
    b"\r\n",
    b"\r",
    b"\n",
    b"0",
    b"data: {}\n\n",
    b";",
    b" ",
    b"x-t: 2\r\n",
    b"fffffffffffffffff\r\n",
    b"\t",
];

/// What follows a generated chunked body's last data chunk.
const CHUNKED_ENDS: &[&[u8]] = &[
    b"0\r\n\r\n",
    b"0\r\nx-t: 1\r\n\r\n",
    b"0\r\nx-t: 1\r\nX-U: a b\r\n\r\n",
    b"0;last\r\n\r\n",
    b"000\r\n\r\n",
    b"0\r\n",
    b"",
    b"0\r\nbad trailer\r\n\r\n",
    b"0\r\nx-t: 1\r\n",
    b"0\r\n\n",
];

/// A chunked body: chunks of `len % 40` bytes, their size lines and ends varied by the bits of
/// `flavor` (extensions, whitespace, case, leading zeros; now and then a broken line end), then
/// `end`.
fn chunked_body(chunks: &[(u8, u8)], end: u8) -> Vec<u8> {
    let mut out = Vec::new();
    for &(len, flavor) in chunks {
        let len = usize::from(len % 40);
        let size = match flavor % 8 {
            0 => format!("{len:x}"),
            1 => format!("{len:x};a=b"),
            2 => format!("{len:x} "),
            3 => format!("{len:x}\t;q"),
            4 => format!("{len:X}"),
            5 => format!("00{len:x}"),
            6 => format!("{len:x};{}", "e".repeat(usize::from(flavor))),
            _ => format!("{len:x} x"),
        };
        out.extend_from_slice(size.as_bytes());
        // One size line in eight ends with a bare LF; one chunk in four ends badly.
        out.extend_from_slice(if (flavor >> 3) % 8 == 7 {
            b"\n"
        } else {
            b"\r\n"
        });
        out.extend(std::iter::repeat_n(b'd', len));
        out.extend_from_slice(match (flavor >> 6, len % 2) {
            (3, 0) => b"\n",
            (3, _) => b"\rX",
            _ => b"\r\n",
        });
    }
    out.extend_from_slice(CHUNKED_ENDS[usize::from(end) % CHUNKED_ENDS.len()]);
    out
}

/// What a client made of a response: the head's status, version, fields and reason phrase, and
/// the body's bytes and trailers — or that the head, or the body, failed.
#[derive(Debug, PartialEq)]
#[allow(clippy::large_enum_variant)]
enum Reading {
    HeadFailed,
    Response {
        status: u16,
        version: http::Version,
        headers: http::HeaderMap,
        reason: Option<Vec<u8>>,
        body: Result<(Vec<u8>, Option<http::HeaderMap>), ()>,
    },
}

/// A backend on an in-memory pipe: reads the request, writes `wire` cut at `cuts` (a yield
/// between pieces), then closes.
fn backend(wire: &[u8], cuts: &[u16]) -> tokio::io::DuplexStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (client, mut server) = tokio::io::duplex(1 << 20);
    let wire = wire.to_vec();
    let mut at: Vec<usize> = cuts
        .iter()
        .map(|&c| usize::from(c).min(wire.len()))
        .collect();
    at.sort_unstable();
    tokio::spawn(async move {
        let mut req = [0u8; 4096];
        let _ = server.read(&mut req).await;
        let mut from = 0;
        for c in at.into_iter().chain([wire.len()]) {
            if c > from {
                if server.write_all(&wire[from..c]).await.is_err() {
                    return;
                }
                from = c;
                tokio::task::yield_now().await;
            }
        }
    });
    client
}

async fn read_all<B>(parts: http::response::Parts, mut body: B) -> Reading
where
    B: http_body::Body + Unpin,
{
    use bytes::Buf;
    use http_body_util::BodyExt;
    let (mut data, mut trailers) = (Vec::new(), None);
    let mut failed = false;
    while let Some(f) = body.frame().await {
        match f {
            Ok(f) => match f.into_data() {
                Ok(mut d) => {
                    while d.has_remaining() {
                        data.extend_from_slice(d.chunk());
                        d.advance(d.chunk().len());
                    }
                }
                Err(f) => trailers = f.into_trailers().ok(),
            },
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    Reading::Response {
        status: parts.status.as_u16(),
        version: parts.version,
        headers: parts.headers,
        reason: parts
            .extensions
            .get::<hyper::ext::ReasonPhrase>()
            .map(|r| r.as_bytes().to_vec()),
        body: if failed {
            Err(())
        } else {
            Ok((data, trailers))
        },
    }
}

fn request(head: bool) -> http::Request<inferscope::proxy::UpstreamRequestBody> {
    let mut r = http::Request::new(http_body_util::Either::Left(http_body_util::Full::new(
        Bytes::new(),
    )));
    if head {
        *r.method_mut() = http::Method::HEAD;
    }
    *r.uri_mut() = http::Uri::from_static("/v1/models");
    r.headers_mut()
        .insert(http::header::HOST, http::HeaderValue::from_static("b"));
    r
}

/// The gateway's HTTP/1.1 client reads every generated response as hyper's client does: the same
/// head (status, version, fields, reason phrase) or a failure where hyper fails, the same body
/// bytes and trailers or a failure where hyper fails — with the response cut anywhere.
#[test]
fn the_upstream_http1_client_reads_responses_as_hyper_does() {
    use inferscope::proxy::h1;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    check!()
        .with_type::<(u8, Vec<u8>, u8, Vec<(u8, u8)>, u8, Vec<u8>, Vec<u16>)>()
        .for_each(|(status, fields, flags, chunks, end, noise, cuts)| {
            let mut wire = STATUS_LINES[usize::from(*status) % STATUS_LINES.len()].to_vec();
            // Mostly valid fields: a broken one in about one line of eight.
            for &f in fields {
                let i = usize::from(f) % FIELDS.len();
                wire.extend_from_slice(
                    FIELDS[if f % 8 == 0 {
                        i
                    } else {
                        i % (FIELDS.len() - 4)
                    }],
                );
            }
            if flags % 16 != 0 {
                wire.extend_from_slice(b"\r\n");
            }
            if flags % 4 != 1 {
                wire.extend(chunked_body(chunks, *end));
            }
            wire.extend(expand(noise, BODY));
            let head = flags % 32 == 7;
            let (ours, hypers) = rt.block_on(async {
                let ours = match h1::Conn::new(backend(&wire, cuts))
                    .send(request(head))
                    .await
                {
                    Ok(r) => {
                        let (p, b) = r.into_parts();
                        read_all(p, b).await
                    }
                    Err(_) => Reading::HeadFailed,
                };
                let io = hyper_util::rt::TokioIo::new(backend(&wire, cuts));
                let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
                let driver = tokio::spawn(conn);
                let theirs = match send.send_request(request(head)).await {
                    Ok(r) => {
                        let (p, b) = r.into_parts();
                        read_all(p, b).await
                    }
                    Err(_) => Reading::HeadFailed,
                };
                driver.abort();
                (ours, theirs)
            });
            assert_eq!(ours, hypers, "{:?}", String::from_utf8_lossy(&wire));
        });
}

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
