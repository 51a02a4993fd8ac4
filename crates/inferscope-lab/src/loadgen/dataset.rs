//! Prompts for `inferscope bench`: a ShareGPT JSON file (the first human turn of each
//! conversation), a JSONL file of `{"prompt": …}` objects or plain strings, or synthetic prompts of
//! a given length.

/// A prompt file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PromptsError {
    /// Starts like a ShareGPT array but is not JSON.
    #[error("not a ShareGPT JSON array: {0}")]
    ShareGpt(serde_json::Error),
    /// A JSON line that is not JSON.
    #[error("line {line}: {error}")]
    Line {
        /// 1-based.
        line: usize,
        /// The JSON error.
        error: serde_json::Error,
    },
    /// A JSON line that is neither a string nor has `prompt`.
    #[error("line {0}: no \"prompt\"")]
    NoPrompt(usize),
    /// Nothing usable.
    #[error("no prompts found")]
    Empty,
}

/// Loads prompts from `text` (ShareGPT JSON array, or JSON lines).
pub fn load_prompts(text: &str) -> Result<Vec<String>, PromptsError> {
    let trimmed = text.trim_start();
    let prompts: Vec<String> = if trimmed.starts_with('[') {
        /// A ShareGPT conversation: its turns, the first human one the prompt.
        #[derive(serde::Deserialize)]
        struct Conversation {
            #[serde(default)]
            conversations: Vec<Turn>,
        }
        #[derive(serde::Deserialize)]
        struct Turn {
            #[serde(default)]
            from: String,
            #[serde(default)]
            value: Option<String>,
        }
        let all: Vec<Conversation> =
            serde_json::from_str(trimmed).map_err(PromptsError::ShareGpt)?;
        all.into_iter()
            .filter_map(|c| {
                c.conversations
                    .into_iter()
                    .find(|t| matches!(t.from.as_str(), "human" | "user"))
                    .and_then(|t| t.value)
            })
            .collect()
    } else {
        text.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                /// A JSONL line: a string, or an object with a `prompt`.
                #[derive(serde::Deserialize)]
                #[serde(untagged)]
                enum Line {
                    Text(String),
                    Object { prompt: Option<String> },
                    Other(serde::de::IgnoredAny),
                }
                match serde_json::from_str::<Line>(l) {
                    Ok(Line::Text(s) | Line::Object { prompt: Some(s) }) => Ok(s),
                    Ok(_) => Err(PromptsError::NoPrompt(i + 1)),
                    Err(error) => Err(PromptsError::Line { line: i + 1, error }),
                }
            })
            .collect::<Result<_, _>>()?
    };
    if prompts.is_empty() {
        return Err(PromptsError::Empty);
    }
    Ok(prompts)
}

/// `n` synthetic prompts of about `words` words each.
pub fn synthetic_prompts(n: usize, words: usize, seed: u64) -> Vec<String> {
    const VOCAB: [&str; 12] = [
        "explain", "the", "latency", "of", "a", "model", "server", "under", "load", "in", "plain",
        "words",
    ];
    let mut rng = crate::util::Rng::new(seed);
    (0..n.max(1))
        .map(|_| {
            (0..words.max(1))
                .map(|_| VOCAB[(rng.next_u64() % VOCAB.len() as u64) as usize])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharegpt_jsonl_and_synthetic() {
        let share = r#"[{"conversations":[{"from":"human","value":"hi there"},{"from":"gpt","value":"hello"}]},{"conversations":[]}]"#;
        assert_eq!(load_prompts(share).unwrap_or_default(), vec!["hi there"]);
        let jsonl = "{\"prompt\":\"a\"}\n\"b\"\n";
        assert_eq!(load_prompts(jsonl).unwrap_or_default(), vec!["a", "b"]);
        assert!(load_prompts("{\"x\":1}").is_err());
        let s = synthetic_prompts(3, 5, 1);
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].split_whitespace().count(), 5);
        assert_eq!(s, synthetic_prompts(3, 5, 1));
    }
}
