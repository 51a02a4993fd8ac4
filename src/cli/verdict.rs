//! `inferscope verdict`: an experiment's decision as a rollout pipeline takes it — per variant,
//! each `accept:` limit by name (and suite), met, broken or undecided with its interval, and the
//! decision — from a running gateway's admin API, or offline from access logs and eval results.
//! Exit 0 accept, 1 reject, 2 undecided (not enough data, or no limit to decide by), 3 when it
//! could not be read.

use super::fetch_json;
use crate::experiment::quality::{Decision, State, VerdictRow};
use anyhow::Context as _;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Access logs to judge offline (with --control, and --quality and --accept); without them,
    /// --admin.
    #[arg(required_unless_present = "admin")]
    files: Vec<PathBuf>,
    /// A running gateway's admin URL: its experiment's verdict as `GET /experiments` has it.
    #[arg(long, conflicts_with_all = ["files", "quality", "accept"])]
    admin: Option<String>,
    /// With --admin: the route whose experiment is judged (needed when there are several).
    #[arg(long)]
    route: Option<String>,
    /// With --admin: a bearer token, from this environment variable.
    #[arg(long, value_name = "VAR")]
    token_env: Option<String>,
    /// With an https:// admin URL: a PEM CA bundle trusted besides the bundled Mozilla roots.
    #[arg(long)]
    ca_file: Option<PathBuf>,
    /// Offline: the control variant.
    #[arg(long, required_unless_present = "admin")]
    control: Option<String>,
    /// Offline: eval results to judge (`inferscope eval --json > FILE`; repeatable).
    #[arg(long, value_name = "FILE")]
    quality: Vec<PathBuf>,
    /// Offline: the limits, as an experiment's `accept:`, e.g.
    /// `tpot_change_max=0,accuracy_drop_max_points=1`.
    #[arg(long, value_name = "KEY=VALUE,...")]
    accept: Option<String>,
    /// Offline: no verdict until both variants have this many samples of a metric.
    #[arg(long, default_value_t = crate::config::DEFAULT_MIN_SAMPLES)]
    min_samples: usize,
    /// Offline: no one client weighs more than this share of a variant's requests (the
    /// experiment's `max_client_share`; 1: unbounded).
    #[arg(long, default_value_t = crate::config::DEFAULT_MAX_CLIENT_SHARE, value_name = "SHARE")]
    max_client_share: f64,
    /// Print JSON: the experiment, each variant's decision and checks, the decision.
    #[arg(long)]
    json: bool,
}

/// What is judged: the experiment's name, route and control, and its verdict rows.
#[derive(Debug, serde::Deserialize)]
struct Judged {
    name: String,
    #[serde(default)]
    route: String,
    control: String,
    verdicts: Vec<VerdictRow>,
}

