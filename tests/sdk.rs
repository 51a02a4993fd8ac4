//! The official `openai` and `anthropic` Python SDKs through the gateway, unchanged but for the
//! base URL: chat and completions (streamed, with and without usage asked), the Responses API
//! and Anthropic Messages (streamed through the SDK's own stream helper, and not). Each must get
//! what the backend said — the usage chunk the gateway asked for on its behalf never reaches it
//! — and each request's access-log line must agree with what the SDK saw.
//!
//! `.ci/run` installs both SDKs into `target/sdk-venv`; elsewhere set `INFERSCOPE_SDK_PYTHON` to a
//! Python that has them. A second-lane test: `cargo test --test it sdk:: -- --ignored`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

fn python() -> PathBuf {
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/sdk-venv/bin/python");
    let py = std::env::var_os("INFERSCOPE_SDK_PYTHON")
        .map(PathBuf::from)
        .unwrap_or(venv);
    let ok = Command::new(&py)
        .args(["-c", "import openai, anthropic"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "{} cannot import openai and anthropic (python3 -m venv target/sdk-venv && \
         target/sdk-venv/bin/pip install openai anthropic; .ci/run does)",
        py.display()
    );
    py
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the openai and anthropic SDKs"]
async fn official_sdks_work_unchanged_and_are_measured() {
    let py = python();
    let sim = start_sim(exact(20.0, 4.0), 9).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", sim.addr)], &dir, "").await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/clients.py");
    let base = format!("http://{}", gw.data_addr);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(py).arg(script).arg(base).output().unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the SDK script failed:\n{stderr}");
    let seen: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let log = stop_and_read_log(gw, &dir).await;
    let case = |name: &str| -> &Value {
        seen.iter()
            .find(|s| s["case"] == name)
            .unwrap_or_else(|| panic!("no case {name}: {seen:?}"))
    };
    assert_eq!(seen.len(), 9, "{seen:?}");
    // One request a case (the Anthropic stream ran twice: the helper, then raw events).
    assert_eq!(log.len(), 9, "{log:?}");
    for l in &log {
        assert_eq!(l["outcome"], "ok", "{l}");
        assert_eq!(l["output_tokens"], 7, "{l}");
        assert_eq!(l["tokens_source"], "usage", "{l}");
        assert_eq!(l["finish_reason"], "length", "{l}");
    }
    for s in &seen {
        let name = s["case"].as_str().unwrap();
        if let Some(text) = s["text"].as_str() {
            assert_eq!(text.split_whitespace().count(), 7, "{name}: {text:?}");
        }
        let Some(id) = s["id"].as_str() else { continue };
        let line = log
            .iter()
            .find(|l| l["response_id"] == id)
            .unwrap_or_else(|| panic!("{name}: no log line for {id}"));
        if !s["output_tokens"].is_null() {
            assert_eq!(s["output_tokens"], line["output_tokens"], "{name}");
            assert_eq!(s["input_tokens"], line["input_tokens"], "{name}");
        }
        assert_eq!(line["stream"], name.contains("stream"), "{name}");
        if name.contains("stream") {
            assert!(line["ttft_ms"].as_f64().unwrap() > 0.0, "{name}: {line}");
            assert!(
                line["itl_ms"]["count"].as_u64().unwrap() >= 6,
                "{name}: {line}"
            );
        }
    }
    // What the SDK calls the finish, in its own words.
    assert_eq!(case("openai.chat")["finish"], "length");
    assert_eq!(case("openai.chat.stream")["finish"], "length");
    assert_eq!(case("openai.responses")["finish"], "incomplete");
    assert_eq!(case("openai.responses.stream")["finish"], "incomplete");
    assert_eq!(case("anthropic.messages")["finish"], "max_tokens");
    assert_eq!(case("anthropic.messages.stream")["finish"], "max_tokens");
    // The usage chunk the gateway added is not seen; the one the client asked for is.
    let plain = &case("openai.chat.stream")["events"];
    let asked = &case("openai.chat.stream.usage")["events"];
    assert_eq!(plain.as_u64().unwrap() + 1, asked.as_u64().unwrap());
    assert!(case("openai.chat.stream")["output_tokens"].is_null());
    assert_eq!(case("openai.chat.stream.usage")["output_tokens"], 7);
    assert!(
        case("openai.completions.stream")["events"]
            .as_u64()
            .unwrap()
            == 8
    );
    // message_start, content_block_start, 7 deltas, content_block_stop, message_delta,
    // message_stop (the SDK drops `ping`).
    assert_eq!(case("anthropic.messages.stream.raw")["events"], 12);
}
