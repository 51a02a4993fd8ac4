//! Workloads for `inferscope bench`, read from the files the field releases them in: ShareGPT
//! (a JSON array of `conversations`), Alpaca (a JSON array of `instruction`/`input`/`output`),
//! LongBench (JSONL rows of `context`/`input`/`answers`/`dataset`/`length`) and generic JSONL (a
//! string, or an object with a prompt field, per line). Parsing only: lengths in tokens and
//! vLLM's filters are `workload`'s.

use std::fmt;

/// The layouts a dataset file can have (`--dataset-name`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `[{"conversations": [{"from": "human", "value": …}, {"from": "gpt", "value": …}]}]`.
    ShareGpt,
    /// `[{"instruction": …, "input": …, "output": …}]`.
    Alpaca,
    /// JSONL of `{"context", "input", "answers", "dataset", "length"}`.
    LongBench,
    /// JSONL of strings or of objects with a prompt field (`--dataset-field`, default `prompt`).
    Jsonl,
}

/// What every format error lists: the layouts a file may have.
pub const LAYOUTS: &str =
    "ShareGPT (a JSON array of {\"conversations\": [{\"from\", \"value\"}, …]}), \
Alpaca (a JSON array of {\"instruction\", \"input\", \"output\"}), \
LongBench (JSONL of {\"context\", \"input\", \"answers\", \"dataset\", \"length\"}), \
or JSONL of strings or {\"prompt\": …} objects (another field with --dataset-field)";

impl Layout {
    /// Parses `sharegpt`, `alpaca`, `longbench` or `jsonl`.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "sharegpt" => Self::ShareGpt,
            "alpaca" => Self::Alpaca,
            "longbench" => Self::LongBench,
            "jsonl" => Self::Jsonl,
            _ => return None,
        })
    }

    /// Its `--dataset-name`.
    pub fn name(self) -> &'static str {
        match self {
            Self::ShareGpt => "sharegpt",
            Self::Alpaca => "alpaca",
            Self::LongBench => "longbench",
            Self::Jsonl => "jsonl",
        }
    }
}

/// One entry of a dataset, before lengths are counted.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The prompt sent.
    pub prompt: String,
    /// A reference reply whose length in tokens is the request's output length (ShareGPT's
    /// first reply, Alpaca's `output`).
    pub reply: Option<String>,
    /// An output limit the dataset sets itself (LongBench's per-dataset maximum).
    pub max_tokens: Option<u32>,
    /// LongBench's `length`: the context's words (characters for Chinese).
    pub length: Option<u64>,
}

/// A dataset file that cannot be used: where, what, and the layouts accepted.
#[derive(Debug, PartialEq)]
pub struct DatasetError {
    /// 1-based line, where one is to blame.
    pub line: Option<usize>,
    /// What is wrong.
    pub what: String,
}

impl fmt::Display for DatasetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(line) = self.line {
            write!(f, "line {line}: ")?;
        }
        write!(f, "{}; accepted layouts: {LAYOUTS}", self.what)
    }
}

impl std::error::Error for DatasetError {}

impl DatasetError {
    fn at(line: usize, what: impl Into<String>) -> Self {
        Self {
            line: Some(line),
            what: what.into(),
        }
    }

    fn json(layout: Layout, e: &serde_json::Error) -> Self {
        // serde_json's message ends with its own "at line L column C": keep the line apart.
        let text = e.to_string();
        let what = text
            .rsplit_once(" at line ")
            .map_or(text.as_str(), |(w, _)| w)
            .to_owned();
        Self {
            line: (e.line() > 0).then_some(e.line()),
            what: format!("not the {} layout: {what}", layout.name()),
        }
    }
}

