//! What the guide tells users to deploy is valid: the compose file (by `podman-compose config`
//! and by what its services mount), the configs it mounts (the gateway's parses, Prometheus's
//! passes `promtool`), the Grafana dashboard (its queries name metrics the gateway exports), and
//! the Kubernetes manifests (`kubernetes-validate --strict` against the bundled schemas; the
//! shutdown timings agree with the gateway's config).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{program, succeeds};
use serde_json::Value as Json;
use serde_yaml_ng::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn yaml(path: &Path) -> Value {
    serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_compose_setup_is_complete_and_valid() {
    let dir = repo().join("docker");
    let compose = yaml(&dir.join("compose.yaml"));
    let services = compose["services"].as_mapping().unwrap();
    for name in [
        "inferscope",
        "sim-fp16",
        "sim-int8",
        "otel-collector",
        "jaeger",
        "prometheus",
        "grafana",
    ] {
        assert!(
            services.contains_key(name),
            "compose.yaml has no service {name}"
        );
    }
    // Every file a service mounts is in the repository.
    for (name, svc) in services {
        for v in svc["volumes"].as_sequence().into_iter().flatten() {
            let src = v.as_str().unwrap().split(':').next().unwrap();
            if src.starts_with("./") {
                assert!(
                    dir.join(src).exists(),
                    "{name:?} mounts {src}, which is not in docker/"
                );
            }
        }
        // Published ports stay on loopback.
        for p in svc["ports"].as_sequence().into_iter().flatten() {
            assert!(
                p.as_str().unwrap().starts_with("127.0.0.1:"),
                "{name:?}: {p:?}"
            );
        }
    }
    // The gateway's config parses and its backends are the simulator services.
    let text = std::fs::read_to_string(dir.join("compose/inferscope.yaml")).unwrap();
    let cfg = inferscope::config::parse(&text, "compose/inferscope.yaml").unwrap();
    for b in &cfg.backends {
        let host = b.url.as_deref().unwrap().trim_start_matches("http://");
        let host = host.split(':').next().unwrap();
        assert!(
            services.contains_key(host),
            "backend {} points at {host}, not a service",
            b.name
        );
    }
    // The collector's pipelines use only what it defines.
    let otel = yaml(&dir.join("compose/otel-collector.yaml"));
    for (_, p) in otel["service"]["pipelines"].as_mapping().unwrap() {
        for kind in ["receivers", "processors", "exporters"] {
            for c in p[kind].as_sequence().into_iter().flatten() {
                assert!(
                    otel[kind].get(c.as_str().unwrap()).is_some(),
                    "collector pipeline uses undefined {kind} {c:?}"
                );
            }
        }
    }
}

#[test]
#[ignore = "needs promtool"]
fn promtool_accepts_the_compose_prometheus_config() {
    let promtool = program(&["promtool"], "apt-get install prometheus");
    succeeds(
        Command::new(promtool)
            .args(["check", "config"])
            .arg(repo().join("docker/compose/prometheus.yml")),
    );
}

#[test]
#[ignore = "needs podman-compose"]
fn podman_compose_resolves_the_compose_file() {
    let pc = program(&["podman-compose"], "pip install podman-compose");
    let out = succeeds(
        Command::new(pc)
            .args(["-f", "compose.yaml", "config"])
            .current_dir(repo().join("docker")),
    );
    let resolved = String::from_utf8_lossy(&out.stdout);
    assert!(resolved.contains("target: runtime"), "{resolved}");
}

#[test]
fn the_grafana_dashboard_queries_metrics_the_gateway_exports() {
    let dir = repo().join("docker/grafana");
    let dash: Json = serde_json::from_str(
        &std::fs::read_to_string(dir.join("dashboards/inferscope.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(dash["uid"], "inferscope");
    let exported = std::fs::read_to_string(repo().join("tests/golden/metrics-series.txt")).unwrap();
    let mut queries = 0;
    for panel in dash["panels"].as_array().unwrap() {
        assert_eq!(panel["datasource"]["uid"], "prometheus");
        for t in panel["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            queries += 1;
            let mut rest = expr;
            while let Some(i) = rest.find("inferscope_") {
                let name: String = rest[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let base = name.trim_end_matches("_bucket");
                assert!(
                    exported.contains(&format!("TYPE {base} ")),
                    "{expr}: the gateway exports no {base}"
                );
                rest = &rest[i + name.len()..];
            }
        }
    }
    assert!(queries >= 10);
    let ds = yaml(&dir.join("provisioning/datasources/datasources.yaml"));
    let uids: Vec<&str> = ds["datasources"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|d| d["uid"].as_str().unwrap())
        .collect();
    assert!(uids.contains(&"prometheus") && uids.contains(&"jaeger"));
    let prov = yaml(&dir.join("provisioning/dashboards/dashboards.yaml"));
    assert_eq!(
        prov["providers"][0]["options"]["path"],
        "/var/lib/grafana/dashboards"
    );
}

#[test]
fn the_kubernetes_manifests_are_complete_and_drain_in_time() {
    let dir = repo().join("deploy/kubernetes");
    let files = manifests();
    let kinds: Vec<String> = files
        .iter()
        .map(|f| yaml(f)["kind"].as_str().unwrap().to_string())
        .collect();
    for k in [
        "ConfigMap",
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
    ] {
        assert!(kinds.iter().any(|x| x == k), "no {k} in {kinds:?}");
    }
    // The config in the ConfigMap parses, and the pod's grace covers preStop + shutdown_grace.
    let cm = yaml(&dir.join("configmap.yaml"));
    let cfg = inferscope::config::parse(
        cm["data"]["config.yaml"].as_str().unwrap(),
        "configmap.yaml",
    )
    .unwrap();
    let dep = yaml(&dir.join("deployment.yaml"));
    let pod = &dep["spec"]["template"]["spec"];
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    let c = &pod["containers"][0];
    let pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
        .as_u64()
        .unwrap();
    assert!(
        grace > pre_stop + cfg.limits.shutdown_grace.as_secs(),
        "terminationGracePeriodSeconds {grace} must exceed preStop {pre_stop} + shutdown_grace {:?}",
        cfg.limits.shutdown_grace
    );
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(
        cfg.admin.token_env.as_deref(),
        Some("INFERSCOPE_ADMIN_TOKEN")
    );
}

/// The manifests `kustomization.yaml` lists.
fn manifests() -> Vec<PathBuf> {
    let dir = repo().join("deploy/kubernetes");
    let kust = yaml(&dir.join("kustomization.yaml"));
    kust["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| dir.join(r.as_str().unwrap()))
        .collect()
}

#[test]
#[ignore = "needs kubernetes-validate"]
fn kubernetes_validate_accepts_the_manifests() {
    let kv = program(&["kubernetes-validate"], "pip install kubernetes-validate");
    let files = manifests();
    let out = Command::new(kv)
        .arg("--strict")
        .args(&files)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert_eq!(text.matches(" passed ").count(), files.len(), "{text}");
}
