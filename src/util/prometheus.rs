//! The one Prometheus text-format (0.0.4) writer: metric families with HELP and TYPE, samples
//! whose label values are always escaped.

use std::fmt::{Display, Write};

/// Label pairs rendered once (`a="x",b="y"`, values escaped) and reused for many samples.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Labels(String);

impl Labels {
    /// Renders `pairs`, escaping every value.
    pub fn new(pairs: &[(&str, &str)]) -> Self {
        let mut s = String::new();
        for (i, (k, v)) in pairs.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str(k);
            s.push_str("=\"");
            escape_into(&mut s, v);
            s.push('"');
        }
        Self(s)
    }

    /// No labels.
    pub fn none() -> Self {
        Self::default()
    }
}

/// Appends `v` escaped as a label value (backslash, double quote, newline).
fn escape_into(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// An exposition being written.
#[derive(Debug, Default)]
pub struct Writer {
    out: String,
}

impl Writer {
    /// An empty exposition.
    pub fn new() -> Self {
        Self {
            out: String::with_capacity(8192),
        }
    }

    /// Starts a family: `# HELP` and `# TYPE` lines (`kind`: counter, gauge, histogram).
    pub fn family(&mut self, name: &str, kind: &str, help: &str) -> &mut Self {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        self
    }

    /// A whole family: `# HELP`, `# TYPE`, then one sample per `(labels, value)`.
    pub fn series<'a, V: Display>(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        samples: impl IntoIterator<Item = (&'a Labels, V)>,
    ) -> &mut Self {
        self.family(name, kind, help);
        for (labels, value) in samples {
            self.sample(name, labels, value);
        }
        self
    }

    /// One sample: `name{labels} value`.
    pub fn sample(&mut self, name: &str, labels: &Labels, value: impl Display) -> &mut Self {
        self.sample_with(name, labels, None, value)
    }

    /// One sample with one more label after `labels` (`outcome`, `le`), its value escaped too.
    pub fn sample_with(
        &mut self,
        name: &str,
        labels: &Labels,
        extra: Option<(&str, &str)>,
        value: impl Display,
    ) -> &mut Self {
        self.out.push_str(name);
        if !labels.0.is_empty() || extra.is_some() {
            self.out.push('{');
            self.out.push_str(&labels.0);
            if let Some((k, v)) = extra {
                if !labels.0.is_empty() {
                    self.out.push(',');
                }
                self.out.push_str(k);
                self.out.push_str("=\"");
                escape_into(&mut self.out, v);
                self.out.push('"');
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
        self
    }

    /// A histogram's samples: cumulative `_bucket`s for each upper bound `le` (seconds) with
    /// `count_le(le)`, then `+Inf`, `_sum` and `_count`.
    pub fn histogram(
        &mut self,
        name: &str,
        labels: &Labels,
        bounds: &[f64],
        count_le: impl Fn(f64) -> u64,
        sum: f64,
        count: u64,
    ) -> &mut Self {
        let bucket = format!("{name}_bucket");
        for le in bounds {
            self.sample_with(
                &bucket,
                labels,
                Some(("le", &le.to_string())),
                count_le(*le),
            );
        }
        self.sample_with(&bucket, labels, Some(("le", "+Inf")), count);
        self.sample(&format!("{name}_sum"), labels, sum);
        self.sample(&format!("{name}_count"), labels, count);
        self
    }

    /// The text.
    pub fn finish(self) -> String {
        self.out
    }

    /// Appends another exposition's text.
    pub fn append(&mut self, other: Writer) {
        self.out.push_str(&other.out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_label_value_is_escaped() {
        let mut w = Writer::new();
        let l = Labels::new(&[("route", "a\"b"), ("model", "x\\y\nz")]);
        w.family("m", "gauge", "Help.")
            .sample("m", &l, 1)
            .sample_with("m", &l, Some(("outcome", "o\"k")), 2)
            .sample("n", &Labels::none(), 3.5);
        assert_eq!(
            w.finish(),
            "# HELP m Help.\n# TYPE m gauge\nm{route=\"a\\\"b\",model=\"x\\\\y\\nz\"} 1\nm{route=\"a\\\"b\",model=\"x\\\\y\\nz\",outcome=\"o\\\"k\"} 2\nn 3.5\n"
        );
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_end_at_count() {
        let samples = [0.003, 0.03, 0.3, 3.0];
        let mut w = Writer::new();
        let le = |b: f64| samples.iter().filter(|s| **s <= b).count() as u64;
        w.histogram(
            "x",
            &Labels::new(&[("a", "b")]),
            &[0.005, 0.04, 0.5],
            le,
            3.333,
            4,
        );
        let out = w.finish();
        assert!(out.contains("x_bucket{a=\"b\",le=\"0.005\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{a=\"b\",le=\"0.04\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{a=\"b\",le=\"0.5\"} 3\n"), "{out}");
        assert!(out.contains("x_bucket{a=\"b\",le=\"+Inf\"} 4\n"), "{out}");
        assert!(out.contains("x_sum{a=\"b\"} 3.333\n"), "{out}");
        assert!(out.contains("x_count{a=\"b\"} 4\n"), "{out}");
    }
}
