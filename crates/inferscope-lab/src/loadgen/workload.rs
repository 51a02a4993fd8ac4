//! A run's requests: a dataset's entries sampled and measured in tokens, with vLLM's filters, or
//! random prompts of lengths in tokens. Lengths are counted by the backend's own tokenizer where
//! it has `/tokenize` (vLLM, the simulator), and by an estimate that the report names where not.

use super::dataset::{words_of, Entry};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// One request of a workload.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Prompt {
    /// What is sent.
    pub text: String,
    /// Its output length (`max_tokens`), where the workload sets one; else the run's.
    pub output_tokens: Option<u32>,
    /// Its length in tokens, where counted.
    pub input_tokens: Option<u32>,
}

impl From<String> for Prompt {
    fn from(text: String) -> Self {
        Self {
            text,
            ..Self::default()
        }
    }
}

/// `n` synthetic prompts of about `words` words each (`--input-words`; `random` sizes them in
/// tokens).
pub fn synthetic_prompts(n: usize, words: usize, seed: u64) -> Vec<Prompt> {
    let mut rng = crate::util::Rng::new(seed);
    (0..n.max(1))
        .map(|_| Prompt::from(words_of(&mut rng, words.max(1)).join(" ")))
        .collect()
}

/// How a workload's lengths were counted.
pub enum Counter {
    /// By the backend: `POST {root}/tokenize` (vLLM's, the simulator's).
    Tokenize {
        /// The client used.
        client: Box<Client<crate::tls::Connector, Full<Bytes>>>,
        /// `{root}/tokenize`.
        url: String,
        /// The model named in each request.
        model: String,
        /// Headers sent with each (an API key).
        headers: Vec<(String, String)>,
    },
    /// No tokenizer answered: four characters a token (one a word for random prompts).
    Estimate,
}

impl Counter {
    /// The backend's tokenizer when `{root}/tokenize` answers a count, else the estimate.
    pub async fn probe(
        base: &str,
        model: &str,
        connector: crate::tls::Connector,
        headers: &[(String, String)],
    ) -> Self {
        let base = base.trim_end_matches('/');
        let root = base.strip_suffix("/v1").unwrap_or(base);
        let c = Self::Tokenize {
            client: Box::new(Client::builder(TokioExecutor::new()).build(connector)),
            url: format!("{root}/tokenize"),
            model: model.to_owned(),
            headers: headers.to_vec(),
        };
        match c.count("probe").await {
            Some(_) => c,
            None => Self::Estimate,
        }
    }

    /// `count`, tried again twice (after 100 and 400 ms) when the tokenizer does not answer: a
    /// busy engine's tokenizer fails now and then, and a workload is not to lose entries to it.
    pub async fn count_retrying(&self, text: &str) -> Option<u32> {
        for wait in [0, 100, 400] {
            if wait > 0 {
                tokio::time::sleep(Duration::from_millis(wait)).await;
            }
            if let Some(c) = self.count(text).await {
                return Some(c);
            }
        }
        None
    }

    /// What the report says of the counting.
    pub fn describe(&self) -> String {
        match self {
            Self::Tokenize { url, .. } => format!("tokenizer at {url}"),
            Self::Estimate => "estimate: 4 characters a token (no /tokenize answered)".into(),
        }
    }

    /// `text`'s length in tokens, the special tokens the tokenizer adds included (as vLLM's
    /// `bench serve` counts); `None` when the tokenizer did not answer.
    pub async fn count(&self, text: &str) -> Option<u32> {
        match self {
            Self::Estimate => {
                Some(u32::try_from(text.chars().count().div_ceil(4)).unwrap_or(u32::MAX))
            }
            Self::Tokenize {
                client,
                url,
                model,
                headers,
            } => {
                #[derive(Deserialize)]
                struct Count {
                    count: u32,
                }
                let body = serde_json::json!({"model": model, "prompt": text}).to_string();
                let mut req =
                    http::Request::post(url.as_str()).header("content-type", "application/json");
                for (k, v) in headers {
                    req = req.header(k.as_str(), v.as_str());
                }
                let req = req.body(Full::new(Bytes::from(body))).ok()?;
                let read = async {
                    let resp = client.request(req).await.ok()?;
                    if !resp.status().is_success() {
                        return None;
                    }
                    let b = http_body_util::Limited::new(resp.into_body(), 64 << 20)
                        .collect()
                        .await
                        .ok()?
                        .to_bytes();
                    serde_json::from_slice::<Count>(&b).ok().map(|c| c.count)
                };
                tokio::time::timeout(Duration::from_secs(10), read)
                    .await
                    .ok()
                    .flatten()
            }
        }
    }
}

