//! `inferscope eval`: a dataset or a corpus through the gateway once per variant; accuracy or perplexity compared.

use super::{admin_call, parse_headers};
use anyhow::Context as _;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The dataset: JSONL (multiple choice: question, choices, answer letter; question,
    /// answer; GSM8K's question, answer ending `#### N`; or HumanEval's task_id, prompt,
    /// test, entry_point, also gzipped), an MMLU subject's CSV file, or MMLU's directory
    /// (test/ and dev/).
    #[arg(long, required_unless_present_any = ["generate", "perplexity"])]
    dataset: Option<PathBuf>,
    /// MMLU: answered dev examples before each question (the subject's first N in dev/);
    /// GSM8K: solved examples before each question (the first N of a `train.jsonl` beside the
    /// dataset, where there is one).
    #[arg(long, default_value_t = 5)]
    shots: usize,
    /// `loglikelihood`: as lm-evaluation-harness scores, for numbers a model card quotes:
    /// multiple choice by each choice's log-likelihood (acc, acc_norm), GSM8K by a greedy
    /// completion with strict and flexible extraction; on /v1/completions with the backend's
    /// /tokenize, no start token. `generate`: answered by chat (first letter, final number),
    /// for endpoints without prompt log-probabilities.
    #[arg(long, value_enum, default_value_t = ScoringArg::Generate)]
    scoring: ScoringArg,
    /// Ask only the first N items.
    #[arg(long)]
    limit: Option<usize>,
    /// Group the per-category breakdown by this field of each JSON line (e.g. `difficulty`;
    /// default: `category`, HumanEval's `task_id`, MMLU's subject), or `none` for the whole
    /// suite only.
    #[arg(long, value_name = "FIELD")]
    group_by: Option<String>,
    /// Append each item's result here (JSON lines); a rerun with the same file asks only
    /// the items it does not hold yet.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print the summary as JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Perplexity of --corpus per variant, from prompt log-probabilities (`/v1/completions`
    /// with `echo` and `logprobs`), with the paired difference from the control.
    #[arg(long, requires = "corpus")]
    perplexity: bool,
    /// The reference text for --perplexity (plain UTF-8).
    #[arg(long)]
    corpus: Option<PathBuf>,
    /// --perplexity window, in the backend's tokens (`/tokenize`), else characters.
    #[arg(long, default_value_t = 1024)]
    window: usize,
    /// --perplexity distance between windows, same unit (at most --window).
    #[arg(long, default_value_t = 512)]
    stride: usize,
    /// Gateway URL.
    #[arg(long, default_value_t = format!("http://{}", crate::config::DEFAULT_LISTEN))]
    url: String,
    /// Model name to request.
    #[arg(long, default_value = "demo")]
    model: String,
    /// Variants to evaluate, the control first.
    #[arg(long, value_delimiter = ',', default_value = "fp16,int8")]
    variants: Vec<String>,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Print N generated arithmetic quiz items (JSONL) and exit.
    #[arg(long)]
    generate: Option<usize>,
    /// Seed of the generated items.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Exit with status 1 when more than this share of a variant's requests failed (0.01: 1%),
    /// or when a variant answered no item; the summary is printed first, and not posted
    /// (--report-to) when it fails so.
    #[arg(long, default_value_t = 0.01)]
    max_error_rate: f64,
    /// Extra header NAME:VALUE (repeatable), e.g. authorization:Bearer KEY.
    #[arg(long = "header")]
    headers: Vec<String>,
    /// For an https:// URL: a PEM CA bundle trusted besides the bundled Mozilla roots.
    #[arg(long)]
    ca_file: Option<PathBuf>,
    /// The suite's name in the summary and the verdict (default: the dataset's or corpus's
    /// file name without extension).
    #[arg(long)]
    suite: Option<String>,
    /// Post the summary to this admin URL (`POST /experiments/quality`), where it joins the
    /// latency comparison in the experiment's verdict (`/experiments`, the dashboard); a fleet's
    /// replicas each (repeatable, or comma-separated): every one must answer before the run and
    /// take the result after it.
    #[arg(long, value_name = "ADMIN_URL", value_delimiter = ',')]
    report_to: Vec<String>,
    /// For --report-to: the admin bearer token, from this environment variable.
    #[arg(long, value_name = "VAR")]
    report_token_env: Option<String>,
    /// Run the model's code to score HumanEval problems (pass@1): each program in its own
    /// Python process with CPU, memory, file-size and time limits, an empty environment and,
    /// where `unshare` is permitted, no network. Not a security boundary: off by default.
    #[arg(long)]
    allow_code_execution: bool,
}

/// `--scoring`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum ScoringArg {
    Generate,
    Loglikelihood,
}

