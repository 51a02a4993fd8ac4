//! `inferscope eval --perplexity`: how much worse a variant predicts a reference text — the
//! yardstick quoted for quantization (a perplexity rise under about 0.5 is usually acceptable).
//!
//! The text is cut into windows of `window` tokens (or characters, below), `stride` apart. Each
//! window goes through
//! the gateway to each variant (forced with `x-inferscope-variant`) as an OpenAI completions
//! request with `echo: true, logprobs: 1, max_tokens: 1`: the backend returns the log-probability
//! of every prompt token given the ones before it (vLLM, and the simulator, do), the method
//! lm-evaluation-harness uses against OpenAI-compatible servers. The first token of a window has
//! none and the generated token is not the text's, so neither counts; after the first window only
//! tokens in the part not yet scored count (the rest is context), so every token of the text is
//! scored once. Perplexity is exp(total negative
//! log-likelihood / tokens scored) per variant; the difference from the control gets a 95%
//! interval from a paired bootstrap over windows (the same windows on both variants).
//!
//! Windows are in the backend's own tokens when every variant answers `/tokenize` (vLLM does; so
//! does the simulator) with the same ids: the windows are then sent as token ids, and token `i`
//! of a window is scored by its position. Otherwise they are in characters, cut before a space,
//! tokens placed by their `text_offset`; the report says which, and why.

use crate::eval::{HttpClient, NoReply, COMPLETIONS_PATH};
use crate::experiment::quality::{QualityComparison, QualityKind, QualityVariant};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::fmt::Write;
use std::sync::Arc;

/// What to score.
#[derive(Debug, Clone)]
pub struct PerplexityOptions {
    /// Whom to ask.
    pub target: crate::eval::EvalTarget,
    /// Window length, in tokens (or characters: `Unit`).
    pub window: usize,
    /// Distance between window starts, same unit (at most `window`).
    pub stride: usize,
}

/// One window of the text: characters `[start, end)`, scoring tokens that start at or after
/// `score_from` (characters into the window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// First character.
    pub start: usize,
    /// One past the last character.
    pub end: usize,
    /// Tokens starting before this offset (into the window) are context only.
    pub score_from: usize,
}

/// The windows covering `text` (its characters): about `window` long and `stride` apart, each
/// ending just before a whitespace character where one is near (so no word is cut in two, and the
/// next window's first scored token begins with its space, as tokenizers split English).
pub fn windows(text: &[char], window: usize, stride: usize) -> Vec<Window> {
    windows_by(text.len(), window, stride, |i| {
        text.get(i).is_some_and(|c| c.is_whitespace())
    })
}

/// The windows covering `n` tokens: exactly `window` long and `stride` apart.
pub fn token_windows(n: usize, window: usize, stride: usize) -> Vec<Window> {
    windows_by(n, window, stride, |_| false)
}

fn windows_by(
    n: usize,
    window: usize,
    stride: usize,
    space: impl Fn(usize) -> bool,
) -> Vec<Window> {
    let (window, stride) = (window.max(1), stride.clamp(1, window.max(1)));
    // The last space position in [lo, p], or p when there is none.
    let cut = |p: usize, lo: usize| (lo..=p).rev().find(|&i| space(i)).unwrap_or(p);
    let mut out = Vec::new();
    let (mut start, mut scored_to) = (0, 0);
    while scored_to < n {
        let end = if start + window >= n {
            n
        } else {
            cut(start + window, scored_to + 1)
        };
        out.push(Window {
            start,
            end,
            score_from: scored_to - start,
        });
        scored_to = end;
        start = cut(start + stride, start + 1).min(scored_to);
    }
    out
}

/// The log-likelihood one variant gave one window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowScore {
    /// Sum of the scored tokens' negative log-probabilities, nats.
    pub nll: f64,
    /// Tokens scored.
    pub tokens: usize,
}

/// What windows are counted in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unit {
    /// The backend's tokens (`/tokenize`).
    Tokens,
    /// Characters, and why not tokens.
    Chars(String),
}

/// A variant's perplexity on the text.
#[derive(Debug, Clone, PartialEq)]
pub struct Perplexity {
    /// The variant scored (`x-inferscope-variant`).
    pub variant: String,
    /// What its windows were counted in.
    pub unit: Unit,
    /// exp(total NLL / tokens).
    pub ppl: f64,
    /// Tokens scored.
    pub tokens: usize,
    /// Per window, in order.
    pub windows: Vec<WindowScore>,
}

