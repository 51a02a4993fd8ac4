//! A real vLLM server behind the gateway (opt-in: `INFERSCOPE_VLLM_URL=http://127.0.0.1:8001
//! cargo test --features vllm-tests --test vllm`, with the CPU server of `../shared/vllm-cpu/`,
//! model `tiny-llama`; without the URL each test fails): its chat (with
//! `return_token_ids`), completions, Responses and Anthropic Messages streams are classified
//! event by event, and its `/metrics` is scraped into `/stats` under the names the engine
//! module reads.
#![cfg(feature = "vllm-tests")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::Value;

/// The running vLLM's URL.
fn vllm_url() -> String {
    std::env::var("INFERSCOPE_VLLM_URL")
        .expect("set INFERSCOPE_VLLM_URL to a running vLLM (../shared/vllm-cpu/serve.sh)")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dialect_vllm_speaks_is_measured_and_its_metrics_are_read() {
    let url = vllm_url();
    let dir = temp_dir();
    let yaml = format!(
        "access_log: {{ path: {:?} }}\nbackends:\n  - name: vllm\n    url: \"{url}\"\n    provider: vllm\n    metrics: {{ interval: 200ms }}\nroutes:\n  - {{ name: all, backends: [vllm] }}\n",
        dir.join("access.jsonl"),
    );
    let gw = start_yaml(&yaml).await;
    let msg = r#"[{"role":"user","content":"hello there"}]"#;
    let cases = [
        (
            "/v1/chat/completions",
            format!(
                r#"{{"model":"tiny-llama","stream":true,"max_tokens":8,"return_token_ids":true,"messages":{msg}}}"#
            ),
            "exact",
        ),
        (
            "/v1/chat/completions",
            format!(r#"{{"model":"tiny-llama","stream":true,"max_tokens":8,"messages":{msg}}}"#),
            "derived",
        ),
        (
            "/v1/completions",
            r#"{"model":"tiny-llama","stream":true,"max_tokens":8,"prompt":"hello there"}"#
                .to_string(),
            "derived",
        ),
        (
            "/v1/responses",
            r#"{"model":"tiny-llama","stream":true,"max_output_tokens":8,"input":"hello there"}"#
                .to_string(),
            "derived",
        ),
        (
            "/v1/messages",
            format!(r#"{{"model":"tiny-llama","stream":true,"max_tokens":8,"messages":{msg}}}"#),
            "derived",
        ),
    ];
    for (path, body, _) in &cases {
        let r = post(gw.data_addr, path, body, &[]).await;
        assert_eq!(
            r.status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&r.body())
        );
    }
    // A scrape of the engine's /metrics read every series the routing uses.
    let admin = gw.admin_addr;
    until(
        std::time::Duration::from_secs(10),
        "running, waiting, kv_cache_usage and prefill_seconds read from vLLM's /metrics",
        || async move {
            let b = backend_stats(admin, "vllm").await;
            let e = &b["scrape"]["engine"];
            ["running", "waiting", "kv_cache_usage", "prefill_seconds"]
                .iter()
                .all(|k| e[*k].is_number())
        },
    )
    .await;
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), cases.len());
    for ((path, _, event_tokens), l) in cases.iter().zip(&log) {
        assert_eq!(l["outcome"], "ok", "{path}: {l}");
        assert_eq!(l["output_tokens"], 8, "{path}: {l}");
        assert_eq!(l["tokens_source"], "usage", "{path}: {l}");
        assert_eq!(l["event_tokens"], *event_tokens, "{path}: {l}");
        assert_eq!(l["finish_reason"], "length", "{path}: {l}");
        assert!(l["input_tokens"].as_u64().unwrap() > 0, "{path}: {l}");
        assert!(l["ttft_ms"].as_f64().unwrap() > 0.0, "{path}: {l}");
        assert_eq!(l["malformed_events"], 0, "{path}: {l}");
        let _: &Value = l;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_content_event_of_long_vllm_streams_is_read() {
    // 64 tokens a stream: past the second content chunk a stream is read through its own
    // template; each content event the client receives must be one token event of the meter.
    let url = vllm_url();
    let dir = temp_dir();
    let yaml = format!(
        "access_log: {{ path: {:?} }}\nbackends:\n  - {{ name: vllm, url: \"{url}\", provider: vllm }}\nroutes:\n  - {{ name: all, backends: [vllm] }}\n",
        dir.join("access.jsonl"),
    );
    let gw = start_yaml(&yaml).await;
    let msg = r#"[{"role":"user","content":"tell me a story"}]"#;
    let cases = [
        (
            "/v1/chat/completions",
            format!(r#"{{"model":"tiny-llama","stream":true,"max_tokens":64,"messages":{msg}}}"#),
        ),
        (
            "/v1/chat/completions",
            format!(
                r#"{{"model":"tiny-llama","stream":true,"max_tokens":64,"stream_options":{{"include_usage":true,"continuous_usage_stats":true}},"messages":{msg}}}"#
            ),
        ),
        (
            "/v1/completions",
            r#"{"model":"tiny-llama","stream":true,"max_tokens":64,"prompt":"once upon a time"}"#
                .to_string(),
        ),
    ];
    let mut seen = Vec::new();
    for (path, body) in &cases {
        let r = post(gw.data_addr, path, body, &[]).await;
        let text = String::from_utf8(r.body()).unwrap();
        assert_eq!(r.status, 200, "{path}: {text}");
        // The content events as the client got them.
        let mut content = 0;
        for data in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
            let Ok(v) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            let c = &v["choices"][0];
            let piece = c["delta"]["content"].as_str().or(c["text"].as_str());
            content += usize::from(piece.is_some_and(|p| !p.is_empty()));
        }
        seen.push(content);
    }
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), cases.len());
    for (((path, _), content), l) in cases.iter().zip(&seen).zip(&log) {
        assert_eq!(l["outcome"], "ok", "{path}: {l}");
        assert_eq!(l["output_tokens"], 64, "{path}: {l}");
        assert!(*content > 32, "{path}: {content} content events");
        // One gap between each two content events: every one was read.
        assert_eq!(l["itl_ms"]["count"], *content as u64 - 1, "{path}: {l}");
        assert_eq!(l["itl_us"].as_array().unwrap().len(), content - 1, "{path}");
        assert_eq!(l["malformed_events"], 0, "{path}: {l}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn perplexity_reads_vllms_prompt_logprobs() {
    use inferscope::lab::perplexity;
    let url = vllm_url();
    // One real backend as both variants: the same model must score the same text the same.
    let dir = temp_dir();
    let yaml = format!(
        "access_log: {{ path: {:?} }}\nbackends:\n  - {{ name: vllm, url: \"{url}\" }}\nroutes:\n  - name: all\n    experiment:\n      name: same\n      allow_override: true\n      variants:\n        - {{ name: fp16, backends: [vllm], weight: 50, control: true }}\n        - {{ name: int8, backends: [vllm], weight: 50 }}\n",
        dir.join("access.jsonl"),
    );
    let gw = start_yaml(&yaml).await;
    let text = data_file("perplexity-sample.txt");
    let opts = perplexity::PerplexityOptions {
        target: inferscope::lab::eval::EvalTarget {
            url: format!("http://{}", gw.data_addr),
            model: "tiny-llama".into(),
            variants: vec!["fp16".into(), "int8".into()],
            concurrency: 2,
            headers: Vec::new(),
            connector: inferscope::tls::Connector::new(None, std::time::Duration::from_secs(5)),
        },
        window: 300,
        stride: 150,
    };
    let results = perplexity::run(&opts, &text).await.unwrap();
    let report = perplexity::render(&results, &opts);
    println!("{report}");
    let (a, b) = (&results[0], &results[1]);
    // A few hundred tokens of English (vLLM's tokenizer: more tokens than words).
    assert!(a.tokens > 500 && a.tokens == b.tokens, "{report}");
    assert!(a.ppl.is_finite() && a.ppl > 1.0, "{report}");
    assert_eq!(
        a.unit,
        perplexity::Unit::Tokens,
        "vLLM's /tokenize: {report}"
    );
    assert!((a.ppl / b.ppl).ln().abs() < 0.01, "{report}");
    gw.shutdown();
}

/// HumanEval through the gateway to a real vLLM: every problem completed on both variants with
/// the Codex stop sequences honoured by the engine, and every completion run in the sandbox.
/// (The tiny model writes no working code: what is checked is the path, not the score.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn humaneval_completions_from_vllm_are_run_in_the_sandbox() {
    use inferscope::lab::eval;
    let url = vllm_url();
    let dir = temp_dir();
    let yaml = format!(
        "access_log: {{ path: {:?} }}\nbackends:\n  - {{ name: vllm, url: \"{url}\" }}\nroutes:\n  - name: all\n    experiment:\n      name: same\n      allow_override: true\n      variants:\n        - {{ name: fp16, backends: [vllm], weight: 50, control: true }}\n        - {{ name: int8, backends: [vllm], weight: 50 }}\n",
        dir.join("access.jsonl"),
    );
    let gw = start_yaml(&yaml).await;
    let items = eval::load_path(
        std::path::Path::new(&data_file_path("humaneval-sample.jsonl")),
        0,
    )
    .unwrap();
    let opts = eval::EvalOptions {
        target: eval::EvalTarget {
            url: format!("http://{}", gw.data_addr),
            model: "tiny-llama".into(),
            variants: vec!["fp16".into(), "int8".into()],
            concurrency: 4,
            headers: Vec::new(),
            connector: inferscope::tls::Connector::new(None, std::time::Duration::from_secs(5)),
        },
        out: Some(dir.join("items.jsonl")),
        sandbox: Some(std::sync::Arc::new(
            inferscope::lab::sandbox::Sandbox::detect().await.unwrap(),
        )),
        progress: false,
        scoring: inferscope::lab::eval::Scoring::Generate,
    };
    let scores = eval::run(&opts, &items).await;
    println!("{}", eval::render(&scores));
    assert_eq!((scores[0].failed, scores[1].failed), (0, 0));
    // Greedy decoding of one model: both variants answer alike.
    assert_eq!(scores[0].per_item, scores[1].per_item);
    let lines: Vec<Value> = std::fs::read_to_string(dir.join("items.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 24);
    for l in &lines {
        let reply = l["reply"].as_str().unwrap();
        // vLLM stopped at the first four stop sequences (the fifth is cut by eval itself).
        for stop in &eval::CODE_STOP[..4] {
            assert!(!reply.contains(stop), "{stop:?} in {reply:?}");
        }
        // Every failure is the program's own (an exception, a timeout), never the harness's.
        if l["correct"] == false {
            let why = l["why"].as_str().unwrap();
            assert!(!why.starts_with("could not run"), "{why}");
        }
    }
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 24);
    assert!(log
        .iter()
        .all(|l| l["outcome"] == "ok" && l["path"] == "/v1/completions"));
}

/// vLLM's own span of each request (`--otlp-traces-endpoint`, OTLP/gRPC to the admin listener at
/// `INFERSCOPE_VLLM_SPANS_ADMIN`, e.g. `127.0.0.1:9464` with vLLM started by
/// `VLLM_EXTRA_ARGS="--otlp-traces-endpoint http://127.0.0.1:9464 --max-num-seqs 2" serve.sh`,
/// run with `-- --include-ignored`): every request of a
/// burst the engine must queue is joined, its parts add up, and the queue times the gateway
/// joined add up to what vLLM's own queue-time histogram counted over the run (the referee).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs vLLM started with --otlp-traces-endpoint: run with --include-ignored"]
async fn vllms_spans_are_joined_and_their_queue_times_match_its_histogram() {
    let url = vllm_url();
    let admin = std::env::var("INFERSCOPE_VLLM_SPANS_ADMIN")
        .expect("set INFERSCOPE_VLLM_SPANS_ADMIN to the address vLLM sends spans to");
    let dir = temp_dir();
    let yaml = format!(
        "access_log: {{ path: {:?} }}\nbackends:\n  - name: vllm\n    url: \"{url}\"\n    provider: vllm\n    engine_spans: {{ wait: 20s }}\nroutes:\n  - {{ name: all, backends: [vllm] }}\n",
        dir.join("access.jsonl"),
    );
    let cfg = inferscope::config::parse(&yaml, "vllm.yaml").unwrap();
    let any = "127.0.0.1:0".parse().unwrap();
    let gw = inferscope::app::start(
        std::sync::Arc::new(cfg),
        inferscope::app::Overrides {
            listen: Some(any),
            admin: Some(admin.parse().unwrap()),
            config_path: None,
        },
    )
    .await
    .unwrap();
    let queue_sum = || async {
        let text = get_text(&format!("{url}/metrics")).await;
        text.lines()
            .filter(|l| l.starts_with("vllm:request_queue_time_seconds_sum"))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum::<f64>()
    };
    let before = queue_sum().await;
    let n = 12;
    let mut tasks = Vec::new();
    for i in 0..n {
        let addr = gw.data_addr;
        tasks.push(tokio::spawn(async move {
            let body = format!(
                r#"{{"model":"tiny-llama","stream":{},"max_tokens":24,"messages":[{{"role":"user","content":"count to {i}"}}]}}"#,
                i % 3 != 0
            );
            post(addr, "/v1/chat/completions", &body, &[]).await.status
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    let admin_addr = gw.admin_addr;
    until(
        std::time::Duration::from_secs(30),
        "every span joined",
        || async move {
            let (_, s) = admin_get(admin_addr, "/stats").await;
            let s: Value = serde_json::from_str(&s).unwrap();
            s["rollups"]["all"]["cumulative"]["engine_spans"]["joined"] == n
        },
    )
    .await;
    let after = queue_sum().await;
    let lines = stop_and_read_log(gw, &dir).await;
    assert_eq!(lines.len(), n);
    let mut joined_queue = 0.0;
    for l in &lines {
        assert_eq!(l["engine_span"], "joined", "{l}");
        assert_eq!(l["engine_request_id"], l["response_id"], "{l}");
        joined_queue += l["engine_queue_ms"].as_f64().unwrap() / 1000.0;
        let sum = |o: &Value| {
            o.as_object()
                .unwrap()
                .values()
                .map(|v| v.as_f64().unwrap())
                .sum::<f64>()
        };
        let e2e = &l["e2e_parts_ms"];
        assert!(
            (sum(e2e) - l["e2e_ms"].as_f64().unwrap()).abs() <= 0.01,
            "{l}"
        );
        assert!(e2e["rest"].as_f64().unwrap() >= 0.0, "{l}");
        if l["stream"] == true {
            let ttft = &l["ttft_parts_ms"];
            assert!(
                (sum(ttft) - l["ttft_ms"].as_f64().unwrap()).abs() <= 0.01,
                "{l}"
            );
            assert!(ttft["rest"].as_f64().unwrap() >= 0.0, "{l}");
        }
    }
    eprintln!(
        "queue time: joined {joined_queue:.6} s, vLLM's histogram {:.6} s",
        after - before
    );
    assert!(
        (joined_queue - (after - before)).abs() < 1e-3,
        "joined {joined_queue} s vs vLLM's histogram {} s",
        after - before
    );
}

/// A GET's body as text, over a plain HTTP/1.1 connection (`http://host:port/path`).
async fn get_text(url: &str) -> String {
    let uri: http::Uri = url.parse().unwrap();
    let addr = format!("{}:{}", uri.host().unwrap(), uri.port_u16().unwrap_or(80));
    let addr = tokio::net::lookup_host(addr).await.unwrap().next().unwrap();
    let r = Client::connect(addr)
        .await
        .send("GET", uri.path(), "", &[])
        .await;
    String::from_utf8(r.body()).unwrap()
}

/// `inferscope bench` against vLLM directly, its base URL as an OpenAI SDK takes it: with
/// `--ignore-eos` every request gets the tokens it asked for on both OpenAI endpoints, and a
/// model vLLM does not serve fails the run with vLLM's own words.
#[test]
fn bench_against_vllm_gets_the_tokens_it_asks_for_and_says_why_it_failed() {
    let v1 = format!("{}/v1", vllm_url().trim_end_matches('/'));
    let dir = temp_dir();
    // `inferscope bench --url {v1} --model MODEL ARGS`, whatever its exit status.
    let bench = |model: &str, args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_inferscope"))
            .args(["bench", "--url", &v1, "--model", model])
            .args(args)
            .output()
            .unwrap()
    };
    for endpoint in ["chat", "completions"] {
        let file = dir.join(format!("{endpoint}.json"));
        let out = bench(
            "tiny-llama",
            &[
                "--endpoint",
                endpoint,
                "--concurrency",
                "2",
                "--requests",
                "6",
                "--max-tokens",
                "24",
                "--ignore-eos",
                "--engine-info",
                "--out",
                file.to_str().unwrap(),
            ],
        );
        assert!(
            out.status.success(),
            "{endpoint}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(r["successful"], 6, "{endpoint}: {r}");
        assert_eq!(r["total_output_tokens"], 6 * 24, "{endpoint}: {r}");
        assert_eq!(r["requested_output_tokens"], 6 * 24, "{endpoint}: {r}");
        // The engine as vLLM describes itself.
        let e = &r["engine"];
        assert!(e["version"].as_str().is_some_and(|v| !v.is_empty()), "{e}");
        assert_eq!(e["models"][0]["id"], "tiny-llama", "{e}");
        assert!(e["models"][0]["max_model_len"].as_u64().is_some(), "{e}");
        assert!(e["cache_config"]["block_size"].is_string(), "{e}");
        let path = if endpoint == "chat" {
            "chat/completions"
        } else {
            "completions"
        };
        assert_eq!(r["run"]["url"], format!("{v1}/{path}"));
    }
    let out = bench("no-such-model", &["--requests", "2"]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("failed: 2 × status 404") && stdout.contains("no-such-model"),
        "{stdout}"
    );
}

/// The referee: `vllm bench serve` (from the vLLM environment: `INFERSCOPE_VLLM_PYTHON`, by
/// default `~/.cache/vllm-cpu-lab/venv/bin/python`, with the served model's tokenizer,
/// `INFERSCOPE_VLLM_TOKENIZER`, by default `~/.cache/vllm-cpu-lab/models/tiny-llama`) and
/// `inferscope bench` run the same ShareGPT-layout file against the same vLLM, at the same rate
/// and seed, with `--ignore-eos`. Both must keep the same 13 of its 16 conversations (vLLM's
/// filters, lengths by the same tokenizer: vLLM's in-process, ours through `/tokenize`), ask
/// for and get the same output lengths, and land within 25% of each other's TTFT, TPOT, ITL and
/// E2E medians. Why not closer: the two runs are separate (each has its own Poisson arrivals, so
/// its own batches), the client under test is this test build (debug), and vLLM's TPOT runs to the
/// response's end where ours runs to the last token.
#[test]
fn bench_agrees_with_vllm_bench_serve_on_the_same_sharegpt_run() {
    let url = vllm_url().trim_end_matches('/').to_owned();
    let home = std::env::var("HOME").unwrap();
    let python = std::env::var("INFERSCOPE_VLLM_PYTHON")
        .unwrap_or_else(|_| format!("{home}/.cache/vllm-cpu-lab/venv/bin/python"));
    let tokenizer = std::env::var("INFERSCOPE_VLLM_TOKENIZER")
        .unwrap_or_else(|_| format!("{home}/.cache/vllm-cpu-lab/models/tiny-llama"));
    let data = format!(
        "{}/tests/fixtures/workloads/sharegpt.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let dir = temp_dir();
    // vLLM's benchmark as its console script runs it (the script itself needs vLLM's CLI).
    let theirs = succeeds(std::process::Command::new(&python).args([
        "-c",
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n\
                 from vllm.benchmarks.serve import add_cli_args, main\n\
                 import sys\n\
                 p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))",
        "--backend",
        "openai-chat",
        "--base-url",
        &url,
        "--endpoint",
        "/v1/chat/completions",
        "--model",
        "tiny-llama",
        "--tokenizer",
        &tokenizer,
        "--dataset-name",
        "sharegpt",
        "--dataset-path",
        &data,
        "--num-prompts",
        "13",
        "--request-rate",
        "4",
        "--seed",
        "1",
        "--ignore-eos",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        dir.to_str().unwrap(),
        "--result-filename",
        "vllm.json",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
    ]));
    drop(theirs);
    let ours = dir.join("ours.json");
    succeeds(
        std::process::Command::new(env!("CARGO_BIN_EXE_inferscope")).args([
            "bench",
            "--url",
            &format!("{url}/v1"),
            "--model",
            "tiny-llama",
            "--dataset",
            &data,
            "--requests",
            "13",
            "--rate",
            "4",
            "--seed",
            "1",
            "--ignore-eos",
            "--format",
            "vllm",
            "--percentiles",
            "50,99",
            "--out",
            ours.to_str().unwrap(),
        ]),
    );
    let read = |p: std::path::PathBuf| -> Value {
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    };
    let (v, o) = (read(dir.join("vllm.json")), read(ours));
    let sorted = |doc: &Value, key: &str| {
        let mut x: Vec<u64> = doc[key]
            .as_array()
            .unwrap_or_else(|| panic!("{key}: {doc}"))
            .iter()
            .map(|n| n.as_u64().unwrap())
            .collect();
        x.sort_unstable();
        x
    };
    assert_eq!(
        (&v["completed"], &o["completed"]),
        (&Value::from(13), &Value::from(13))
    );
    assert_eq!(sorted(&v, "output_lens"), sorted(&o, "output_lens"));
    assert_eq!(sorted(&v, "input_lens"), sorted(&o, "input_lens"));
    assert_eq!(v["total_output_tokens"], o["total_output_tokens"]);
    let mut lines = Vec::new();
    for m in ["ttft", "tpot", "itl", "e2el"] {
        let key = format!("median_{m}_ms");
        let (a, b) = (v[&key].as_f64().unwrap(), o[&key].as_f64().unwrap());
        lines.push(format!(
            "{key}: vllm {a:.3}, inferscope {b:.3} ({:+.1}%)",
            (b - a) / a * 100.0
        ));
        assert!((b - a).abs() <= 0.25 * a, "{}", lines.join("\n"));
    }
    eprintln!("{}", lines.join("\n"));
}

/// The quality referee: EleutherAI's lm-evaluation-harness (`lm_eval`, `INFERSCOPE_LM_EVAL`, by
/// default `target/lmeval-venv` or on PATH: `pip install "lm-eval[api]" transformers`) with its `local-completions` model
/// and the served model's own tokenizer (`INFERSCOPE_VLLM_TOKENIZER`) scores the shipped MMLU
/// layout set (`data/mmlu`, 5-shot from dev) and a GSM8K split of `data/gsm8k-sample.jsonl` (the
/// first 5 as train, the other 35 as test) against vLLM directly; `inferscope eval --scoring
/// loglikelihood` scores the same files through the gateway. The harness's tasks are its own
/// MMLU template and GSM8K task (`include:`d from the installed package), with the data files
/// local (`dataset_path: json`) and GSM8K's shots the first five (`sampler: first_n`).
///
/// Item by item: every MMLU choice's log-likelihood within 1e-3 of the harness's, the same pick
/// on ≥ 99% of items and the same accuracy; every GSM8K completion the same text, with the same
/// strict and flexible answers and verdicts. Neither adds a start token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_agrees_with_lm_evaluation_harness_item_by_item() {
    let url = vllm_url().trim_end_matches('/').to_owned();
    let home = std::env::var("HOME").unwrap();
    let tokenizer = std::env::var("INFERSCOPE_VLLM_TOKENIZER")
        .unwrap_or_else(|_| format!("{home}/.cache/vllm-cpu-lab/models/tiny-llama"));
    let lm_eval = harness::lm_eval();
    let dir = temp_dir();
    let tasks = harness::write_tasks(&lm_eval, &dir);
    let (subjects, offsets) = (harness::SUBJECTS, &tasks.offsets);
    let (mmlu, gsm) = (
        std::path::PathBuf::from(data_file_path("mmlu")),
        tasks.gsm8k.clone(),
    );
    // The harness, straight to vLLM, one request at a time.
    let harness_out = dir.join("harness");
    let started = std::time::Instant::now();
    let table = harness::run(
        &lm_eval,
        &tasks,
        &harness_out,
        Some(&format!("model=tiny-llama,base_url={url}/v1/completions,tokenizer_backend=huggingface,tokenizer={tokenizer},num_concurrent=1")),
    );
    println!(
        "lm_eval took {:.0} s\n{table}",
        started.elapsed().as_secs_f64()
    );
    let samples = |task: &str| harness::samples(&harness_out, task);

    // inferscope, through the gateway.
    let yaml = format!(
        "access_log: {{ path: {:?} }}\nbackends:\n  - {{ name: vllm, url: \"{url}\" }}\nroutes:\n  - {{ name: all, backends: [vllm] }}\n",
        dir.join("access.jsonl"),
    );
    let gw = start_yaml(&yaml).await;
    let eval = |dataset: std::path::PathBuf, out: std::path::PathBuf| {
        let gateway = format!("http://{}", gw.data_addr);
        tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let run = succeeds(
                std::process::Command::new(env!("CARGO_BIN_EXE_inferscope")).args([
                    "eval",
                    "--url",
                    &gateway,
                    "--model",
                    "tiny-llama",
                    "--variants",
                    "vllm",
                    "--scoring",
                    "loglikelihood",
                    "--dataset",
                    dataset.to_str().unwrap(),
                    "--out",
                    out.to_str().unwrap(),
                    "--json",
                ]),
            );
            println!(
                "inferscope eval took {:.0} s",
                started.elapsed().as_secs_f64()
            );
            let summary: Value = serde_json::from_slice(&run.stdout).unwrap();
            let lines: Vec<Value> = std::fs::read_to_string(&out)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            (summary, lines)
        })
    };
    let (mmlu_summary, ours) = eval(mmlu, dir.join("mmlu-items.jsonl")).await.unwrap();
    assert_eq!(mmlu_summary["scoring"], "loglikelihood", "{mmlu_summary}");
    assert_eq!(mmlu_summary["metric"], "acc", "{mmlu_summary}");
    let float = |v: &Value| -> f64 {
        v.as_f64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .unwrap()
    };
    // MMLU: log-likelihoods, picks and accuracy per subject.
    let (mut same, mut total, mut worst) = (0, 0, 0.0f64);
    let mut differ = Vec::new();
    for (s, offset) in subjects.iter().zip(offsets) {
        let theirs = samples(&format!("isc_mmlu_{s}"));
        let (mut right_theirs, mut right_ours) = (0, 0);
        for t in &theirs {
            let doc = harness::doc_id(t);
            let o = ours
                .iter()
                .find(|o| o["index"] == offset + doc)
                .unwrap_or_else(|| panic!("{s} item {doc}: not in our --out"));
            let lls_theirs: Vec<f64> = t["filtered_resps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| float(&r[0]))
                .collect();
            let lls_ours: Vec<f64> = o["loglikelihoods"]
                .as_array()
                .unwrap()
                .iter()
                .map(float)
                .collect();
            assert_eq!(lls_ours.len(), lls_theirs.len(), "{s} item {doc}");
            for (a, b) in lls_ours.iter().zip(&lls_theirs) {
                worst = worst.max((a - b).abs());
            }
            let acc_theirs = float(&t["acc"]) == 1.0;
            let acc_ours = o["correct"] == true;
            right_theirs += usize::from(acc_theirs);
            right_ours += usize::from(acc_ours);
            total += 1;
            if acc_theirs == acc_ours {
                same += 1;
            } else {
                differ.push(format!(
                    "{s} item {doc}: harness {lls_theirs:?} vs ours {lls_ours:?}"
                ));
            }
        }
        println!(
            "MMLU {s}: harness acc {right_theirs}/{n}, inferscope acc {right_ours}/{n}",
            n = theirs.len()
        );
        assert_eq!(right_theirs, right_ours, "{s}: {differ:?}");
    }
    println!(
        "MMLU: {same}/{total} items scored alike; largest log-likelihood difference {worst:.2e}; differing: {differ:?}"
    );
    assert!(same * 100 >= total * 99, "{differ:?}");
    assert!(worst < 1e-3, "log-likelihoods differ by up to {worst}");

    // GSM8K: the completion, both extractions and both verdicts.
    let (gsm_summary, ours) = eval(gsm, dir.join("gsm8k-items.jsonl")).await.unwrap();
    assert_eq!(gsm_summary["metric"], "strict-match", "{gsm_summary}");
    let theirs = samples("isc_gsm8k");
    let (mut texts, mut answers, mut n) = (0, 0, 0);
    let mut right = [[0usize; 2]; 2];
    for t in &theirs {
        let doc = harness::doc_id(t);
        let o = ours.iter().find(|o| o["index"] == doc).unwrap();
        let which = usize::from(t["filter"] == "flexible-extract");
        let completion = t["resps"][0][0].as_str().unwrap();
        let extracted = t["filtered_resps"][0].as_str().unwrap();
        let em = float(&t["exact_match"]) == 1.0;
        let verdict_ours = if which == 0 {
            o["correct"] == true
        } else {
            o["also"][0] == true
        };
        right[0][which] += usize::from(em);
        right[1][which] += usize::from(verdict_ours);
        n += 1;
        texts += usize::from(o["reply"].as_str() == Some(completion));
        answers += usize::from(o["extracted"][which].as_str() == Some(extracted));
        assert_eq!(em, verdict_ours, "GSM8K item {doc} ({}): {t}", t["filter"]);
    }
    println!(
        "GSM8K: {texts}/{n} completions and {answers}/{n} extracted answers identical; strict-match harness {} ours {}, flexible-extract harness {} ours {}",
        right[0][0], right[1][0], right[0][1], right[1][1]
    );
    assert_eq!(texts, n);
    assert_eq!(answers, n);
    gw.shutdown();
}
