//! Reading a Prometheus text exposition (format 0.0.4, and OpenMetrics text): the samples of a
//! backend's `/metrics`, for the engine metrics joined to requests. Lenient and bounded: comments,
//! blank and malformed lines are skipped, nothing is allocated per sample.

/// One sample: `name{labels} value`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample<'a> {
    /// Metric name (for a histogram's series, with its `_bucket`/`_sum`/`_count` suffix).
    pub name: &'a str,
    /// The label set as written, without its braces (`""` when none).
    pub labels: &'a str,
    /// The value (`NaN` and infinities included).
    pub value: f64,
}

/// Every well-formed sample of `text`, in order.
pub fn samples(text: &str) -> impl Iterator<Item = Sample<'_>> {
    text.lines().filter_map(parse_line)
}

fn parse_line(line: &str) -> Option<Sample<'_>> {
    let line = line.trim_start();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line
        .find(|c: char| c == '{' || c.is_ascii_whitespace())
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut labels = "";
    if let Some(inner) = rest.strip_prefix('{') {
        let close = closing_brace(inner)?;
        labels = &inner[..close];
        rest = &inner[close + 1..];
    }
    let value = rest.split_ascii_whitespace().next()?.parse::<f64>().ok()?;
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// The offset of the `}` that closes a label set, quotes and escapes respected.
fn closing_brace(s: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(i),
            _ => {}
        }
    }
    None
}

/// The value of label `key` in a raw label set, unescaped only when it has no escapes (`None`
/// for an escaped value or a missing key).
pub fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    pairs(labels)
        .find(|(k, _)| *k == key)
        .and_then(|(_, value)| (!value.contains('\\')).then_some(value))
}

/// Every `key="value"` of a raw label set, in order, values as written (escapes kept); stops at
/// the first malformed pair.
pub fn pairs(labels: &str) -> impl Iterator<Item = (&str, &str)> {
    let mut rest = labels;
    std::iter::from_fn(move || {
        rest = rest.trim_start_matches([',', ' ']);
        let eq = rest.find('=')?;
        let k = rest[..eq].trim();
        let v = rest[eq + 1..].trim_start().strip_prefix('"')?;
        let end = closing_quote(v)?;
        rest = &v[end + 1..];
        Some((k, &v[..end]))
    })
}

fn closing_quote(s: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return Some(i),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_label_pair_as_written() {
        let set = r#"block_size="16", cache_dtype="auto",note="a \"quoted\" word",x="1""#;
        let all: Vec<(&str, &str)> = pairs(set).collect();
        assert_eq!(
            all,
            [
                ("block_size", "16"),
                ("cache_dtype", "auto"),
                ("note", r#"a \"quoted\" word"#),
                ("x", "1")
            ]
        );
        assert_eq!(label(set, "x"), Some("1"));
        assert_eq!(label(set, "note"), None, "escaped: not unescaped here");
        // A value without quotes ends the reading.
        assert_eq!(pairs("a=1,b=\"2\"").count(), 0);
    }

    #[test]
    fn reads_samples_and_skips_the_rest() {
        let text = "# HELP vllm:num_requests_running Number of requests.\n\
            # TYPE vllm:num_requests_running gauge\n\
            vllm:num_requests_running{engine=\"0\",model_name=\"m{1}\"} 3.0\n\
            vllm:kv_cache_usage_perc{model_name=\"a\\\"b\"} 0.25 1700000000000\n\
            plain 7\n\
            broken{a=\"1\" 5\n\
            nan_one NaN\n\
            \n\
            no_value\n";
        let s: Vec<Sample<'_>> = samples(text).collect();
        assert_eq!(s.len(), 4);
        assert_eq!(s[0].name, "vllm:num_requests_running");
        assert_eq!(s[0].value, 3.0);
        assert_eq!(label(s[0].labels, "model_name"), Some("m{1}"));
        assert_eq!(label(s[0].labels, "engine"), Some("0"));
        assert_eq!(s[1].value, 0.25);
        assert_eq!(
            label(s[1].labels, "model_name"),
            None,
            "escaped: not borrowed"
        );
        assert_eq!((s[2].name, s[2].labels, s[2].value), ("plain", "", 7.0));
        assert!(s[3].value.is_nan());
    }
}
