//! Config files: every shipped example parses; errors name the file, the line and the key.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use inferscope::config::{self, parse};

#[test]
fn every_shipped_config_parses() {
    let mut n = 0;
    for entry in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/config")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).unwrap();
            parse(&text, &path.display().to_string()).unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
    }
    assert!(n >= 2, "config/ holds the default and the vLLM example");
    assert_eq!(
        config::DEFAULT_YAML,
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/default.yaml"))
            .unwrap()
    );
}

const BASE: &str = "\
backends:
  - { name: a, url: \"http://127.0.0.1:1\" }
routes:
  - name: r
    match: { model: m }
    backends: [a]
";

#[test]
fn unknown_key_is_rejected_with_line_and_key() {
    let text = BASE.replace("match: { model: m }", "match: { modle: m }");
    let e = parse(&text, "gw.yaml").unwrap_err();
    assert_eq!(e.line, Some(5), "{e}");
    assert_eq!(e.key, "routes[0].match.modle");
    assert!(e.message.starts_with("unknown field `modle`"), "{e}");
    assert!(e.to_string().starts_with("gw.yaml:5:"), "{e}");
}

/// The YAML parser also breaks lines at `\r`, U+0085, U+2028 and U+2029; the line and column an
/// error names are the ones an editor and `sed -n Np` show, which break at `\n` only.
#[test]
fn lines_are_counted_as_editors_count_them() {
    let bad = BASE.replace("match: { model: m }", "match: { modle: m }");
    for (text, what) in [
        (
            format!("# a note\u{85}# after a next-line character\n{bad}"),
            "U+0085",
        ),
        (
            format!("# a note\u{2028}# after a line separator\n{bad}"),
            "U+2028",
        ),
        (bad.replace('\n', "\r\n"), "CRLF"),
    ] {
        let e = parse(&text, "gw.yaml").unwrap_err();
        let want = if what == "CRLF" { 5 } else { 6 };
        assert_eq!(e.line, Some(want), "{what}: {e}");
        let shown = text.split('\n').nth(want - 1).unwrap();
        let column = e.column.unwrap();
        let at: String = shown.chars().skip(column - 1).take(5).collect();
        assert_eq!(at, "modle", "{what}: column {column} of {shown:?}: {e}");
    }
}

/// `experiment.accept:` needs a limit, and only numbers; an unknown key is named.
#[test]
fn accept_limits_are_checked_where_they_are_written() {
    let exp = "\
backends:
  - { name: a, url: \"http://127.0.0.1:1\" }
routes:
  - name: r
    experiment:
      name: x
      ACCEPT
      variants:
        - { name: a, backends: [a], weight: 1, control: true }
";
    let ok = exp.replace(
        "ACCEPT",
        "accept: { tpot_change_max: -10, ppl_rise_max: 0.5 }",
    );
    let c = parse(&ok, "gw.yaml").unwrap();
    let a = c.routes[0]
        .experiment
        .as_ref()
        .unwrap()
        .accept
        .clone()
        .unwrap();
    assert_eq!(
        (a.tpot_change_max, a.ppl_rise_max, a.ttft_change_max),
        (Some(-10.0), Some(0.5), None)
    );
    for (accept, key, why) in [
        (
            "accept: {}",
            "routes[0].experiment.accept",
            "set at least one of",
        ),
        (
            "accept: { ppl_rise_max: .nan }",
            "routes[0].experiment.accept.ppl_rise_max",
            "not a number",
        ),
        (
            "accept: { accuracy_drop_max: 1 }",
            "routes[0].experiment.accept.accuracy_drop_max",
            "unknown field",
        ),
    ] {
        let e = parse(&exp.replace("ACCEPT", accept), "gw.yaml").unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (Some(7), key), "{e}");
        assert!(e.message.contains(why), "{e}");
    }
}

/// A backend's `price:` is one number of the two kinds, 0 or more.
#[test]
fn a_price_is_one_number_of_one_kind() {
    for (price, why) in [
        ("{}", "give exactly one of"),
        (
            "{ per_gpu_hour: 2, per_million_output_tokens: 1 }",
            "give exactly one of",
        ),
        ("{ per_gpu_hour: -1 }", "0 or more"),
        ("{ per_hour: 2 }", "unknown field `per_hour`"),
        ("{ per_gpu_hour: 2, currency: dollars }", "ISO 4217"),
    ] {
        let text = BASE.replace(
            "url: \"http://127.0.0.1:1\" }",
            &format!("url: \"http://127.0.0.1:1\", price: {price} }}"),
        );
        let e = parse(&text, "gw.yaml").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.key.starts_with("backends[0].price"), "{e}");
        assert!(e.message.contains(why), "{price}: {e}");
    }
}

