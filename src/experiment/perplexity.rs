//! `inferscope eval --perplexity`: how much worse a variant predicts a reference text — the
//! yardstick quoted for quantization (a perplexity rise under about 0.5 is usually acceptable).
//!
//! The text is cut into windows of `window` characters, `stride` apart. Each window goes through
//! the gateway to each variant (forced with `x-inferscope-variant`) as an OpenAI completions
//! request with `echo: true, logprobs: 1, max_tokens: 1`: the backend returns the log-probability
//! of every prompt token given the ones before it (vLLM, and the simulator, do), the method
//! lm-evaluation-harness uses against OpenAI-compatible servers. The first token of a window has
//! none and the generated token is not the text's, so neither counts; after the first window only
//! tokens starting in the window's last `stride` characters count (the rest is context already
//! scored), so every token of the text is scored once. Perplexity is exp(total negative
//! log-likelihood / tokens scored) per variant; the difference from the control gets a 95%
//! interval from a paired bootstrap over windows (the same windows on both variants).
//!
//! Windows are in characters: a backend's tokenizer (vLLM's `/tokenize`) is not asked yet, so a
//! window's token count varies with the text; the report says so.

use super::eval::{HttpClient, NoReply};
use serde_json::{json, Value};
use std::fmt::Write;
use std::sync::Arc;

/// What to score.
#[derive(Debug, Clone)]
pub struct PerplexityOptions {
    /// Whom to ask.
    pub target: super::eval::EvalTarget,
    /// Window length, characters.
    pub window: usize,
    /// Distance between window starts, characters (at most `window`).
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
    let n = text.len();
    let (window, stride) = (window.max(1), stride.clamp(1, window.max(1)));
    // The last whitespace position in [lo, p], or p when there is none.
    let cut = |p: usize, lo: usize| {
        (lo..=p)
            .rev()
            .find(|&i| text.get(i).is_some_and(|c| c.is_whitespace()))
            .unwrap_or(p)
    };
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

/// A variant's perplexity on the text.
#[derive(Debug, Clone, PartialEq)]
pub struct Perplexity {
    /// Variant.
    pub variant: String,
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
        /// Variant.
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
        /// Variant.
        variant: String,
    },
    /// A variant was not the one that answered (not an experiment route, or rolled back).
    #[error("variant {variant}: the gateway answered with variant {served} (is the route an experiment with this variant?)")]
    WrongVariant {
        /// Asked for.
        variant: String,
        /// Served.
        served: String,
    },
}

/// Scores one window's completions answer: the prompt tokens (offset below the prompt's length)
/// from `score_from` on, without the first token. `None`: no prompt log-probabilities in it.
pub fn score_answer(answer: &Value, prompt_chars: usize, score_from: usize) -> Option<WindowScore> {
    let lp = answer.pointer("/choices/0/logprobs")?;
    let values = lp.get("token_logprobs")?.as_array()?;
    let offsets = lp.get("text_offset")?.as_array()?;
    if values.len() != offsets.len() || values.len() < 2 {
        return None;
    }
    let mut s = WindowScore {
        nll: 0.0,
        tokens: 0,
    };
    for (i, (v, at)) in values.iter().zip(offsets).enumerate() {
        let at = at.as_u64()? as usize;
        if at >= prompt_chars {
            break; // the generated token
        }
        if i == 0 || at < score_from {
            continue;
        }
        s.nll -= v.as_f64()?;
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

async fn score_window(
    client: &HttpClient,
    o: &PerplexityOptions,
    variant: &str,
    text: &str,
    w: Window,
) -> Result<WindowScore, Failed> {
    let t = &o.target;
    let body = json!({"model": t.model, "prompt": text, "echo": true, "logprobs": 1,
        "max_tokens": 1, "temperature": 0});
    let v = t
        .post_retrying(client, variant, "/v1/completions", &body)
        .await
        .map_err(Failed::Asked)?;
    score_answer(&v, w.end - w.start, w.score_from).ok_or(Failed::NoLogprobs)
}

/// Scores `text` on every variant.
pub async fn run(o: &PerplexityOptions, text: &str) -> Result<Vec<Perplexity>, PerplexityError> {
    if text.trim().is_empty() {
        return Err(PerplexityError::Empty);
    }
    let bytes: Vec<usize> = text.char_indices().map(|x| x.0).collect();
    let chars: Vec<char> = text.chars().collect();
    let byte_at = |c: usize| bytes.get(c).copied().unwrap_or(text.len());
    let wins = windows(&chars, o.window, o.stride);
    let pieces: Arc<Vec<(String, Window)>> = Arc::new(
        wins.iter()
            .map(|w| (text[byte_at(w.start)..byte_at(w.end)].to_owned(), *w))
            .collect(),
    );
    let client = o.target.client();
    let mut out = Vec::new();
    for variant in &o.target.variants {
        let results = Arc::new(parking_lot::Mutex::new(vec![None; pieces.len()]));
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut workers = Vec::new();
        for _ in 0..o.target.concurrency.max(1) {
            let (client, pieces, results, next, o, variant) = (
                client.clone(),
                Arc::clone(&pieces),
                Arc::clone(&results),
                Arc::clone(&next),
                o.clone(),
                variant.clone(),
            );
            workers.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((text, w)) = pieces.get(i) else {
                        return;
                    };
                    let r = score_window(&client, &o, &variant, text, *w).await;
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
        out.push(summarize(variant, scores));
    }
    Ok(out)
}

fn summarize(variant: &str, windows: Vec<WindowScore>) -> Perplexity {
    let (nll, tokens) = totals(windows.iter());
    Perplexity {
        variant: variant.to_owned(),
        ppl: (nll / tokens.max(1) as f64).exp(),
        tokens,
        windows,
    }
}

fn totals<'a>(w: impl Iterator<Item = &'a WindowScore>) -> (f64, usize) {
    w.fold((0.0, 0), |(n, t), s| (n + s.nll, t + s.tokens))
}

/// `b`'s perplexity minus `a`'s, with a 95% interval from `iterations` paired bootstrap resamples
/// of the windows (seeded: the same answer every run).
pub fn paired_difference(a: &Perplexity, b: &Perplexity, iterations: usize) -> (f64, (f64, f64)) {
    let diff = b.ppl - a.ppl;
    let n = a.windows.len().min(b.windows.len());
    if n < 2 {
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
                    "n/a: one window (a smaller --window gives more)".to_owned()
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
    let _ = writeln!(
        out,
        "\nWindows of {} characters, {} apart ({} windows): in characters, not the backend's tokens.",
        o.window,
        o.stride,
        results.first().map_or(0, |r| r.windows.len())
    );
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
        assert_eq!(
            score_answer(&a, 7, 0),
            Some(WindowScore {
                nll: 6.0,
                tokens: 3
            })
        );
        assert_eq!(
            score_answer(&a, 7, 3),
            Some(WindowScore {
                nll: 5.0,
                tokens: 2
            })
        );
        let none = json!({"choices": [{"text": "x", "logprobs": null}]});
        assert_eq!(score_answer(&none, 7, 0), None);
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
