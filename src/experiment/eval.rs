//! `inferscope eval`: the quality side of an A/B experiment. Runs a dataset through the gateway
//! once per variant (forced with `x-inferscope-variant`), scores each answer, and reports accuracy
//! per variant with a 95% Wilson interval and each variant's accuracy difference from the first
//! (the control) with a paired 95% interval — the check that quantization costs less than, say,
//! one point.
//!
//! Datasets are JSON lines, either multiple choice (`question`, `choices`, `answer` letter; scored
//! by the first A–D letter of the reply) or exact answer (`question`, `answer`; scored by the reply,
//! trimmed and case-folded, equal to the answer).

use crate::sim::quiz;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use serde_json::{json, Value};
use std::fmt::Write;
use std::sync::Arc;

/// One dataset item.
#[derive(Debug, Clone, Deserialize)]
pub struct EvalItem {
    /// The question.
    pub question: String,
    /// Choices (multiple choice); absent for exact-answer items.
    #[serde(default)]
    pub choices: Vec<String>,
    /// The correct letter, or the exact answer.
    pub answer: String,
}

/// What to evaluate.
#[derive(Debug, Clone)]
pub struct EvalOptions {
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

/// Accuracy of one variant.
#[derive(Debug, Clone, PartialEq)]
pub struct Score {
    /// Variant.
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
}

impl Score {
    /// Correct over asked.
    pub fn accuracy(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.correct as f64 / self.n as f64
        }
    }
}

/// A dataset line that is not an item.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {error}")]
pub struct DatasetError {
    /// 1-based line.
    pub line: usize,
    /// The JSON error.
    pub error: serde_json::Error,
}

/// Parses a JSONL dataset.
pub fn load_dataset(text: &str) -> Result<Vec<EvalItem>, DatasetError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|error| DatasetError { line: i + 1, error }))
        .collect()
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

/// Paired difference of accuracies (`b − a` over the same items) with a 95% interval.
pub fn paired_difference(a: &[bool], b: &[bool]) -> (f64, (f64, f64)) {
    let d: Vec<f64> = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(u8::from(*y)) - f64::from(u8::from(*x)))
        .collect();
    let n = d.len() as f64;
    if d.len() < 2 {
        return (f64::NAN, (f64::NAN, f64::NAN));
    }
    let mean = d.iter().sum::<f64>() / n;
    let var = d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    let half = 1.96 * (var / n).sqrt();
    (mean, (mean - half, mean + half))
}

fn correct(item: &EvalItem, reply: &str) -> bool {
    if item.choices.is_empty() {
        return reply.trim().eq_ignore_ascii_case(item.answer.trim());
    }
    let letter = reply.chars().find(|c| matches!(c, 'A'..='D'));
    letter.is_some_and(|l| item.answer.trim().starts_with(l))
}

async fn ask(
    client: &Client<crate::tls::Connector, Full<Bytes>>,
    o: &EvalOptions,
    variant: &str,
    item: &EvalItem,
) -> Option<String> {
    let content = if item.choices.is_empty() {
        item.question.clone()
    } else {
        quiz::prompt(&item.question, &item.choices)
    };
    let body = json!({"model": o.model, "stream": false, "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": content}]});
    let mut req = http::Request::post(format!(
        "{}/v1/chat/completions",
        o.url.trim_end_matches('/')
    ))
    .header("content-type", "application/json")
    .header(super::VARIANT_HEADER, variant);
    for (k, v) in &o.headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let req = req.body(Full::new(Bytes::from(body.to_string()))).ok()?;
    let resp = client.request(req).await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let served = resp
        .headers()
        .get(super::VARIANT_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let bytes = resp.into_body().collect().await.ok()?.to_bytes();
    if served.as_deref().is_some_and(|s| s != variant) {
        return None; // rolled back by a guardrail, or not an experiment route: not this variant's answer
    }
    let v: Value = serde_json::from_slice(&bytes).ok()?;
    v.pointer("/choices/0/message/content")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// Runs every item through every variant.
pub async fn run(o: &EvalOptions, items: &[EvalItem]) -> Vec<Score> {
    let http = o.connector.clone();
    let client: Client<crate::tls::Connector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(http);
    let items = Arc::new(items.to_vec());
    let mut scores = Vec::new();
    for variant in &o.variants {
        let per_item = Arc::new(parking_lot::Mutex::new(vec![(false, false); items.len()]));
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut workers = Vec::new();
        for _ in 0..o.concurrency.max(1) {
            let (client, items, per_item, next, o, variant) = (
                client.clone(),
                Arc::clone(&items),
                Arc::clone(&per_item),
                Arc::clone(&next),
                o.clone(),
                variant.clone(),
            );
            workers.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(item) = items.get(i) else { return };
                    let reply = ask(&client, &o, &variant, item).await;
                    let r = (
                        reply.as_deref().is_some_and(|r| correct(item, r)),
                        reply.is_none(),
                    );
                    per_item.lock()[i] = r;
                }
            }));
        }
        for w in workers {
            let _ = w.await;
        }
        let results = per_item.lock().clone();
        let k = results.iter().filter(|r| r.0).count();
        scores.push(Score {
            variant: variant.clone(),
            correct: k,
            n: results.len(),
            failed: results.iter().filter(|r| r.1).count(),
            ci: wilson(k, results.len()),
            per_item: results.iter().map(|r| r.0).collect(),
        });
    }
    scores
}

/// The report table.
pub fn render(scores: &[Score]) -> String {
    let mut out = String::from("| variant | accuracy | 95% CI | correct | asked | failed requests |\n|---|---|---|---|---|---|\n");
    for s in scores {
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
    if let Some((control, rest)) = scores.split_first() {
        for s in rest {
            let (d, (lo, hi)) = paired_difference(&control.per_item, &s.per_item);
            let _ = writeln!(
                out,
                "- {} accuracy {:+.1} points vs {} [{:+.1}, {:+.1}] (paired, 95%)",
                s.variant,
                d * 100.0,
                control.variant,
                lo * 100.0,
                hi * 100.0
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let item = EvalItem {
            question: "q".into(),
            choices: vec!["1".into(); 4],
            answer: "C".into(),
        };
        assert!(correct(&item, " C") && correct(&item, "C) 12") && !correct(&item, "B"));
        let exact = EvalItem {
            question: "q".into(),
            choices: vec![],
            answer: "Paris".into(),
        };
        assert!(correct(&exact, " paris\n") && !correct(&exact, "Lyon"));
    }
}