#[test]
fn wrong_type_names_the_key() {
    let text = format!("{BASE}limits:\n  max_concurrent_requests: lots\n");
    let e = parse(&text, "gw.yaml").unwrap_err();
    assert_eq!(
        (e.line, e.key.as_str()),
        (Some(8), "limits.max_concurrent_requests"),
        "{e}"
    );
    let text = format!("{BASE}limits:\n  connect_timeout: 5 parsecs\n");
    let e = parse(&text, "gw.yaml").unwrap_err();
    assert_eq!(
        (e.line, e.key.as_str()),
        (Some(8), "limits.connect_timeout"),
        "{e}"
    );
    assert!(e.message.contains("unknown unit"), "{e}");
}

#[test]
fn validation_errors_point_at_the_offending_line() {
    let text = BASE.replace("backends: [a]", "backends:\n      - a\n      - b");
    let e = parse(&text, "gw.yaml").unwrap_err();
    assert_eq!(
        (e.line, e.key.as_str()),
        (Some(8), "routes[0].backends[1]"),
        "{e}"
    );
    assert!(e.message.contains("unknown backend `b`"));

    let text = BASE.replace("http://127.0.0.1:1", "ftp://x");
    let e = parse(&text, "gw.yaml").unwrap_err();
    assert_eq!(
        (e.line, e.key.as_str()),
        (Some(2), "backends[0].url"),
        "{e}"
    );

    for (slo, why) in [
        ("{}", "set at least one of ttft"),
        ("{ ttft: 0s }", "can never be met"),
    ] {
        let text = BASE.replace("backends: [a]", &format!("backends: [a]\n    slo: {slo}"));
        let e = parse(&text, "gw.yaml").unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (Some(7), "routes[0].slo"), "{e}");
        assert!(e.message.contains(why), "{e}");
    }
    let text = BASE.replace(
        "backends: [a]",
        "backends: [a]\n    slo: { ttft: 200ms, p99: 1s }",
    );
    let e = parse(&text, "gw.yaml").unwrap_err();
    assert!(e.message.contains("unknown field `p99`"), "{e}");

    for (metrics, key, why) in [
        ("{ url: metrics }", "backends[0].metrics", "neither a path"),
        ("{ url: null }", "backends[0].metrics", "nothing to scrape"),
        ("{ interval: 0s }", "backends[0].metrics", "greater than 0"),
        // Parsed while read: the parser's own line and column, and the key itself.
        (
            "{ gpu_url: \"ftp://x/metrics\" }",
            "backends[0].metrics.gpu_url",
            "neither a path",
        ),
    ] {
        let text = BASE.replace(
            "url: \"http://127.0.0.1:1\" }",
            &format!("url: \"http://127.0.0.1:1\", metrics: {metrics} }}"),
        );
        let e = parse(&text, "gw.yaml").unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (Some(2), key), "{e}");
        assert!(e.message.contains(why), "{e}");
    }

    if !cfg!(feature = "nvml") {
        let text = BASE.replace(
            "url: \"http://127.0.0.1:1\" }",
            "url: \"http://127.0.0.1:1\", metrics: { gpu_url: nvml } }",
        );
        let e = parse(&text, "gw.yaml").unwrap_err();
        assert_eq!(e.key.as_str(), "backends[0].metrics.gpu_url", "{e}");
        assert!(e.message.contains("--features nvml"), "{e}");
    }
    for (extra, key, why) in [
        (
            "model: { params_b: 8 }",
            "backends[0].model",
            "needs `gpu:` too",
        ),
        (
            "gpu: { preset: h100 }",
            "backends[0].gpu",
            "needs `model:` too",
        ),
        (
            "model: { params_b: 8 }, gpu: { preset: b300 }",
            "backends[0].gpu",
            "none of a100, h100, h200, l4, l40s",
        ),
        (
            "model: { params_b: 8 }, gpu: { tflops: 100 }",
            "backends[0].gpu",
            "both hbm_gb_s and tflops",
        ),
        (
            "model: { params_b: -1 }, gpu: { preset: l4 }",
            "backends[0].model",
            "must be positive",
        ),
    ] {
        let text = BASE.replace(
            "url: \"http://127.0.0.1:1\" }",
            &format!("url: \"http://127.0.0.1:1\", {extra} }}"),
        );
        let e = parse(&text, "gw.yaml").unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (Some(2), key), "{e}");
        assert!(e.message.contains(why), "{e}");
    }
    let fine = BASE.replace(
        "url: \"http://127.0.0.1:1\" }",
        "url: \"http://127.0.0.1:1\", model: { params_b: 8, bytes_per_param: 1, kv_bytes_per_token: 131072 }, gpu: { preset: H100, count: 2 } }",
    );
    assert!(parse(&fine, "gw.yaml").is_ok());

    let two_controls = "\
backends:
  - { name: a, url: \"http://127.0.0.1:1\" }
routes:
  - name: r
    experiment:
      name: x
      variants:
        - { name: p, backends: [a], weight: 1, control: true }
        - { name: q, backends: [a], weight: 1, control: true }
";
    // A cross-field check is located by the parser's marks too: the key, line and column.
    let e = parse(two_controls, "gw.yaml").unwrap_err();
    assert_eq!(
        (e.line, e.column, e.key.as_str()),
        (Some(7), Some(7), "routes[0].experiment.variants"),
        "{e}"
    );
    let unknown = two_controls.replacen(
        "backends: [a], weight: 1, control: true }\n        - { name: q, backends: [a]",
        "backends: [a], weight: 1, control: true }\n        - { name: q, backends: [a, zz]",
        1,
    );
    let e = parse(&unknown, "gw.yaml").unwrap_err();
    assert_eq!(
        (e.line, e.column, e.key.as_str()),
        (
            Some(9),
            Some(36),
            "routes[0].experiment.variants[1].backends[1]"
        ),
        "{e}"
    );
    // The small languages are read as the YAML is: a wrong value is refused at its own line,
    // column and key.
    let one = two_controls.replacen(", control: true }", " }", 1);
    for (line, text, value, key, why) in [
        (
            7,
            "      sticky_key: \"cookie:uid\"\n",
            "\"cookie:uid\"",
            "routes[0].experiment.sticky_key",
            "use `header:NAME`, `api_key` or `body:user`",
        ),
        (
            7,
            "      guardrails: { rules: [{ metric: ttft_p98_ms, max: 1 }] }\n",
            "ttft_p98_ms",
            "routes[0].experiment.guardrails.rules[0].metric",
            "use ttft_p99_ms",
        ),
    ] {
        let yaml = one.replace("      variants:\n", &format!("{text}      variants:\n"));
        let e = parse(&yaml, "gw.yaml").unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (Some(line), key), "{e}");
        // The column is the value's own.
        let at = e
            .column
            .map(|c| yaml.lines().nth(line - 1).unwrap()[c - 1..].to_string());
        assert!(at.as_deref().is_some_and(|v| v.starts_with(value)), "{e}");
        assert!(e.message.contains(why), "{e}");
    }
    let fine = one.replace(
        "      variants:\n",
        "      sticky_key: \"header:X-User\"\n      guardrails: { rules: [{ metric: \"feedback:thumbs\", min: 0.5 }] }\n      variants:\n",
    );
    let c = parse(&fine, "gw.yaml").unwrap();
    let x = c.routes[0].experiment.as_ref().unwrap();
    assert_eq!(
        x.sticky_key,
        Some(config::StickyKey::Header(http::HeaderName::from_static(
            "x-user"
        )))
    );
    assert_eq!(
        x.guardrails.as_ref().unwrap().rules[0].metric,
        config::GuardMetric::Feedback("thumbs".into())
    );
}