pub(crate) async fn exec(args: Args) -> anyhow::Result<()> {
    let Args {
        dataset,
        shots,
        scoring,
        limit,
        group_by,
        out,
        json,
        perplexity,
        corpus,
        window,
        stride,
        url,
        model,
        variants,
        concurrency,
        generate,
        seed,
        headers,
        max_error_rate,
        ca_file,
        suite,
        report_to,
        report_token_env,
        allow_code_execution,
    } = args;
    if let Some(n) = generate {
        for item in crate::sim::quiz::generate(n, seed) {
            println!("{}", serde_json::to_string(&item)?);
        }
        return Ok(());
    }
    let report_token = match &report_token_env {
        Some(var) => {
            Some(std::env::var(var).with_context(|| format!("--report-token-env {var}: not set"))?)
        }
        None => None,
    };
    for admin in &report_to {
        // Before a long run, not after it: the admin API answers, and takes the token.
        admin_call(
            admin,
            "/experiments",
            report_token.as_deref(),
            ca_file.clone(),
            None,
        )
        .await
        .with_context(|| {
            format!("--report-to {admin}: the admin API must answer before the eval runs")
        })?;
    }
    let ca_file_for_report = ca_file.clone();
    // Posts the summary where --report-to says, after printing it.
    let report = |summary: serde_json::Value| async move {
        for admin in &report_to {
            let answer = admin_call(
                admin,
                "/experiments/quality",
                report_token.as_deref(),
                ca_file_for_report.clone(),
                Some(&summary),
            )
            .await
            .context("--report-to")?;
            let filed: crate::experiment::quality::Filed =
                serde_json::from_value(answer).context("--report-to: the gateway's answer")?;
            eprintln!(
                "posted to {admin}: experiment {:?} on route {:?}",
                filed.experiment, filed.route
            );
        }
        anyhow::Ok(())
    };
    let target = crate::lab::eval::EvalTarget {
        connector: crate::tls::Connector::for_url(&url, ca_file, &[b"http/1.1"])
            .context("--ca-file")?,
        url,
        model,
        variants,
        concurrency,
        headers: parse_headers(&headers)?,
    };
    if perplexity {
        let path = corpus.context("--corpus is required")?;
        let text = crate::util::fs::read_to_string(&path, crate::util::fs::DATA_CAP)
            .with_context(|| format!("reading {}", path.display()))?;
        anyhow::ensure!(
            window > 0 && stride > 0,
            "--window and --stride must be above 0"
        );
        anyhow::ensure!(stride <= window, "--stride must not exceed --window");
        let opts = crate::lab::perplexity::PerplexityOptions {
            target,
            window,
            stride,
        };
        let results = crate::lab::perplexity::run(&opts, &text)
            .await
            .with_context(|| path.display().to_string())?;
        let suite = suite.unwrap_or_else(|| suite_name(&path));
        let summary = crate::lab::perplexity::summary(&results, &opts, &suite);
        if json {
            println!("{}", serde_json::to_string(&summary)?);
        } else {
            print!("{}", crate::lab::perplexity::render(&results, &opts));
        }
        return report(serde_json::to_value(&summary)?).await;
    }
    let path = dataset.context("--dataset is required")?;
    let mut items = crate::lab::eval::load_path(&path, shots)?;
    if let Some(field) = &group_by {
        crate::lab::eval::regroup(&mut items, &path, field)?;
    }
    items.truncate(limit.unwrap_or(usize::MAX));
    let scoring = match scoring {
        ScoringArg::Generate => crate::lab::eval::Scoring::Generate,
        ScoringArg::Loglikelihood => crate::lab::eval::Scoring::Loglikelihood,
    };
    if let Some(why) = scoring.unfit(&items) {
        anyhow::bail!("{}: {why}", path.display());
    }
    let model = target.model.clone();
    let sandbox = if items.iter().any(|i| i.code.is_some()) {
        anyhow::ensure!(
            allow_code_execution,
            "{}: its problems are scored by running the model's code: pass --allow-code-execution to allow it",
            path.display()
        );
        let sandbox = crate::lab::sandbox::Sandbox::detect()
            .await
            .map_err(anyhow::Error::msg)?;
        eprintln!("running generated code: {}", sandbox.guarantees());
        Some(std::sync::Arc::new(sandbox))
    } else {
        None
    };
    let guarantees = sandbox.as_ref().map(|s| s.guarantees());
    let opts = crate::lab::eval::EvalOptions {
        target,
        out,
        sandbox,
        progress: true,
        scoring,
    };
    let scores = crate::lab::eval::run(&opts, &items).await;
    let suite = suite.unwrap_or_else(|| suite_name(&path));
    let mut summary = crate::lab::eval::summary(&scores, &suite, &model);
    summary.sandbox = guarantees;
    if json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        print!("{}", crate::lab::eval::render(&scores));
    }
    judge(&scores, max_error_rate)?;
    report(serde_json::to_value(&summary)?).await
}

/// The run's verdict on itself: an error (exit status 1) when a variant answered no item, or
/// more than `max_error_rate` of a variant's requests failed, naming the most frequent reason.
fn judge(scores: &[crate::lab::eval::Score], max_error_rate: f64) -> anyhow::Result<()> {
    let mut wrong = Vec::new();
    for s in scores {
        let top = s
            .failures
            .first()
            .map(|f| format!(" ({} × {}, e.g. {})", f.count, f.reason, f.example))
            .unwrap_or_default();
        if s.n > 0 && s.answered() == 0 {
            wrong.push(format!("{}: no item answered{top}", s.variant));
        } else if s.failed as f64 > max_error_rate * s.n as f64 {
            wrong.push(format!(
                "{}: {} of {} requests failed ({:.1}%), above --max-error-rate {max_error_rate}{top}",
                s.variant,
                s.failed,
                s.n,
                s.failed as f64 * 100.0 / s.n.max(1) as f64
            ));
        }
    }
    anyhow::ensure!(wrong.is_empty(), "{}", wrong.join("; "));
    Ok(())
}

/// A suite's default name: the file's (or MMLU directory's) name without its extension.
fn suite_name(path: &std::path::Path) -> String {
    let name = path
        .file_name()
        .map_or_else(|| "suite".into(), |s| s.to_string_lossy().into_owned());
    let mut stem = name.as_str();
    for ext in [".gz", ".jsonl", ".json", ".csv", ".txt"] {
        stem = stem.strip_suffix(ext).unwrap_or(stem);
    }
    stem.to_owned()
}
