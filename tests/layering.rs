//! The layering rule of docs/ARCHITECTURE.md, checked against the code. Across crates the
//! compiler holds it; inside the crates of many modules (the gateway, the lab tools, the root's
//! CLI) each top-level module uses only modules of lower layers (so there are no cycles), and the
//! picture of those imports in docs/ARCHITECTURE.md is the one the code has (regenerate it with
//! `UPDATE_GOLDEN=1 cargo test --test layering`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Lowest first. A module may use modules of lower layers only. The first six layers are the
/// library crates below the gateway (each re-exported under these names), which the compiler
/// already holds below everything here: `sse` and `dialect` are `inferscope-wire`; `meter` and
/// `clock` are `inferscope-meter`; `util`, `tls` and `server` are `inferscope-server`; `sim` and
/// `config` are crates of their own.
const LAYERS: &[&[&str]] = &[
    &["sse", "dialect", "meter", "clock"],
    &["util"],
    &["tls"],
    &["server"],
    &["sim"],
    &["config"],
    // crates/inferscope-gateway
    &["facts"],
    &["accesslog"],
    &["stats"],
    &["experiment", "access"],
    &["telemetry"],
    &["route", "recorder"],
    &["proxy", "admin"],
    &["app"],
    // crates/inferscope-lab
    &["sandbox", "loadgen", "report", "harness"],
    &["eval", "html"],
    &["perplexity"],
    // the lab crate as the root names it (`inferscope::lab`)
    &["lab"],
    // the root package
    &["cli"],
];

/// The source trees whose modules are checked, each a crate's `src/`.
const TREES: [&str; 3] = [
    "crates/inferscope-gateway/src",
    "crates/inferscope-lab/src",
    "src",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `crate::NAME` references outside comments and test modules, by top-level module.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for tree in TREES {
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(tree);
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for f in files {
            let rel = f.strip_prefix(&src).unwrap();
            let top = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string();
            if top == "lib" || top == "main" {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap();
            let deps = graph.entry(top.clone()).or_default();
            for line in code.lines() {
                let line = line.split("//").next().unwrap();
                let mut rest = line;
                while let Some(i) = rest.find("crate::") {
                    rest = &rest[i + "crate::".len()..];
                    let names: Vec<&str> = match rest.strip_prefix('{') {
                        // `use crate::{a, b::c}` (on one line, as rustfmt leaves short ones)
                        Some(group) => group
                            .split('}')
                            .next()
                            .unwrap()
                            .split(',')
                            .map(|p| p.trim().split("::").next().unwrap())
                            .collect(),
                        None => vec![rest
                            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                            .next()
                            .unwrap()],
                    };
                    for n in names {
                        if !n.is_empty() && n != top {
                            deps.insert(n.to_string());
                        }
                    }
                }
            }
        }
    }
    graph
}

fn layer_of(m: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&m))
}

#[test]
fn every_module_uses_only_lower_layers() {
    let graph = imports();
    let mut wrong = Vec::new();
    for (m, deps) in &graph {
        let Some(lm) = layer_of(m) else {
            wrong.push(format!(
                "`{m}` is in no layer: place it in LAYERS and docs/ARCHITECTURE.md"
            ));
            continue;
        };
        for d in deps {
            match layer_of(d) {
                Some(ld) if ld < lm => {}
                _ => wrong.push(format!("{m} (layer {lm}) uses {d}")),
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert!(
        ["route", "proxy", "admin", "app", "eval", "report", "cli"]
            .iter()
            .all(|m| graph.contains_key(*m)),
        "the source walk found the modules"
    );
}

#[test]
fn the_architecture_picture_is_the_code() {
    let graph = imports();
    let mut pic = String::from("```mermaid\nflowchart BT\n");
    for (m, deps) in &graph {
        for d in deps {
            pic.push_str(&format!("  {m} --> {d}\n"));
        }
    }
    pic.push_str("```\n");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/ARCHITECTURE.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let (start, end) = ("<!-- imports:begin -->\n", "<!-- imports:end -->");
    let a = doc
        .find(start)
        .expect("docs/ARCHITECTURE.md has the imports markers")
        + start.len();
    let b = doc.find(end).unwrap();
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        let new = format!("{}{pic}{}", &doc[..a], &doc[b..]);
        std::fs::write(&path, new).unwrap();
        return;
    }
    assert_eq!(
        &doc[a..b],
        pic,
        "docs/ARCHITECTURE.md's picture of the imports is out of date (UPDATE_GOLDEN=1 cargo test --test layering)"
    );
}