#[test]
fn check_schema_prints_the_schema_of_the_config_types() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inferscope"))
        .args(["check", "--schema"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed, config::json_schema());
    assert_eq!(
        printed["properties"]["listen"]["default"], "127.0.0.1:8080",
        "defaults come from the types"
    );
}

#[test]
fn check_command_reports_file_line_and_key() {
    let dir = std::env::temp_dir().join(format!("inferscope-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.yaml");
    std::fs::write(
        &bad,
        BASE.replace("backends: [a]", "backends: [a]\n    retries: 3"),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inferscope"))
        .arg("check")
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:7:", bad.display()))
            && err.contains("routes[0]")
            && err.contains("retries"),
        "{err}"
    );
    // The shipped example, with its log in a directory that exists here.
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/vllm-two-backends.yaml"
    ))
    .unwrap()
    .replace(
        "/var/log/inferscope/access.jsonl",
        &dir.join("access.jsonl").display().to_string(),
    );
    let good = dir.join("good.yaml");
    std::fs::write(&good, &example).unwrap();
    let key_line = 1 + example
        .lines()
        .position(|l| l.contains("api_key_env: INT8_KEY"))
        .unwrap();
    let log_line = 1 + example
        .lines()
        .position(|l| l.starts_with("access_log:"))
        .unwrap();
    let check = |file: &std::path::Path, key: Option<&str>| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_inferscope"));
        c.arg("check").arg(file).env_remove("INT8_KEY");
        if let Some(k) = key {
            c.env("INT8_KEY", k);
        }
        c.output().unwrap()
    };
    let out = check(&good, Some("secret"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // What `serve` would refuse, `check` refuses too: the key's variable unset…
    let out = check(&good, None);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:{key_line}:", good.display()))
            && err.contains("backends[1].api_key_env")
            && err.contains("INT8_KEY is not set"),
        "{err}"
    );
    // … and an access log that is a directory.
    let is_dir = dir.join("dir.yaml");
    std::fs::write(
        &is_dir,
        example.replace(
            &dir.join("access.jsonl").display().to_string(),
            &dir.display().to_string(),
        ),
    )
    .unwrap();
    let out = check(&is_dir, Some("secret"));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(":{log_line}:"))
            && err.contains("access_log.path")
            && err.contains("is a directory"),
        "{err}"
    );
}