pub(crate) fn exec(args: &Args) -> ExitCode {
    let judged = match &args.admin {
        Some(admin) => online(admin, args),
        None => offline(args),
    };
    let j = match judged {
        Ok(j) => j,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(3);
        }
    };
    let decision = overall(&j.verdicts);
    if args.json {
        let doc = serde_json::json!({
            "experiment": j.name,
            "route": j.route,
            "control": j.control,
            "decision": decision.map(Decision::as_str),
            "variants": j.verdicts.iter().map(|v| serde_json::json!({
                "variant": v.variant,
                "decision": v.decision.map(Decision::as_str),
                "row": v.row,
                "checks": v.checks,
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        print!("{}", render(&j, decision));
    }
    ExitCode::from(match decision {
        Some(Decision::Accept) => 0,
        Some(Decision::Reject) => 1,
        _ => 2,
    })
}

/// The experiment's decision over its variants: reject when one is rejected, accept when every
/// one is accepted, else undecided; `None` without limits (nothing decides).
fn overall(rows: &[VerdictRow]) -> Option<Decision> {
    let each: Option<Vec<Decision>> = rows.iter().map(|r| r.decision).collect();
    let each = each.filter(|e| !e.is_empty())?;
    Some(if each.contains(&Decision::Reject) {
        Decision::Reject
    } else if each.iter().all(|d| *d == Decision::Accept) {
        Decision::Accept
    } else {
        Decision::Undecided
    })
}

fn render(j: &Judged, decision: Option<Decision>) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let route = if j.route.is_empty() {
        String::new()
    } else {
        format!(" on route {}", j.route)
    };
    let _ = writeln!(out, "experiment {}{route}, control {}", j.name, j.control);
    for v in &j.verdicts {
        let _ = writeln!(
            out,
            "{}: {}",
            v.variant,
            v.decision
                .map_or("no limits to decide by", Decision::as_str)
        );
        for c in &v.checks {
            let on = c
                .suite
                .as_deref()
                .map(|s| format!(" on {s}"))
                .unwrap_or_default();
            let state = match c.state {
                State::Met => "met",
                State::Broken => "BROKEN",
                State::Undecided => "undecided",
            };
            let _ = writeln!(
                out,
                "  {} {}{on}: {state}: {} ({})",
                c.limit, c.max, c.observed, c.why
            );
        }
    }
    let _ = writeln!(
        out,
        "decision: {}",
        match decision {
            Some(d) => d.as_str(),
            None if j.verdicts.is_empty() =>
                "undecided: no variant but the control has served a request or been scored yet",
            None => "undecided: no accept: limits (give the experiment accept:, or --accept)",
        }
    );
    out
}

fn online(admin: &str, args: &Args) -> anyhow::Result<Judged> {
    let token = match &args.token_env {
        Some(var) => {
            Some(std::env::var(var).with_context(|| format!("--token-env {var}: not set"))?)
        }
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let doc = runtime.block_on(fetch_json(
        admin,
        "/experiments",
        token.as_deref(),
        args.ca_file.clone(),
    ))?;
    #[derive(serde::Deserialize)]
    struct Doc {
        experiments: Vec<Judged>,
    }
    let doc: Doc =
        serde_json::from_value(doc).context("GET /experiments: not the experiments document")?;
    let mut all = doc.experiments;
    let routes = || {
        all.iter()
            .map(|e| e.route.clone())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match &args.route {
        Some(r) => {
            let names = routes();
            all.into_iter().find(|e| e.route == *r).with_context(|| {
                format!("--route {r}: no experiment there (experiments on: {names})")
            })
        }
        None if all.len() == 1 => Ok(all.remove(0)),
        None if all.is_empty() => anyhow::bail!("{admin}: the gateway runs no experiment"),
        None => anyhow::bail!("several experiments: give --route (one of {})", routes()),
    }
}

fn offline(args: &Args) -> anyhow::Result<Judged> {
    let control = args.control.clone().context("--control is required")?;
    let opts = crate::lab::report::ReportOptions {
        files: args.files.clone(),
        by: "variant".into(),
        purpose: None,
        control: Some(control.clone()),
        min_samples: args.min_samples,
        max_client_share: args.max_client_share,
        json: true,
        quality: super::report::read_quality(&args.quality)?,
        accept: super::report::parse_accept(args.accept.as_deref())?,
        backends: Vec::new(),
    };
    let text = crate::lab::report::report(&opts)?;
    #[derive(serde::Deserialize)]
    struct Report {
        #[serde(default)]
        verdicts: Option<Vec<VerdictRow>>,
    }
    let r: Report = serde_json::from_str(&text).context("the report's JSON")?;
    Ok(Judged {
        name: "report".into(),
        route: String::new(),
        control,
        verdicts: r.verdicts.unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(variant: &str, decision: Option<Decision>) -> VerdictRow {
        VerdictRow {
            variant: variant.into(),
            control: "c".into(),
            decision,
            checks: Vec::new(),
            row: String::new(),
        }
    }

    #[test]
    fn the_experiments_decision_is_the_worst_of_its_variants() {
        use Decision::{Accept, Reject, Undecided};
        let o = |rows: &[(&str, Option<Decision>)]| {
            overall(&rows.iter().map(|(v, d)| row(v, *d)).collect::<Vec<_>>())
        };
        assert_eq!(o(&[("a", Some(Accept)), ("b", Some(Accept))]), Some(Accept));
        assert_eq!(
            o(&[("a", Some(Accept)), ("b", Some(Undecided))]),
            Some(Undecided)
        );
        assert_eq!(
            o(&[("a", Some(Undecided)), ("b", Some(Reject))]),
            Some(Reject)
        );
        assert_eq!(o(&[("a", Some(Accept)), ("b", None)]), None);
        assert_eq!(o(&[]), None);
    }
}