/// Why a perplexity run failed.
#[derive(Debug, thiserror::Error)]
pub enum PerplexityError {
    /// Nothing to score.
    #[error("the corpus is empty")]
    Empty,
    /// A request failed (status or transport).
    #[error("variant {variant}, window {window}: {why}")]
    Request {
        /// The variant asked.
        variant: String,
        /// Window index.
        window: usize,
        /// What happened.
        why: String,
    },
    /// The backend answered without prompt log-probabilities.
    #[error(
        "variant {variant}: the backend returned no prompt log-probabilities (needed: \
         /v1/completions answering `echo: true` with `logprobs`, as vLLM does; chat-only APIs and \
         hosted APIs that dropped `echo` cannot be scored)"
    )]
    NoLogprobs {
        /// The variant asked.
        variant: String,
    },
    /// A variant was not the one that answered (not an experiment route, or rolled back).
    #[error("variant {variant}: the gateway answered with variant {served} (is the route an experiment with this variant?)")]
    WrongVariant {
        /// Asked for.
        variant: String,
        /// The variant the gateway says served.
        served: String,
    },
}

/// Scores one window's completions answer: the prompt's tokens from `score_from` on, without the
/// first token. With `Unit::Tokens`, `prompt_len` and `score_from` count tokens (by position);
/// otherwise characters (by `text_offset`). `None`: no prompt log-probabilities in it.
pub fn score_answer(
    answer: &Value,
    unit: &Unit,
    prompt_len: usize,
    score_from: usize,
) -> Option<WindowScore> {
    /// The parts of a completions answer scoring reads: the first choice's log-probabilities.
    #[derive(serde::Deserialize)]
    struct Answer {
        choices: Vec<Choice>,
    }
    #[derive(serde::Deserialize)]
    struct Choice {
        logprobs: Option<Logprobs>,
    }
    #[derive(serde::Deserialize)]
    struct Logprobs {
        /// One per token; the first token's is `null` (nothing precedes it).
        token_logprobs: Vec<Option<f64>>,
        #[serde(default)]
        text_offset: Option<Vec<u64>>,
    }
    let lp = Answer::deserialize(answer)
        .ok()?
        .choices
        .into_iter()
        .next()?
        .logprobs?;
    let values = lp.token_logprobs;
    let offsets = lp.text_offset;
    let by_position = *unit == Unit::Tokens;
    if values.len() < 2
        || (!by_position && offsets.as_ref().is_none_or(|o| o.len() != values.len()))
    {
        return None;
    }
    let mut s = WindowScore {
        nll: 0.0,
        tokens: 0,
    };
    for (i, v) in values.iter().enumerate() {
        let at = match offsets.as_ref().filter(|_| !by_position) {
            Some(o) => *o.get(i)? as usize,
            None => i,
        };
        if at >= prompt_len {
            break; // the generated token
        }
        if i == 0 || at < score_from {
            continue;
        }
        s.nll -= (*v)?;
        s.tokens += 1;
    }
    Some(s)
}

/// Why one window was not scored.
#[derive(Debug, Clone)]
enum Failed {
    /// No answer (`NoReply`), after retries of transient failures.
    Asked(NoReply),
    NoLogprobs,
}

/// One window's prompt: its text, or its token ids.
#[derive(Debug, Clone)]
struct Piece {
    prompt: Value,
    window: Window,
}

async fn score_window(
    client: &HttpClient,
    o: &PerplexityOptions,
    variant: &str,
    unit: &Unit,
    piece: &Piece,
) -> Result<WindowScore, Failed> {
    let t = &o.target;
    let body = json!({"model": t.model, "prompt": piece.prompt, "echo": true, "logprobs": 1,
        "max_tokens": 1, "temperature": 0});
    let v = t
        .post_retrying(client, variant, COMPLETIONS_PATH, &body, false)
        .await
        .map_err(Failed::Asked)?;
    let w = piece.window;
    score_answer(&v, unit, w.end - w.start, w.score_from).ok_or(Failed::NoLogprobs)
}