#[test]
fn telemetry_section_is_validated() {
    let text = format!(
        "{BASE}telemetry:\n  otlp: {{ endpoint: \"http://127.0.0.1:4317\", protocol: thrift }}\n"
    );
    let e = parse(&text, "gw.yaml").unwrap_err();
    assert_eq!((e.line, e.key.as_str()), (Some(7), "telemetry"), "{e}");
    assert!(e.message.contains("thrift"), "{e}");
    let text = format!("{BASE}telemetry:\n  sample_ratio: 1.5\n  otlp: {{ endpoint: \"http://127.0.0.1:4317\" }}\n");
    assert!(parse(&text, "gw.yaml")
        .unwrap_err()
        .message
        .contains("between 0 and 1"));
    let text = format!("{BASE}telemetry:\n  capture_contents: true\n");
    let e = parse(&text, "gw.yaml").unwrap_err();
    assert_eq!(e.line, Some(8), "{e}");
    assert!(
        e.message.contains("unknown field `capture_contents`"),
        "{e}"
    );
}

#[test]
fn tls_keys_and_limits_are_validated_where_they_are_written() {
    let base = "\
backends:
  - name: a
    url: \"http://127.0.0.1:1\"
    tls: { ca_file: ca.pem }
routes:
  - { name: r, backends: [a] }
";
    let e = parse(base, "gw.yaml").unwrap_err();
    assert_eq!(
        (e.line, e.key.as_str()),
        (Some(4), "backends[0].tls"),
        "{e}"
    );
    assert!(e.message.contains("needs https://"), "{e}");
    let https = base.replace("http://", "https://");
    assert!(
        parse(&https, "gw.yaml").is_ok(),
        "https with a path-less URL"
    );
    let with_root = https.replace(":1\"", ":1/api/v1\"");
    assert!(
        parse(&with_root, "gw.yaml").is_ok(),
        "an API root path is allowed"
    );
    let two_sources =
        format!("{https}auth:\n  keys:\n    - {{ name: k, key_env: A, key_file: f }}\n");
    let e = parse(&two_sources, "gw.yaml").unwrap_err();
    assert_eq!(e.key, "auth.keys[0].name", "{e}");
    assert!(e.message.contains("exactly one"), "{e}");
    let unknown_key = format!(
        "{https}auth:\n  keys:\n    - {{ name: k, key_env: A }}\nrate_limits:\n  keys:\n    other: {{ requests_per_minute: 1 }}\n"
    );
    let e = parse(&unknown_key, "gw.yaml").unwrap_err();
    assert_eq!(
        (e.line, e.key.as_str()),
        (Some(11), "rate_limits.keys"),
        "{e}"
    );
    assert!(e.message.contains("no key named `other`"), "{e}");
    let per_key_without_auth =
        format!("{https}rate_limits:\n  per_key: {{ tokens_per_minute: 100 }}\n");
    let e = parse(&per_key_without_auth, "gw.yaml").unwrap_err();
    assert_eq!(e.key, "rate_limits.per_key", "{e}");

    // `check` loads the TLS material as `serve` would: a missing file names the key and file.
    let dir = std::env::temp_dir().join(format!("inferscope-cfg-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("gw.yaml");
    std::fs::write(
        &file,
        format!(
            "tls:\n  cert: {:?}\n  key: {:?}\n{base}",
            dir.join("none.pem"),
            dir.join("none.key")
        )
        .replace(
            "url: \"http://127.0.0.1:1\"\n    tls: { ca_file: ca.pem }",
            "url: \"http://127.0.0.1:1\"",
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inferscope"))
        .arg("check")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(":1:") && err.contains("tls") && err.contains("none.pem"),
        "{err}"
    );
}

/// A referee for the published schema: Python's `jsonschema` (Draft 7, as editors' YAML language
/// servers read it) accepts every shipped config and the full example, and refuses what `parse`
/// refuses for its shape (an unknown key, a wrong sticky key, a list where a table belongs).
/// `.ci/run` installs both into `target/sdk-venv`; elsewhere set `INFERSCOPE_SDK_PYTHON`.
#[test]
#[ignore = "needs python jsonschema and pyyaml"]
fn python_jsonschema_agrees_with_the_published_schema() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let py = std::env::var_os("INFERSCOPE_SDK_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root.join("target/sdk-venv/bin/python"));
    let dir = std::env::temp_dir().join(format!("inferscope-schema-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut good: Vec<std::path::PathBuf> = std::fs::read_dir(root.join("config"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    good.push(root.join("tests/golden/full-config.yaml"));
    let mut bad = Vec::new();
    for (name, from, to) in [
        ("unknown-key.yaml", "backends: [a]", "backends: [a]\n    retries: 3"),
        (
            "sticky.yaml",
            "backends: [a]",
            "experiment: { name: x, sticky_key: \"cookie:u\", variants: [{ name: a, backends: [a], weight: 1, control: true }] }",
        ),
        ("list.yaml", "match: { model: m }", "match: [m]"),
    ] {
        let text = BASE.replace(from, to);
        assert!(parse(&text, name).is_err(), "parse refuses {name}");
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        bad.push(path);
    }
    let script = r#"
import json, sys, yaml, jsonschema
schema = json.load(open(sys.argv[1]))
jsonschema.Draft7Validator.check_schema(schema)
v = jsonschema.Draft7Validator(schema)
for path in sys.argv[2:]:
    errors = list(v.iter_errors(yaml.safe_load(open(path))))
    print(path, "ok" if not errors else "refused: " + errors[0].message)
"#;
    let out = std::process::Command::new(&py)
        .arg("-c")
        .arg(script)
        .arg(root.join("docs/reference/config.schema.json"))
        .args(&good)
        .args(&bad)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (.ci/run installs it)", py.display()));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}: {}",
        py.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    for p in &good {
        let line = format!("{} ok", p.display());
        assert!(text.lines().any(|l| l == line), "{line}\n{text}");
    }
    for p in &bad {
        let refused = format!("{} refused", p.display());
        assert!(
            text.lines().any(|l| l.starts_with(&refused)),
            "{refused}\n{text}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A usage error exits 64 in every command — never a code a command gives a decision
/// (`verdict`'s 2 is "undecided, wait"); `--help` exits 0. The table is in `inferscope --help`.
#[test]
fn usage_errors_have_an_exit_status_of_their_own() {
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_inferscope"))
            .args(args)
            .output()
            .unwrap()
    };
    for args in [
        &["verdict", "--no-such-flag"][..],
        &["bench", "--rate", "fast"],
        &["report"],
        &["eval", "--concurrency"],
        &[],
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {:?}", out);
    }
    assert_eq!(run(&["verdict", "--help"]).status.code(), Some(0));
    let help = String::from_utf8(run(&["--help"]).stdout).unwrap();
    assert!(help.contains("64  usage"), "{help}");
}