/// The layout `text` has: from its first entry's keys.
pub fn detect(text: &str) -> Result<Layout, DatasetError> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('[') {
        // The first entry's keys decide; the whole file is read typed afterwards.
        let first = trimmed
            .find('{')
            .map(|i| &trimmed[i..])
            .and_then(|rest| {
                serde_json::Deserializer::from_str(rest)
                    .into_iter::<serde_json::Map<String, serde_json::Value>>()
                    .next()
            })
            .and_then(Result::ok);
        return match first {
            Some(m) if m.contains_key("conversations") => Ok(Layout::ShareGpt),
            Some(m) if m.contains_key("instruction") => Ok(Layout::Alpaca),
            _ => Err(DatasetError {
                line: None,
                what: "a JSON array whose first entry has neither \"conversations\" (ShareGPT) nor \"instruction\" (Alpaca)".into(),
            }),
        };
    }
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(first) {
        Ok(m) if m.contains_key("context") && m.contains_key("dataset") => Ok(Layout::LongBench),
        _ => Ok(Layout::Jsonl),
    }
}

/// Reads `text` in `layout` (detected when `None`); `field` is the prompt's field in generic
/// JSONL.
pub fn load(
    text: &str,
    layout: Option<Layout>,
    field: &str,
) -> Result<(Layout, Vec<Entry>), DatasetError> {
    let layout = match layout {
        Some(l) => l,
        None => detect(text)?,
    };
    let entries = match layout {
        Layout::ShareGpt => sharegpt(text)?,
        Layout::Alpaca => alpaca(text)?,
        Layout::LongBench => longbench(text)?,
        Layout::Jsonl => jsonl(text, field)?,
    };
    if entries.is_empty() {
        return Err(DatasetError {
            line: None,
            what: format!("no usable entries in the {} layout", layout.name()),
        });
    }
    Ok((layout, entries))
}

/// ShareGPT as vLLM's `bench serve` reads it: conversations of at least two turns, the first
/// turn the prompt and the second the reply whose length is the output length.
fn sharegpt(text: &str) -> Result<Vec<Entry>, DatasetError> {
    #[derive(serde::Deserialize)]
    struct Conversation {
        #[serde(default)]
        conversations: Vec<Turn>,
    }
    #[derive(serde::Deserialize)]
    struct Turn {
        value: String,
    }
    let all: Vec<Conversation> =
        serde_json::from_str(text).map_err(|e| DatasetError::json(Layout::ShareGpt, &e))?;
    Ok(all
        .into_iter()
        .filter(|c| c.conversations.len() >= 2)
        .map(|c| {
            let mut turns = c.conversations.into_iter();
            let prompt = turns.next().map(|t| t.value).unwrap_or_default();
            Entry {
                prompt,
                reply: turns.next().map(|t| t.value),
                max_tokens: None,
                length: None,
            }
        })
        .collect())
}

/// Alpaca: the instruction, then the input on a line of its own when there is one; the
/// output's length is the output length.
fn alpaca(text: &str) -> Result<Vec<Entry>, DatasetError> {
    #[derive(serde::Deserialize)]
    struct Row {
        instruction: String,
        #[serde(default)]
        input: String,
        output: String,
    }
    let all: Vec<Row> =
        serde_json::from_str(text).map_err(|e| DatasetError::json(Layout::Alpaca, &e))?;
    Ok(all
        .into_iter()
        .map(|r| Entry {
            prompt: if r.input.trim().is_empty() {
                r.instruction
            } else {
                format!("{}\n{}", r.instruction, r.input)
            },
            reply: Some(r.output),
            max_tokens: None,
            length: None,
        })
        .collect())
}

/// LongBench's rows: the prompt from its per-dataset template, the output limit from its
/// per-dataset maximum (`longbench.json`, from LongBench's `config/`); a dataset it does not list
/// gets a generic question-answer template and 128 tokens.
fn longbench(text: &str) -> Result<Vec<Entry>, DatasetError> {
    #[derive(serde::Deserialize)]
    struct Row {
        context: String,
        input: String,
        dataset: String,
        #[serde(default)]
        length: Option<u64>,
    }
    each_line(text, |line, l| {
        let r: Row = serde_json::from_str(l)
            .map_err(|e| DatasetError::json(Layout::LongBench, &e))
            .map_err(|e| DatasetError::at(line, e.what))?;
        let (template, max) = longbench_template(&r.dataset);
        Ok(Entry {
            prompt: fill(template, &r.context, &r.input),
            reply: None,
            max_tokens: Some(max),
            length: r.length,
        })
    })
}