/// What sampling a dataset kept and dropped, for the report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sampled {
    /// The dataset's layout (`sharegpt`, `alpaca`, `longbench`, `jsonl`, `random`).
    pub layout: String,
    /// How lengths were counted.
    pub counted_by: String,
    /// Entries read from the file.
    pub entries: usize,
    /// Entries kept.
    pub kept: usize,
    /// Dropped by vLLM's filters: prompt or output under 4 tokens.
    pub too_short: usize,
    /// Dropped: prompt over 1,024 tokens, or prompt and output over 2,048.
    pub too_long: usize,
    /// Dropped by `--longbench-length`.
    pub other_length: usize,
    /// Random prompts whose count missed the length asked (tokenizers merge words at times).
    pub length_misses: usize,
    /// Dropped: the tokenizer did not answer for them (after retries).
    #[serde(default)]
    pub tokenizer_failed: usize,
    /// Requests that repeat a kept entry because more were asked for than the dataset holds
    /// after its filters (as `vllm bench serve` oversamples; `--no-oversample`: none).
    #[serde(default)]
    pub oversampled: usize,
}

/// Entries the tokenizer may fail on before a run stops (besides 1% of the entries): a
/// workload is run as given or not at all.
const MAX_TOKENIZER_FAILURES: usize = 3;

/// Why a workload could not be sampled as given.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the tokenizer ({counted_by}) failed on {failed} of the {tried} entries tried (at most {allowed}): the workload cannot be counted as vLLM counts it; is /tokenize up and the model name right?")]
pub struct SampleError {
    /// How lengths were being counted.
    pub counted_by: String,
    /// Entries the tokenizer failed on.
    pub failed: usize,
    /// Entries tried.
    pub tried: usize,
    /// Failures allowed.
    pub allowed: usize,
}

/// vLLM's filters for datasets with reference replies (`is_valid_sequence`): prompt and output
/// at least 4 tokens (output unchecked when its length is fixed), prompt at most 1,024, prompt
/// and output at most 2,048.
fn verdict(prompt: u32, output: u32, output_fixed: bool) -> Result<(), bool> {
    if prompt < 4 || (!output_fixed && output < 4) {
        return Err(false);
    }
    if prompt > 1024 || prompt + output > 2048 {
        return Err(true);
    }
    Ok(())
}