/// The text's token ids, when every variant's backend tokenizes it (`/tokenize`) and all the
/// same; otherwise why not.
async fn tokenize(
    client: &HttpClient,
    o: &PerplexityOptions,
    text: &str,
) -> Result<Vec<u64>, String> {
    let t = &o.target;
    let body = json!({"model": t.model, "prompt": text, "add_special_tokens": false});
    let mut first: Option<Vec<u64>> = None;
    for variant in &t.variants {
        // Token ids are the tokenizer's own: they must come from this variant's backend.
        let v = t
            .post_retrying(client, variant, "/tokenize", &body, true)
            .await
            .map_err(|e| match e {
                NoReply::Served(_) => format!(
                    "/tokenize did not reach variant {variant}: its `model` takes a route \
                     that is not the experiment's, or the experiment refuses forced variants"
                ),
                e => format!("{variant} has no /tokenize ({e:?})"),
            })?;
        /// vLLM's `/tokenize` answer: the token ids.
        #[derive(serde::Deserialize)]
        struct Tokenized {
            tokens: Vec<u64>,
        }
        let ids = Tokenized::deserialize(&v)
            .map_err(|_| format!("{variant}'s /tokenize gave no token ids"))?
            .tokens;
        match &first {
            Some(f) if *f != ids => {
                return Err(format!(
                    "{variant} tokenizes the text differently from {}",
                    t.variants[0]
                ))
            }
            Some(_) => {}
            None => first = Some(ids),
        }
    }
    first
        .filter(|f| !f.is_empty())
        .ok_or_else(|| "no tokens".into())
}

/// Scores `text` on every variant.
pub async fn run(o: &PerplexityOptions, text: &str) -> Result<Vec<Perplexity>, PerplexityError> {
    if text.trim().is_empty() {
        return Err(PerplexityError::Empty);
    }
    let client = o.target.client();
    let (unit, pieces) = match tokenize(&client, o, text).await {
        Ok(ids) => {
            let pieces = token_windows(ids.len(), o.window, o.stride)
                .into_iter()
                .map(|w| Piece {
                    prompt: json!(ids[w.start..w.end]),
                    window: w,
                })
                .collect();
            (Unit::Tokens, pieces)
        }
        Err(why) => {
            let bytes: Vec<usize> = text.char_indices().map(|x| x.0).collect();
            let chars: Vec<char> = text.chars().collect();
            let byte_at = |c: usize| bytes.get(c).copied().unwrap_or(text.len());
            let pieces = windows(&chars, o.window, o.stride)
                .into_iter()
                .map(|w| Piece {
                    prompt: Value::from(&text[byte_at(w.start)..byte_at(w.end)]),
                    window: w,
                })
                .collect();
            (Unit::Chars(why), pieces)
        }
    };
    let pieces: Arc<Vec<Piece>> = Arc::new(pieces);
    let mut out = Vec::new();
    for variant in &o.target.variants {
        let results = Arc::new(parking_lot::Mutex::new(vec![None; pieces.len()]));
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut workers = Vec::new();
        for _ in 0..o.target.concurrency.max(1) {
            let (client, pieces, results, next, o, variant, unit) = (
                client.clone(),
                Arc::clone(&pieces),
                Arc::clone(&results),
                Arc::clone(&next),
                o.clone(),
                variant.clone(),
                unit.clone(),
            );
            workers.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(piece) = pieces.get(i) else {
                        return;
                    };
                    let r = score_window(&client, &o, &variant, &unit, piece).await;
                    results.lock()[i] = Some(r);
                }
            }));
        }
        for w in workers {
            let _ = w.await;
        }
        let mut scores = Vec::with_capacity(pieces.len());
        for (i, r) in results.lock().drain(..).enumerate() {
            let variant = variant.clone();
            let unscored = Failed::Asked(NoReply::Final("not scored".into()));
            match r.unwrap_or(Err(unscored)) {
                Ok(s) => scores.push(s),
                Err(Failed::NoLogprobs) => return Err(PerplexityError::NoLogprobs { variant }),
                Err(Failed::Asked(NoReply::Served(served))) => {
                    return Err(PerplexityError::WrongVariant { variant, served })
                }
                Err(Failed::Asked(NoReply::Transient(why) | NoReply::Final(why))) => {
                    return Err(PerplexityError::Request {
                        variant,
                        window: i,
                        why,
                    })
                }
            }
        }
        let mut p = summarize(variant, scores);
        p.unit = unit.clone();
        out.push(p);
    }
    Ok(out)
}

fn summarize(variant: &str, windows: Vec<WindowScore>) -> Perplexity {
    let (nll, tokens) = totals(windows.iter());
    Perplexity {
        variant: variant.to_owned(),
        unit: Unit::Tokens,
        ppl: (nll / tokens.max(1) as f64).exp(),
        tokens,
        windows,
    }
}

fn totals<'a>(w: impl Iterator<Item = &'a WindowScore>) -> (f64, usize) {
    w.fold((0.0, 0), |(n, t), s| (n + s.nll, t + s.tokens))
}

/// Fewer windows than this get no interval: a bootstrap over a handful of windows resamples the
/// same few values and gives an interval far narrower than the truth.
pub const MIN_WINDOWS_FOR_INTERVAL: usize = 10;