/// LongBench's template and output maximum for `dataset` (LongBench-E's `_e` names included).
pub fn longbench_template(dataset: &str) -> (&'static str, u32) {
    /// LongBench's `config/dataset2prompt.json` and `dataset2maxlen.json` (MIT licence), as one
    /// table: name, maximum new tokens, template.
    #[derive(serde::Deserialize)]
    struct Known {
        name: String,
        max_new_tokens: u32,
        template: String,
    }
    static TABLE: std::sync::LazyLock<Vec<Known>> = std::sync::LazyLock::new(|| {
        serde_json::from_str(include_str!("longbench.json")).unwrap_or_default()
    });
    const GENERIC: &str = "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following question based on the above text.\n\nQuestion: {input}\nAnswer:";
    let name = dataset.strip_suffix("_e").unwrap_or(dataset);
    TABLE
        .iter()
        .find(|k| k.name == name)
        .map_or((GENERIC, 128), |k| (k.template.as_str(), k.max_new_tokens))
}

/// LongBench-E's length buckets (`--longbench-length`): `0-4k`, `4-8k`, `8k+`, as the half-open
/// range of `length` each holds.
pub fn longbench_bucket(name: &str) -> Option<std::ops::Range<u64>> {
    Some(match name {
        "0-4k" => 0..4000,
        "4-8k" => 4000..8000,
        "8k+" => 8000..u64::MAX,
        _ => return None,
    })
}

/// `template` with `{context}` and `{input}` filled in one pass (a context that itself holds
/// `{input}` stays as it is).
fn fill(template: &str, context: &str, input: &str) -> String {
    let mut out = String::with_capacity(template.len() + context.len() + input.len());
    let mut rest = template;
    while let Some(i) = rest.find('{') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(t) = tail.strip_prefix("{context}") {
            out.push_str(context);
            rest = t;
        } else if let Some(t) = tail.strip_prefix("{input}") {
            out.push_str(input);
            rest = t;
        } else {
            out.push('{');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// Generic JSONL: a string per line, or an object with `field`.
fn jsonl(text: &str, field: &str) -> Result<Vec<Entry>, DatasetError> {
    each_line(text, |line, l| {
        let v: serde_json::Value = serde_json::from_str(l).map_err(|e| {
            DatasetError::at(
                line,
                format!("not JSON: {}", DatasetError::json(Layout::Jsonl, &e).what),
            )
        })?;
        let prompt = match &v {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Object(m) => match m.get(field) {
                Some(serde_json::Value::String(s)) => s.clone(),
                _ => {
                    return Err(DatasetError::at(
                        line,
                        format!("no string \"{field}\" (keys: {})", keys(m)),
                    ))
                }
            },
            _ => return Err(DatasetError::at(line, "neither a string nor an object")),
        };
        Ok(Entry {
            prompt,
            reply: None,
            max_tokens: None,
            length: None,
        })
    })
}

fn keys(m: &serde_json::Map<String, serde_json::Value>) -> String {
    let mut k: Vec<&str> = m.keys().map(String::as_str).take(8).collect();
    if m.len() > 8 {
        k.push("…");
    }
    k.join(", ")
}

fn each_line(
    text: &str,
    mut f: impl FnMut(usize, &str) -> Result<Entry, DatasetError>,
) -> Result<Vec<Entry>, DatasetError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| f(i + 1, l))
        .collect()
}

/// Common English words, each one token (with the space before it) in the tokenizers of the
/// Llama, Mistral, Qwen and GPT families: random prompts are built of them.
pub(crate) const VOCAB: [&str; 32] = [
    "explain", "the", "latency", "of", "a", "model", "server", "under", "load", "in", "plain",
    "words", "time", "first", "token", "each", "user", "request", "to", "and", "with", "when",
    "is", "for", "this", "that", "from", "what", "how", "one", "more", "day",
];