/// `n` requests from `entries`, as `vllm bench serve` samples them: shuffled as Python's
/// `random.seed(seed); random.shuffle(…)` shuffles them and taken in that order; each entry with a
/// reply gets the reply's length in tokens as its output length (`fixed_output` overrides it)
/// and passes vLLM's filters, or is dropped and counted by reason. A count the tokenizer does
/// not give (after retries) drops the entry, counted; past `MAX_TOKENIZER_FAILURES` (or 1% of the
/// entries) the sampling stops with an error. Fewer kept than `n`: the rest repeat kept entries
/// drawn as vLLM draws them (`random.seed(seed); random.choice(…)`), counted, unless
/// `no_oversample`.
pub async fn sample(
    layout: &str,
    mut entries: Vec<Entry>,
    n: usize,
    seed: u64,
    counter: &Counter,
    fixed_output: Option<u32>,
    no_oversample: bool,
) -> Result<(Vec<Prompt>, Sampled), SampleError> {
    let mut info = Sampled {
        layout: layout.to_owned(),
        counted_by: counter.describe(),
        entries: entries.len(),
        ..Sampled::default()
    };
    let allowed = MAX_TOKENIZER_FAILURES.max(entries.len() / 100);
    super::pyrandom::PyRandom::seed(seed).shuffle(&mut entries);
    let mut out = Vec::with_capacity(n.min(entries.len()));
    for (tried, e) in (1..).zip(entries) {
        if out.len() >= n {
            break;
        }
        let Some(reply) = &e.reply else {
            out.push(Prompt {
                text: e.prompt,
                output_tokens: fixed_output.or(e.max_tokens),
                input_tokens: None,
            });
            continue;
        };
        let prompt_len = counter.count_retrying(&e.prompt).await;
        let output = match (fixed_output, prompt_len) {
            (Some(f), _) => Some(f),
            (None, Some(_)) => counter.count_retrying(reply).await,
            (None, None) => None,
        };
        let (Some(prompt_len), Some(output)) = (prompt_len, output) else {
            info.tokenizer_failed += 1;
            if info.tokenizer_failed > allowed {
                return Err(SampleError {
                    counted_by: info.counted_by,
                    failed: info.tokenizer_failed,
                    tried,
                    allowed,
                });
            }
            continue;
        };
        match verdict(prompt_len, output, fixed_output.is_some()) {
            Ok(()) => out.push(Prompt {
                text: e.prompt,
                output_tokens: Some(output),
                input_tokens: Some(prompt_len),
            }),
            Err(false) => info.too_short += 1,
            Err(true) => info.too_long += 1,
        }
    }
    info.kept = out.len();
    if out.len() < n && !out.is_empty() && !no_oversample {
        let mut rng = super::pyrandom::PyRandom::seed(seed);
        let kept = out.len();
        for _ in kept..n {
            let i = rng.choice(kept);
            out.push(out[i].clone());
        }
        info.oversampled = n - kept;
    }
    Ok((out, info))
}

/// A random workload's shape, in tokens (vLLM's `--random-*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomShape {
    /// Mean prompt length after the prefix, special tokens included.
    pub input_len: u32,
    /// Mean output length.
    pub output_len: u32,
    /// Lengths are uniform in `[len × (1 − r), len × (1 + r)]`.
    pub range_ratio: f64,
    /// A prefix of this many tokens shared by every prompt (prefix caching).
    pub prefix_len: u32,
}