/// `b`'s perplexity minus `a`'s, with a 95% interval from `iterations` paired bootstrap resamples
/// of the windows (seeded: the same answer every run; NaN below `MIN_WINDOWS_FOR_INTERVAL`).
pub fn paired_difference(a: &Perplexity, b: &Perplexity, iterations: usize) -> (f64, (f64, f64)) {
    let diff = b.ppl - a.ppl;
    let n = a.windows.len().min(b.windows.len());
    if n < MIN_WINDOWS_FOR_INTERVAL {
        return (diff, (f64::NAN, f64::NAN));
    }
    let mut rng = crate::util::rng::Rng::new(0x9e71);
    let ppl = |nll: f64, tokens: usize| (nll / tokens.max(1) as f64).exp();
    let mut diffs: Vec<f64> = (0..iterations.max(1))
        .map(|_| {
            let (mut na, mut ta, mut nb, mut tb) = (0.0, 0, 0.0, 0);
            for _ in 0..n {
                let i = (rng.next_u64() % n as u64) as usize;
                na += a.windows[i].nll;
                ta += a.windows[i].tokens;
                nb += b.windows[i].nll;
                tb += b.windows[i].tokens;
            }
            ppl(nb, tb) - ppl(na, ta)
        })
        .collect();
    diffs.sort_by(f64::total_cmp);
    let at = |q: f64| diffs[((diffs.len() - 1) as f64 * q).round() as usize];
    (diff, (at(0.025), at(0.975)))
}

/// The report `eval --perplexity --json` prints and `--report-to` posts: each variant's
/// perplexity and tokens scored, and each variant's paired difference from the control with its
/// 95% interval (none from fewer than `MIN_WINDOWS_FOR_INTERVAL` windows). It reads as a
/// `quality::QualityResult` where the gateway files it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PerplexityReport {
    /// Always `perplexity`.
    pub kind: QualityKind,
    /// The corpus (its file's name, or `--suite`).
    pub suite: String,
    /// The model requested.
    pub model: String,
    /// The path windows were scored at.
    pub path: String,
    /// The control: the first variant scored.
    pub control: Option<String>,
    /// What a window is counted in: `tokens`, or characters and why.
    pub unit: String,
    /// Window length, in `unit`s.
    pub window: usize,
    /// Stride between windows, in `unit`s.
    pub stride: usize,
    /// Per variant, the control first.
    pub variants: Vec<PerplexityVariant>,
    /// Every other variant against the control.
    pub comparisons: Vec<PerplexityComparison>,
}

/// One variant's perplexity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PerplexityVariant {
    /// Variant, perplexity as `value` (no interval), tokens scored as `n`.
    #[serde(flatten)]
    pub score: QualityVariant,
    /// Windows scored.
    pub windows: usize,
}

/// One variant against the control, paired over the same windows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PerplexityComparison {
    /// Variant, difference in perplexity, its bootstrap 95% interval.
    #[serde(flatten)]
    pub difference: QualityComparison,
    /// The control it is compared with.
    pub control: String,
}

/// The report of `results` (the control first) on `suite`.
pub fn summary(results: &[Perplexity], o: &PerplexityOptions, suite: &str) -> PerplexityReport {
    let variants = results
        .iter()
        .map(|r| PerplexityVariant {
            score: QualityVariant {
                variant: r.variant.clone(),
                value: r.ppl,
                ci95: None,
                n: r.tokens as u64,
            },
            windows: r.windows.len(),
        })
        .collect();
    let comparisons = match results.split_first() {
        Some((control, rest)) => rest
            .iter()
            .map(|r| {
                let (d, (lo, hi)) = paired_difference(control, r, 2000);
                PerplexityComparison {
                    difference: QualityComparison {
                        variant: r.variant.clone(),
                        difference: d,
                        ci95: (lo.is_finite() && hi.is_finite()).then_some([lo, hi]),
                    },
                    control: control.variant.clone(),
                }
            })
            .collect(),
        None => Vec::new(),
    };
    let unit = match results.first().map(|r| &r.unit) {
        Some(Unit::Chars(why)) => format!("characters ({why})"),
        _ => "tokens".to_owned(),
    };
    PerplexityReport {
        kind: QualityKind::Perplexity,
        suite: suite.to_owned(),
        model: o.target.model.clone(),
        path: COMPLETIONS_PATH.to_owned(),
        control: results.first().map(|r| r.variant.clone()),
        unit,
        window: o.window,
        stride: o.stride,
        variants,
        comparisons,
    }
}