/// `n` words drawn from `VOCAB`.
pub(crate) fn words_of(rng: &mut crate::util::Rng, n: usize) -> Vec<&'static str> {
    (0..n)
        .map(|_| VOCAB[(rng.next_u64() % VOCAB.len() as u64) as usize])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharegpt_takes_the_first_two_turns_and_skips_short_conversations() {
        let share = r#"[{"id":"a","conversations":[{"from":"human","value":"hi there"},{"from":"gpt","value":"hello you"}]},{"conversations":[{"from":"human","value":"alone"}]}]"#;
        let (layout, e) = load(share, None, "prompt").unwrap_or((Layout::Jsonl, vec![]));
        assert_eq!(layout, Layout::ShareGpt);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].prompt, "hi there");
        assert_eq!(e[0].reply.as_deref(), Some("hello you"));
    }

    #[test]
    fn alpaca_joins_instruction_and_input() {
        let text = r#"[{"instruction":"Translate.","input":"bonjour","output":"hello"},{"instruction":"Name a colour.","input":"","output":"red"}]"#;
        let (layout, e) = load(text, None, "prompt").unwrap_or((Layout::Jsonl, vec![]));
        assert_eq!(layout, Layout::Alpaca);
        assert_eq!(e[0].prompt, "Translate.\nbonjour");
        assert_eq!(e[1].prompt, "Name a colour.");
        assert_eq!(e[1].reply.as_deref(), Some("red"));
    }

    #[test]
    fn longbench_uses_its_template_and_limit() {
        let text = "{\"context\":\"C {input} C\",\"input\":\"Q?\",\"answers\":[\"a\"],\"dataset\":\"hotpotqa_e\",\"length\":10}\n\
                    {\"context\":\"X\",\"input\":\"Y\",\"answers\":[],\"dataset\":\"unknown\",\"length\":3}\n";
        let (layout, e) = load(text, None, "prompt").unwrap_or((Layout::Jsonl, vec![]));
        assert_eq!(layout, Layout::LongBench);
        assert!(e[0]
            .prompt
            .starts_with("Answer the question based on the given passages."));
        assert!(
            e[0].prompt.contains("passages.\nC {input} C\n\n"),
            "{}",
            e[0].prompt
        );
        assert!(e[0].prompt.ends_with("Question: Q?\nAnswer:"));
        assert_eq!(e[0].max_tokens, Some(32));
        assert_eq!(e[1].max_tokens, Some(128));
        assert!(e[1].prompt.contains("X") && e[1].prompt.ends_with("Question: Y\nAnswer:"));
        assert_eq!(longbench_template("gov_report").1, 512);
    }

    #[test]
    fn jsonl_with_a_field_and_errors_that_say_where_and_what_is_accepted() {
        let jsonl = "{\"prompt\":\"a\"}\n\n\"b\"\n";
        let (_, e) = load(jsonl, None, "prompt").unwrap_or((Layout::ShareGpt, vec![]));
        assert_eq!(
            e.iter().map(|e| e.prompt.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        let q = "{\"question\":\"why\"}\n";
        assert_eq!(load(q, None, "question").map(|(_, e)| e.len()), Ok(1));
        let err = load("{\"q\":1}\n{\"x\":1}", None, "prompt")
            .err()
            .map(|e| e.to_string());
        let err = err.unwrap_or_default();
        assert!(
            err.starts_with("line 1: no string \"prompt\" (keys: q)"),
            "{err}"
        );
        assert!(err.contains("accepted layouts: ShareGPT"), "{err}");
        // A ShareGPT file with a broken entry: the line of the break.
        let broken =
            "[\n{\"conversations\":[{\"from\":\"human\",\"value\":\"a\"},\n{\"from\":\"gpt\"}]}\n]";
        let err = load(broken, None, "prompt").err();
        assert_eq!(err.as_ref().and_then(|e| e.line), Some(3));
        assert!(err.is_some_and(|e| e.what.contains("missing field `value`")));
        // An Alpaca file asked to be read as ShareGPT.
        let alpaca = r#"[{"instruction":"a","output":"b"}]"#;
        let err = load(alpaca, Some(Layout::ShareGpt), "prompt").err();
        assert!(err.is_some_and(|e| e.what.contains("no usable entries in the sharegpt layout")));
        assert!(load("[{\"x\":1}]", None, "prompt").is_err());
    }
}