/// `n` random prompts of `shape`: words whose count the tokenizer confirms (a few rounds of
/// adding or removing words), or one token a word by the estimate.
pub async fn random(
    n: usize,
    shape: RandomShape,
    seed: u64,
    counter: &Counter,
) -> (Vec<Prompt>, Sampled) {
    let mut rng = crate::util::Rng::new(seed);
    let mut info = Sampled {
        layout: "random".into(),
        counted_by: match counter {
            Counter::Estimate => "estimate: one token a word (no /tokenize answered)".into(),
            c => c.describe(),
        },
        ..Sampled::default()
    };
    let uniform = |rng: &mut crate::util::Rng, len: u32| {
        let r = shape.range_ratio.clamp(0.0, 1.0);
        let lo = (f64::from(len) * (1.0 - r)).floor() as u32;
        let hi = (f64::from(len) * (1.0 + r)).ceil() as u32;
        rng.range(lo, hi.max(lo)).max(1)
    };
    let specials = match counter {
        Counter::Tokenize { .. } => counter.count("").await.unwrap_or(0),
        Counter::Estimate => 0,
    };
    let mut prefix = Vec::new();
    if shape.prefix_len > 0 {
        prefix = words_of(&mut rng, shape.prefix_len as usize);
        // The prefix alone: its own tokens, the special ones left to the whole prompt.
        fit(
            &mut prefix,
            shape.prefix_len + specials,
            counter,
            &mut rng,
            "",
        )
        .await;
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n.max(1) {
        let input = uniform(&mut rng, shape.input_len);
        let output = uniform(&mut rng, shape.output_len);
        let target = shape.prefix_len + input;
        let head = prefix.join(" ");
        let mut body = words_of(&mut rng, input.saturating_sub(specials).max(1) as usize);
        let got = fit(&mut body, target, counter, &mut rng, &head).await;
        if got != Some(target) {
            info.length_misses += 1;
        }
        out.push(Prompt {
            text: joined(&head, &body),
            output_tokens: Some(output),
            input_tokens: got,
        });
    }
    info.entries = out.len();
    info.kept = out.len();
    (out, info)
}

fn joined(head: &str, body: &[&str]) -> String {
    let body = body.join(" ");
    if head.is_empty() {
        body
    } else {
        format!("{head} {body}")
    }
}

/// Adds or removes words of `body` until `head` + `body` counts `target` tokens (at most six
/// rounds); the count reached.
async fn fit(
    body: &mut Vec<&'static str>,
    target: u32,
    counter: &Counter,
    rng: &mut crate::util::Rng,
    head: &str,
) -> Option<u32> {
    if matches!(counter, Counter::Estimate) {
        let head_words = head.split_whitespace().count() as u32;
        body.truncate(target.saturating_sub(head_words).max(1) as usize);
        return Some(head_words + body.len() as u32);
    }
    let mut got = None;
    for _ in 0..6 {
        let c = counter.count(&joined(head, body)).await?;
        got = Some(c);
        match c.cmp(&target) {
            std::cmp::Ordering::Equal => break,
            std::cmp::Ordering::Less => body.extend(words_of(rng, (target - c) as usize)),
            std::cmp::Ordering::Greater => {
                let keep = body.len().saturating_sub((c - target) as usize).max(1);
                if keep == body.len() {
                    break;
                }
                body.truncate(keep);
            }
        }
    }
    got
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_prompts_are_seeded() {
        let s = synthetic_prompts(3, 5, 1);
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].text.split_whitespace().count(), 5);
        assert_eq!(s, synthetic_prompts(3, 5, 1));
    }

    #[test]
    fn vllms_filters() {
        assert_eq!(verdict(3, 100, false), Err(false));
        assert_eq!(verdict(10, 3, false), Err(false));
        assert_eq!(verdict(10, 3, true), Ok(()));
        assert_eq!(verdict(1025, 10, false), Err(true));
        assert_eq!(verdict(1024, 1024, false), Ok(()));
        assert_eq!(verdict(1024, 1025, false), Err(true));
    }

    #[tokio::test]
    async fn estimated_sampling_keeps_order_by_seed_and_drops_by_length() {
        let entry = |p: &str, r: &str| Entry {
            prompt: p.into(),
            reply: Some(r.into()),
            max_tokens: None,
            length: None,
        };
        let long = "x".repeat(4 * 1100);
        let entries = vec![
            entry("a prompt of some length", "a reply of some length"),
            entry("hi", "a reply of some length"),
            entry(&long, "a reply long enough"),
            entry("another prompt here", "and its reply, at length"),
        ];
        let (kept, info) = sample(
            "sharegpt",
            entries.clone(),
            10,
            7,
            &Counter::Estimate,
            None,
            true,
        )
        .await
        .unwrap_or_default();
        assert_eq!((info.kept, info.too_short, info.too_long), (2, 1, 1));
        assert!(kept
            .iter()
            .all(|p| p.output_tokens == Some(6) || p.output_tokens == Some(7)));
        let (again, info) = sample(
            "sharegpt",
            entries,
            10,
            7,
            &Counter::Estimate,
            Some(50),
            false,
        )
        .await
        .unwrap_or_default();
        assert!(again.iter().all(|p| p.output_tokens == Some(50)));
        // Ten asked, two kept: eight repeat, said so.
        assert_eq!((again.len(), info.kept, info.oversampled), (10, 2, 8));
    }

    #[tokio::test]
    async fn estimated_random_prompts_are_a_word_a_token_with_a_shared_prefix() {
        let shape = RandomShape {
            input_len: 20,
            output_len: 10,
            range_ratio: 0.5,
            prefix_len: 5,
        };
        let (p, info) = random(50, shape, 3, &Counter::Estimate).await;
        assert_eq!(info.length_misses, 0);
        let head: Vec<&str> = p[0].text.split(' ').take(5).collect();
        for q in &p {
            let words = q.text.split(' ').count() as u32;
            assert_eq!(Some(words), q.input_tokens);
            assert!((15..=35).contains(&words), "{words}");
            assert!((5..=15).contains(&q.output_tokens.unwrap_or(0)));
            assert_eq!(q.text.split(' ').take(5).collect::<Vec<_>>(), head);
        }
    }
}
