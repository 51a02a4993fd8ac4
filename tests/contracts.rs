//! The names users depend on, pinned: CLI commands and flags, config keys, access-log fields,
//! `/stats` and `/experiments` keys, `/metrics` series and labels, OpenTelemetry span and metric
//! names and attributes. Each is compared with a file under `tests/golden/`; a change that renames
//! or drops one fails here. After an intended, documented change, regenerate with
//! `UPDATE_GOLDEN=1 cargo test --test contracts` and review the diff.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use clap::CommandFactory;
use common::otlp::*;
use common::*;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;

fn golden_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name)
}

/// Compares `lines` with the golden file `name` (or rewrites it under `UPDATE_GOLDEN=1`).
fn golden(name: &str, lines: &BTreeSet<String>) {
    let actual: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let path = golden_path(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &actual).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    let want: BTreeSet<String> = want.lines().map(str::to_owned).collect();
    let missing: Vec<&String> = want.difference(lines).collect();
    let added: Vec<&String> = lines.difference(&want).collect();
    assert!(
        missing.is_empty() && added.is_empty(),
        "{name} changed.\n  gone: {missing:?}\n  new:  {added:?}\n(intended? UPDATE_GOLDEN=1 cargo test --test contracts, and document it)"
    );
}

/// Compares the generated reference page `docs/reference/NAME` with `text` (or rewrites it under
/// `UPDATE_GOLDEN=1`): the references are written from the code, never by hand.
fn reference(name: &str, text: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("docs/reference")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    if want != text {
        let at = want
            .lines()
            .zip(text.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(want.lines().count().min(text.lines().count()));
        panic!(
            "docs/reference/{name} is out of date from line {} (UPDATE_GOLDEN=1 cargo test --test contracts)",
            at + 1
        );
    }
}

/// Every key path of a JSON document (`a.b`, arrays as `a[]`), leaves and objects alike.
fn key_paths(v: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                // Map keys that are data (group names, outcomes by name) are not contracts
                // unless they are one of a fixed set; callers pass such documents through `fixed`.
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.insert(p.clone());
                key_paths(x, &p, out);
            }
        }
        Value::Array(a) => {
            for x in a {
                key_paths(x, &format!("{prefix}[]"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn cli_commands_and_flags() {
    let mut lines = BTreeSet::new();
    let cmd = inferscope::cli::Cli::command();
    for sub in cmd.get_subcommands() {
        lines.insert(sub.get_name().to_string());
        for a in sub.get_arguments() {
            let name = match (a.get_long(), a.is_positional()) {
                (Some(l), _) => format!("--{l}"),
                (None, true) => format!("<{}>", a.get_id()),
                (None, false) => continue,
            };
            lines.insert(format!("{} {name}", sub.get_name()));
        }
    }
    golden("cli.txt", &lines);

    // The reference: each command's own long help, as `inferscope help CMD` prints it.
    let mut page = String::from(
        "# Command-line reference\n\nGenerated from the code (`UPDATE_GOLDEN=1 cargo test --test contracts`): each\ncommand's `--help`.\n",
    );
    let mut cmd = inferscope::cli::Cli::command().term_width(100);
    cmd.build();
    page.push_str(&format!(
        "\n## inferscope\n\n```text\n{}```\n",
        cmd.render_long_help()
    ));
    for sub in cmd.get_subcommands_mut() {
        let help = sub.render_long_help().to_string();
        page.push_str(&format!(
            "\n## inferscope {}\n\n```text\n{}```\n",
            sub.get_name(),
            help.trim_end().to_string() + "\n"
        ));
    }
    let page: String = page
        .lines()
        .map(|l| format!("{}\n", l.trim_end()))
        .collect();
    reference("cli.md", &page);
}

#[test]
fn cli_output_shapes() {
    let mut lines = BTreeSet::new();
    // `check`: one line naming the file and what it holds.
    let default = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/default.yaml");
    let out = run_cli(&["check"], &default);
    let text = String::from_utf8(out.stdout).unwrap();
    let shape = text.replace(&default.display().to_string(), "FILE");
    lines.insert(format!("check: {}", shape.trim_end()));
    // `bench`: the JSON report's keys (`--out`, and the rows of `--sweep`).
    let samples = [inferscope::lab::loadgen::Sample {
        status: 200,
        complete: true,
        ttft: Some(10.0),
        ttfc: Some(1.0),
        tpot: Some(2.0),
        itl: vec![2.0],
        e2e: 12.0,
        input_tokens: 3,
        output_tokens: 2,
        max_tokens: 2,
        purpose_taken: false,
        failure: None,
        via_gateway: false,
        sent_s: 0.0,
        excluded: false,
        vllm: None,
    }];
    let report =
        inferscope::lab::loadgen::summarize(&samples, std::time::Duration::from_secs(1), &[]);
    let mut keys = BTreeSet::new();
    key_paths(&serde_json::to_value(&report).unwrap(), "", &mut keys);
    lines.extend(keys.into_iter().map(|k| format!("bench json: {k}")));
    golden("cli-output.txt", &lines);
}

#[test]
fn every_config_key_still_parses() {
    let path = golden_path("full-config.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let cfg = inferscope::config::parse(&text, "full-config.yaml").unwrap_or_else(|e| {
        panic!("a documented config key no longer parses: {e}");
    });
    assert_eq!(cfg.backends.len(), 2);
    assert_eq!(cfg.routes.len(), 2);
    // The file sets every key: list them, so an added key is a deliberate addition here too.
    let yaml: Value = serde_yaml_ng::from_str(&text).unwrap();
    let mut lines = BTreeSet::new();
    key_paths(&yaml, "", &mut lines);
    // Free-form maps (header names, resource attributes) are data, not keys.
    lines.retain(|l| {
        !(l.starts_with("telemetry.otlp.headers.") || l.starts_with("telemetry.resource."))
    });
    golden("config-keys.txt", &lines);
}

/// A gateway with an experiment (shadowed), a retried route and a route to nowhere, and an OTLP
/// receiver; one request of each kind; everything it reported.
struct Reported {
    log: Vec<Value>,
    stats: Value,
    experiments: Value,
    metrics: String,
    collected: Collected,
}

async fn report_everything() -> Reported {
    let a = start_sim(exact(2.0, 1.0), 1).await;
    let b = start_sim(exact(2.0, 1.0), 2).await;
    let (otlp, collected) = start_grpc().await;
    let dir = temp_dir();
    let dead = DEAD;
    let yaml = format!(
        "access_log: {{ path: {:?} }}\nbackends:\n  - {{ name: a, url: \"http://{}\", provider: vllm }}\n  - {{ name: b, url: \"http://{}\" }}\n  - {{ name: dead, url: \"http://{dead}\" }}\nroutes:\n  - name: chat\n    match: {{ model: demo }}\n    slo: {{ ttft: 10s, tpot: 1s, itl: 1s, e2e: 30s }}\n    experiment:\n      name: x\n      sticky_key: \"header:x-user-id\"\n      min_samples: 1\n      guardrails: {{ rules: [{{ variant: b, metric: ttft_p99_ms, max: 10000 }}] }}\n      shadow: {{ variant: b, fraction: 1.0 }}\n      accept: {{ accuracy_drop_max_points: 1.0 }}\n      on_accept: promote\n      variants:\n        - {{ name: a, backends: [a], weight: 50, control: true }}\n        - {{ name: b, backends: [b], weight: 50 }}\n  - name: retried\n    match: {{ model: retried }}\n    backends: [dead, a]\n    balancer: round_robin\n    retry: {{ attempts: 1 }}\n  - name: nowhere\n    match: {{ path_prefix: /v1/models }}\n    backends: [dead]\ntelemetry:\n  otlp: {{ endpoint: \"http://{otlp}\", protocol: grpc, timeout: 5s }}\n  batch: {{ interval: 50ms }}\n  metrics_interval: 60s\n",
        dir.join("access.jsonl"),
        a.addr,
        b.addr
    );
    let gw = start_yaml(&yaml).await;
    for user in ["u1", "u2", "u3", "u4"] {
        let r = post(
            gw.data_addr,
            "/v1/chat/completions",
            &chat(true, 4, ""),
            &[("x-user-id", user)],
        )
        .await;
        assert_eq!(r.status, 200);
    }
    let plain = chat(false, 4, "");
    assert_eq!(
        post(gw.data_addr, "/v1/chat/completions", &plain, &[])
            .await
            .status,
        200
    );
    let retried = r#"{"model":"retried","stream":true,"max_tokens":2,"messages":[]}"#;
    for _ in 0..2 {
        post(gw.data_addr, "/v1/chat/completions", retried, &[]).await;
    }
    let unrouted = r#"{"model":"none","messages":[]}"#;
    assert_eq!(
        post(gw.data_addr, "/v1/completions", unrouted, &[])
            .await
            .status,
        404
    );
    let failed = Client::connect(gw.data_addr)
        .await
        .send("GET", "/v1/models", "", &[])
        .await;
    assert_eq!(failed.status, 502);
    // Let the shadow copies finish (they are logged when they end).
    for _ in 0..200 {
        if b.truth().iter().filter(|t| t.completed).count() >= 5 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    // The verdict is kept once judged (every second): wait for it, so its keys are always there.
    let admin = gw.admin_addr;
    until(
        std::time::Duration::from_secs(10),
        "a decision kept",
        || async move {
            let (_, x) = admin_get(admin, "/experiments").await;
            x.contains("\"decided\":[{")
        },
    )
    .await;
    let (_, stats) = admin_get(gw.admin_addr, "/stats").await;
    let (_, experiments) = admin_get(gw.admin_addr, "/experiments").await;
    let (_, metrics) = admin_get(gw.admin_addr, "/metrics").await;
    let log = stop_and_read_log(gw, &dir).await;
    Reported {
        log,
        stats: serde_json::from_str(&stats).unwrap(),
        experiments: serde_json::from_str(&experiments).unwrap(),
        metrics,
        collected,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_stats_metrics_and_telemetry_names() {
    let r = report_everything().await;

    // Access log: the union of fields over an ok stream, a non-streamed answer, a retried
    // request, a shadow copy, a gateway rejection and an unreachable backend.
    let mut fields = BTreeSet::new();
    for line in &r.log {
        key_paths(line, "", &mut fields);
    }
    assert!(r.log.iter().any(|l| l["shadow"] == true), "a shadow line");
    assert!(r.log.iter().any(|l| l["retries"].is_array()), "a retry");
    golden("access-log-fields.txt", &fields);
    let outcomes: BTreeSet<String> = r
        .log
        .iter()
        .map(|l| l["outcome"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        outcomes,
        ["backend_error", "ok", "rejected"].map(String::from).into()
    );

    // `report`: the table's header and the JSON's keys, from this log.
    let path = temp_dir().join("access.jsonl");
    let text: String = r.log.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&path, text).unwrap();
    let mut report = BTreeSet::new();
    let out = run_cli(&["report", "--control", "a", "--min-samples", "1"], &path);
    let table = String::from_utf8(out.stdout).unwrap();
    report.insert(format!("table: {}", table.lines().next().unwrap()));
    let out = run_cli(
        &["report", "--json", "--control", "a", "--min-samples", "1"],
        &path,
    );
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut keys = BTreeSet::new();
    key_paths(&json, "", &mut keys);
    report.extend(keys.into_iter().map(|k| format!("json: {k}")));
    golden("report.txt", &report);

    let mut stats = BTreeSet::new();
    key_paths(&r.stats, "", &mut stats);
    golden("stats-keys.txt", &stats);

    let mut experiments = BTreeSet::new();
    key_paths(&r.experiments, "", &mut experiments);
    golden("experiments-keys.txt", &experiments);

    // Prometheus: each series name with its label names.
    let mut series = BTreeSet::new();
    for line in r.metrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            series.insert(format!("TYPE {rest}"));
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap();
        let name = &line[..name_end];
        let labels: Vec<&str> = match line[name_end..].strip_prefix('{') {
            Some(rest) => {
                let body = &rest[..rest.rfind('}').unwrap()];
                body.split("\",")
                    .map(|kv| kv.split('=').next().unwrap())
                    .collect()
            }
            None => Vec::new(),
        };
        series.insert(format!("{name}{{{}}}", labels.join(",")));
    }
    golden("metrics-series.txt", &series);
    reference("metrics.md", &metrics_page(&r.metrics));

    // OpenTelemetry: span names by kind, attribute keys by kind, event names, metric names.
    let mut otel = BTreeSet::new();
    for (res, s) in r.collected.spans() {
        let kind = match SpanKind::try_from(s.kind).unwrap() {
            SpanKind::Server => "server",
            SpanKind::Client => "client",
            SpanKind::Internal => "internal",
            other => panic!("unexpected span kind {other:?}"),
        };
        for kv in &s.attributes {
            otel.insert(format!("{kind} attribute {}", kv.key));
        }
        for e in &s.events {
            otel.insert(format!("{kind} event {}", e.name));
        }
        for kv in res {
            otel.insert(format!("resource attribute {}", kv.key));
        }
    }
    for req in r.collected.metrics.lock().unwrap().iter() {
        for rm in &req.resource_metrics {
            for sm in &rm.scope_metrics {
                for m in &sm.metrics {
                    otel.insert(format!("metric {}", m.name));
                }
            }
        }
    }
    golden("otel-names.txt", &otel);
}

/// The metrics reference: each family's type, help and labels, from a scrape of `/metrics`.
fn metrics_page(text: &str) -> String {
    use std::collections::BTreeMap;
    #[derive(Default)]
    struct Family {
        kind: String,
        help: String,
        labels: BTreeSet<String>,
    }
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            families.entry(name.to_string()).or_default().help = help.to_string();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            families.entry(name.to_string()).or_default().kind = kind.to_string();
        } else if !line.starts_with('#') && !line.is_empty() {
            let name_end = line.find(['{', ' ']).unwrap();
            let name = &line[..name_end];
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| {
                    name.strip_suffix(s)
                        .filter(|f| families.get(*f).is_some_and(|f| f.kind == "histogram"))
                })
                .unwrap_or(name);
            if let Some(rest) = line[name_end..].strip_prefix('{') {
                let body = &rest[..rest.rfind('}').unwrap()];
                let f = families.entry(family.to_string()).or_default();
                for kv in body.split("\",") {
                    let k = kv.split('=').next().unwrap();
                    if k != "le" {
                        f.labels.insert(format!("`{k}`"));
                    }
                }
            }
        }
    }
    let mut page = String::from(
        "# Metrics reference\n\nThe admin listener's `GET /metrics` (Prometheus text), generated from a scrape of a\ngateway that served every kind of request (`UPDATE_GOLDEN=1 cargo test --test contracts`).\nHistograms are classic buckets here; with `Accept: application/vnd.google.protobuf` Prometheus\ngets native histograms.\n\n| metric | type | labels | meaning |\n| --- | --- | --- | --- |\n",
    );
    for (name, f) in &families {
        let labels: Vec<&str> = f.labels.iter().map(String::as_str).collect();
        page.push_str(&format!(
            "| `{name}` | {} | {} | {} |\n",
            f.kind,
            labels.join(" "),
            f.help.replace('|', "\\|")
        ));
    }
    page
}

/// The config reference: the JSON Schema the config types give (published for editors), and a
/// page of every key from it; every key the full example sets is in the schema.
#[test]
fn the_config_reference_is_the_schema_of_the_config_types() {
    let schema = inferscope::config::json_schema();
    reference(
        "config.schema.json",
        &format!("{}\n", serde_json::to_string_pretty(&schema).unwrap()),
    );
    let mut rows = Vec::new();
    schema_rows(&schema, &schema, "", &mut rows);
    let documented: BTreeSet<String> = rows.iter().map(|r| r.0.clone()).collect();
    // Every key the full example sets is a documented key (list items as `[]`, a map's entries
    // as `.NAME`).
    let wild: Vec<Vec<&str>> = documented
        .iter()
        .filter(|k| k.contains(".NAME"))
        .map(|k| k.split('.').collect())
        .collect();
    let is_documented = |k: &str| {
        let segs: Vec<&str> = k.split('.').collect();
        documented.contains(k)
            || wild.iter().any(|w| {
                w.len() == segs.len() && w.iter().zip(&segs).all(|(a, b)| *a == "NAME" || a == b)
            })
    };
    let text = std::fs::read_to_string(golden_path("full-config.yaml")).unwrap();
    let yaml: Value = serde_yaml_ng::from_str(&text).unwrap();
    let mut set = BTreeSet::new();
    key_paths(&yaml, "", &mut set);
    let free = ["telemetry.otlp.headers.", "telemetry.resource."];
    let missing: Vec<&String> = set
        .iter()
        .filter(|k| !free.iter().any(|f| k.starts_with(f)))
        .filter(|k| !is_documented(k))
        .collect();
    assert!(
        missing.is_empty(),
        "keys the full example sets that the schema lacks: {missing:?}"
    );
    assert!(rows.len() > 150, "the walk found the keys ({})", rows.len());
    let mut page = String::from(
        "# Configuration reference\n\nGenerated from the config types (`UPDATE_GOLDEN=1 cargo test --test contracts`). The same\nfacts as a JSON Schema, for editors' YAML language servers: [`config.schema.json`](config.schema.json)\n(`inferscope check --schema` prints it; put `# yaml-language-server: $schema=PATH` at the top of a\nconfig file). Durations are strings: `250ms`, `1.5s`, `1m 30s`.\n\n| key | type | default | description |\n|---|---|---|---|\n",
    );
    for (key, ty, default, description) in &rows {
        let cell = |s: &str| s.replace('|', "\\|").replace('\n', " ");
        page.push_str(&format!(
            "| `{key}` | {} | {} | {} |\n",
            cell(ty),
            cell(default),
            cell(description)
        ));
    }
    reference("config.md", &page);
}

/// `(key, type, default, description)` for every key under `node`, depth first.
fn schema_rows(
    root: &Value,
    node: &Value,
    prefix: &str,
    rows: &mut Vec<(String, String, String, String)>,
) {
    let node = resolve(root, node);
    let Some(props) = node["properties"].as_object() else {
        return;
    };
    for (name, prop) in props {
        let key = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        let target = resolve(root, prop);
        let default = prop
            .get("default")
            .map_or(String::new(), |d| format!("`{d}`"));
        let description = prop
            .get("description")
            .or_else(|| target.get("description"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        rows.push((key.clone(), type_of(root, prop), default, description));
        if target.get("properties").is_some() {
            schema_rows(root, &target, &key, rows);
        } else if let Some(items) = target.get("items") {
            schema_rows(root, items, &format!("{key}[]"), rows);
        } else if let Some(values) = target.get("additionalProperties").filter(|v| v.is_object()) {
            let entry = format!("{key}.NAME");
            let what = resolve(root, values);
            let description = what["description"].as_str().unwrap_or("").to_string();
            rows.push((
                entry.clone(),
                type_of(root, values),
                String::new(),
                description,
            ));
            schema_rows(root, values, &entry, rows);
        }
    }
}

/// `node` with a `$ref` followed, or the one non-null branch of an `anyOf` (an optional key).
fn resolve(root: &Value, node: &Value) -> Value {
    if let Some(r) = node["$ref"].as_str() {
        let name = r.trim_start_matches("#/definitions/");
        return resolve(root, &root["definitions"][name]);
    }
    if let Some([one]) = node["allOf"].as_array().map(Vec::as_slice) {
        return resolve(root, one);
    }
    if let Some(branches) = node["anyOf"].as_array() {
        let real: Vec<&Value> = branches.iter().filter(|b| b["type"] != "null").collect();
        if let [one] = real.as_slice() {
            return resolve(root, one);
        }
    }
    node.clone()
}

/// A key's type in words: `string`, `integer`, `duration`… or the values an enum takes.
fn type_of(root: &Value, node: &Value) -> String {
    let t = resolve(root, node);
    if let Some(choices) = t["oneOf"].as_array().or(t["enum"].as_array()) {
        let values: Vec<String> = choices
            .iter()
            .filter_map(|c| c["const"].as_str().or(c.as_str()).map(|v| format!("`{v}`")))
            .collect();
        if !values.is_empty() {
            return values.join(", ");
        }
    }
    if let Some(title) = t["title"].as_str() {
        return title.to_string();
    }
    if let Some(p) = t["pattern"].as_str() {
        return format!("string matching `{p}`");
    }
    match &t["type"] {
        Value::String(s) if s == "array" => format!("list of {}", type_of(root, &t["items"])),
        Value::String(s) if s == "object" && t.get("properties").is_none() => "map".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) => a
            .iter()
            .filter_map(Value::as_str)
            .filter(|s| *s != "null")
            .collect::<Vec<_>>()
            .join(" or "),
        _ => "value".into(),
    }
}

/// The access-log reference: `accesslog::FIELDS` names every field the writer writes (its
/// `key!` names) and every field a real log showed, and nothing else.
#[test]
fn the_access_log_reference_names_every_field_written() {
    use inferscope::accesslog::FIELDS;
    let source = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("crates/inferscope-gateway/src/accesslog.rs"),
    )
    .unwrap();
    let written: BTreeSet<&str> = source
        .split("key!(\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .collect();
    let listed: BTreeSet<&str> = FIELDS
        .iter()
        .map(|f| f.name.rsplit(['.', ']']).next().unwrap_or(f.name))
        .collect();
    assert_eq!(
        written, listed,
        "accesslog::FIELDS and the writer's fields differ"
    );
    let names: BTreeSet<&str> = FIELDS.iter().map(|f| f.name).collect();
    assert_eq!(names.len(), FIELDS.len(), "a field is listed twice");
    let golden = std::fs::read_to_string(golden_path("access-log-fields.txt")).unwrap();
    for seen in golden.lines() {
        assert!(
            names.contains(seen),
            "`{seen}` is logged and not in accesslog::FIELDS"
        );
    }
    let mut page = String::from(
        "# Access-log reference\n\nGenerated from the code (`accesslog::FIELDS`; `UPDATE_GOLDEN=1 cargo test --test contracts`).\nOne JSON object per line per request — failed, rejected and cancelled ones too. Times are\nmilliseconds to the microsecond unless the name says otherwise; `null` means not measured.\n\n| field | written | what it holds |\n|---|---|---|\n",
    );
    for f in FIELDS {
        page.push_str(&format!("| `{}` | {} | {} |\n", f.name, f.when, f.what));
    }
    reference("access-log.md", &page);
}