/// The report table (and the unit caveat).
pub fn render(results: &[Perplexity], o: &PerplexityOptions) -> String {
    let mut out = String::from(
        "| variant | perplexity | tokens scored | Δ vs control | 95% CI (paired bootstrap) |\n|---|---|---|---|---|\n",
    );
    let control = results.first();
    for (i, r) in results.iter().enumerate() {
        let (d, ci) = match control {
            Some(c) if i > 0 => {
                let (d, (lo, hi)) = paired_difference(c, r, 2000);
                let ci = if lo.is_nan() {
                    format!(
                        "n/a: {} windows, an interval needs {MIN_WINDOWS_FOR_INTERVAL} (a smaller --window gives more)",
                        c.windows.len().min(r.windows.len())
                    )
                } else {
                    format!("[{lo:+.3}, {hi:+.3}]")
                };
                (format!("{d:+.3}"), ci)
            }
            _ => ("-".into(), "-".into()),
        };
        let _ = writeln!(
            out,
            "| {} | {:.3} | {} | {d} | {ci} |",
            r.variant, r.ppl, r.tokens
        );
    }
    let windows = results.first().map_or(0, |r| r.windows.len());
    let _ = match results.first().map(|r| &r.unit) {
        Some(Unit::Chars(why)) => writeln!(
            out,
            "\nWindows of {} characters, {} apart ({windows} windows): in characters, not the backend's tokens ({why}).",
            o.window, o.stride
        ),
        _ => writeln!(
            out,
            "\nWindows of {} tokens of the backend's tokenizer, {} apart ({windows} windows).",
            o.window, o.stride
        ),
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_score_every_character_once_and_cut_before_spaces() {
        let chars = |s: &str| s.chars().collect::<Vec<char>>();
        // No whitespace: cut where the numbers say.
        let w = windows(&chars(&"x".repeat(25)), 10, 5);
        let at = |start, end, score_from| Window {
            start,
            end,
            score_from,
        };
        assert_eq!(
            w,
            [at(0, 10, 0), at(5, 15, 5), at(10, 20, 5), at(15, 25, 5)]
        );
        assert_eq!(windows(&chars("short"), 10, 5), [at(0, 5, 0)]);
        assert!(windows(&[], 10, 5).is_empty());
        // Words: every window ends just before a space, and scoring resumes there.
        let text = chars("aaa bbb ccc ddd eee fff");
        let w = windows(&text, 10, 5);
        assert_eq!(w[0], at(0, 7, 0));
        for pair in w.windows(2) {
            assert_eq!(pair[1].start + pair[1].score_from, pair[0].end);
            assert!(text[pair[0].end].is_whitespace());
        }
        assert_eq!(w.last().map(|w| w.end), Some(text.len()));
    }

    #[test]
    fn an_answer_scores_prompt_tokens_after_the_first_and_the_context() {
        let a = json!({"choices": [{"logprobs": {
            "tokens": ["a", " b", " c", " d", " X"],
            "token_logprobs": [null, -1.0, -2.0, -3.0, -9.0],
            "text_offset": [0, 1, 3, 5, 7]}}]});
        let chars = Unit::Chars(String::new());
        let score = |nll, tokens| Some(WindowScore { nll, tokens });
        assert_eq!(score_answer(&a, &chars, 7, 0), score(6.0, 3));
        assert_eq!(score_answer(&a, &chars, 7, 3), score(5.0, 2));
        // By position: 4 prompt tokens, the fifth generated.
        assert_eq!(score_answer(&a, &Unit::Tokens, 4, 0), score(6.0, 3));
        assert_eq!(score_answer(&a, &Unit::Tokens, 4, 2), score(5.0, 2));
        let none = json!({"choices": [{"text": "x", "logprobs": null}]});
        assert_eq!(score_answer(&none, &chars, 7, 0), None);
        assert_eq!(token_windows(10, 4, 2).len(), 4);
    }

    #[test]
    fn the_paired_interval_holds_a_constant_shift() {
        let mk = |v: &str, shift: f64| {
            let windows: Vec<WindowScore> = (0..40)
                .map(|i| WindowScore {
                    nll: (2.0 + (i % 7) as f64 * 0.1 + shift) * 50.0,
                    tokens: 50,
                })
                .collect();
            summarize(v, windows)
        };
        let (a, b) = (mk("fp16", 0.0), mk("int8", 0.05));
        let (d, (lo, hi)) = paired_difference(&a, &b, 500);
        assert!(
            d > 0.0 && lo > 0.0 && lo <= d && d <= hi,
            "{d} [{lo}, {hi}]"
        );
        let (d0, (lo0, hi0)) = paired_difference(&a, &a, 500);
        assert_eq!((d0, lo0, hi0), (0.0, 0.0, 0.0));
    }
}
