//! The one Prometheus exposition writer: metric families with HELP and TYPE, samples whose
//! label values are always escaped — as text format 0.0.4, or as the protobuf format
//! (`io.prometheus.client.MetricFamily`, length-delimited) that carries native histograms.

use std::fmt::{Display, Write};

/// The protobuf exposition's content type.
pub(crate) const PROTOBUF_TYPE: &str =
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited";
/// The text exposition's content type.
pub(crate) const TEXT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether a scraper's `Accept` header asks for the protobuf format (Prometheus does with native
/// histograms enabled).
pub fn accepts_protobuf(accept: &str) -> bool {
    accept.split(',').any(|part| {
        let mut it = part.split(';').map(str::trim);
        it.next() == Some("application/vnd.google.protobuf")
            && part.contains("proto=io.prometheus.client.MetricFamily")
            && part.contains("encoding=delimited")
            && !part.replace(' ', "").contains("q=0;")
            && !part.replace(' ', "").ends_with("q=0")
    })
}

/// Label pairs rendered once (`a="x",b="y"`, values escaped) and reused for many samples.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Labels(String, Vec<(String, String)>);

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
        let raw = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Self(s, raw)
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

/// A sample value: a number that prints as Prometheus text and converts to `f64`.
pub trait Num: Display {
    /// As a float (the protobuf format's type).
    fn as_f64(&self) -> f64;
}

macro_rules! num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            #[allow(clippy::cast_precision_loss, clippy::cast_lossless)]
            fn as_f64(&self) -> f64 {
                *self as f64
            }
        }
    )*};
}
num!(u8, u32, u64, usize, i32, i64, f64);

impl<T: Num + ?Sized> Num for &T {
    fn as_f64(&self) -> f64 {
        (**self).as_f64()
    }
}

/// A native histogram's buckets (Prometheus' sparse exponential histogram): bucket `i` of schema
/// `s` holds values in `(2^((i-1)/2^s), 2^(i/2^s)]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Native {
    /// Resolution: each power of two is split into `2^schema` buckets.
    pub schema: i32,
    /// Values at or below this count in `zero_count`.
    pub zero_threshold: f64,
    /// Values at or below the zero threshold.
    pub zero_count: u64,
    /// Runs of buckets: (offset from the previous run's end, or the first index; length).
    pub spans: Vec<(i32, u32)>,
    /// Bucket counts, each as the difference from the previous bucket's.
    pub deltas: Vec<i64>,
}

impl Native {
    /// From ascending `(index, count)` pairs of non-empty buckets.
    pub(crate) fn from_buckets(
        schema: i32,
        zero_threshold: f64,
        zero_count: u64,
        buckets: &[(i32, u64)],
    ) -> Self {
        let mut n = Self {
            schema,
            zero_threshold,
            zero_count,
            ..Self::default()
        };
        let (mut prev_count, mut next_index) = (0i64, None::<i32>);
        for &(i, c) in buckets {
            match next_index {
                Some(next) if i == next => {
                    if let Some(last) = n.spans.last_mut() {
                        last.1 += 1;
                    }
                }
                Some(next) => n.spans.push((i - next, 1)),
                None => n.spans.push((i, 1)),
            }
            let c = i64::try_from(c).unwrap_or(i64::MAX);
            n.deltas.push(c - prev_count);
            prev_count = c;
            next_index = Some(i + 1);
        }
        n
    }
}

/// `io.prometheus.client` messages (metrics.proto), as much as an exposition writes.
mod pb {
    #![allow(missing_docs)]
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct LabelPair {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub value: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Value {
        #[prost(double, tag = "1")]
        pub value: f64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Bucket {
        #[prost(uint64, tag = "1")]
        pub cumulative_count: u64,
        #[prost(double, tag = "2")]
        pub upper_bound: f64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct BucketSpan {
        #[prost(sint32, tag = "1")]
        pub offset: i32,
        #[prost(uint32, tag = "2")]
        pub length: u32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Histogram {
        #[prost(uint64, tag = "1")]
        pub sample_count: u64,
        #[prost(double, tag = "2")]
        pub sample_sum: f64,
        #[prost(message, repeated, tag = "3")]
        pub bucket: Vec<Bucket>,
        #[prost(sint32, tag = "5")]
        pub schema: i32,
        #[prost(double, tag = "6")]
        pub zero_threshold: f64,
        #[prost(uint64, tag = "7")]
        pub zero_count: u64,
        #[prost(message, repeated, tag = "12")]
        pub positive_span: Vec<BucketSpan>,
        #[prost(sint64, repeated, tag = "13")]
        pub positive_delta: Vec<i64>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Metric {
        #[prost(message, repeated, tag = "1")]
        pub label: Vec<LabelPair>,
        #[prost(message, optional, tag = "2")]
        pub gauge: Option<Value>,
        #[prost(message, optional, tag = "3")]
        pub counter: Option<Value>,
        #[prost(message, optional, tag = "5")]
        pub untyped: Option<Value>,
        #[prost(message, optional, tag = "7")]
        pub histogram: Option<Histogram>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct MetricFamily {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub help: String,
        /// COUNTER 0, GAUGE 1, SUMMARY 2, UNTYPED 3, HISTOGRAM 4.
        #[prost(int32, tag = "3")]
        pub r#type: i32,
        #[prost(message, repeated, tag = "4")]
        pub metric: Vec<Metric>,
    }
}

/// An exposition being written.
#[derive(Debug, Default)]
pub struct Writer {
    out: String,
    /// Protobuf mode: the finished families, and the one being written.
    proto: Option<(Vec<u8>, Option<pb::MetricFamily>)>,
}

impl Writer {
    /// An empty text exposition.
    pub fn new() -> Self {
        Self {
            out: String::with_capacity(8192),
            proto: None,
        }
    }

    /// An empty protobuf exposition.
    pub fn protobuf() -> Self {
        Self {
            out: String::new(),
            proto: Some((Vec::with_capacity(16 * 1024), None)),
        }
    }

    /// Whether this writes the protobuf format.
    pub(crate) fn is_protobuf(&self) -> bool {
        self.proto.is_some()
    }

    fn flush_family(&mut self) {
        if let Some((bytes, fam)) = &mut self.proto {
            if let Some(f) = fam.take() {
                let _ = prost::Message::encode_length_delimited(&f, bytes);
            }
        }
    }

    /// Starts a family: `# HELP` and `# TYPE` lines (`kind`: counter, gauge, histogram).
    pub fn family(&mut self, name: &str, kind: &str, help: &str) -> &mut Self {
        if self.proto.is_some() {
            self.flush_family();
            let r#type = match kind {
                "counter" => 0,
                "gauge" => 1,
                "histogram" => 4,
                _ => 3,
            };
            if let Some((_, fam)) = &mut self.proto {
                *fam = Some(pb::MetricFamily {
                    name: name.to_owned(),
                    help: help.to_owned(),
                    r#type,
                    metric: Vec::new(),
                });
            }
            return self;
        }
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        self
    }

    /// Adds a metric to the current family (protobuf mode).
    fn push_metric(
        &mut self,
        name: &str,
        labels: &Labels,
        extra: Option<(&str, &str)>,
        fill: impl FnOnce(&mut pb::Metric, i32),
    ) {
        let Some((_, fam)) = &mut self.proto else {
            return;
        };
        if fam.as_ref().is_none_or(|f| f.name != name) {
            // A sample without its family: an untyped family of its own.
            self.family(name, "untyped", "");
        }
        let Some((_, Some(f))) = &mut self.proto else {
            return;
        };
        let mut label: Vec<pb::LabelPair> = labels
            .1
            .iter()
            .map(|(k, v)| pb::LabelPair {
                name: k.clone(),
                value: v.clone(),
            })
            .collect();
        if let Some((k, v)) = extra {
            label.push(pb::LabelPair {
                name: k.to_owned(),
                value: v.to_owned(),
            });
        }
        let mut m = pb::Metric {
            label,
            ..pb::Metric::default()
        };
        fill(&mut m, f.r#type);
        f.metric.push(m);
    }

    /// A whole family: `# HELP`, `# TYPE`, then one sample per `(labels, value)`.
    pub fn series<'a, V: Num>(
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
    pub fn sample(&mut self, name: &str, labels: &Labels, value: impl Num) -> &mut Self {
        self.sample_with(name, labels, None, value)
    }

    /// One sample with one more label after `labels` (`outcome`, `le`), its value escaped too.
    pub(crate) fn sample_with(
        &mut self,
        name: &str,
        labels: &Labels,
        extra: Option<(&str, &str)>,
        value: impl Num,
    ) -> &mut Self {
        if self.proto.is_some() {
            let v = Some(pb::Value {
                value: value.as_f64(),
            });
            self.push_metric(name, labels, extra, |m, kind| match kind {
                0 => m.counter = v,
                1 => m.gauge = v,
                _ => m.untyped = v,
            });
            return self;
        }
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
        self.histogram_with(name, labels, bounds, count_le, sum, count, None)
    }

    /// A histogram with its native buckets too: the protobuf format carries both (a Prometheus
    /// with native histograms enabled keeps the native one), the text format the classic one.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn histogram_with(
        &mut self,
        name: &str,
        labels: &Labels,
        bounds: &[f64],
        count_le: impl Fn(f64) -> u64,
        sum: f64,
        count: u64,
        native: Option<&Native>,
    ) -> &mut Self {
        if self.proto.is_some() {
            let mut h = pb::Histogram {
                sample_count: count,
                sample_sum: sum,
                bucket: bounds
                    .iter()
                    .map(|le| pb::Bucket {
                        cumulative_count: count_le(*le),
                        upper_bound: *le,
                    })
                    .collect(),
                ..pb::Histogram::default()
            };
            if let Some(n) = native {
                h.schema = n.schema;
                h.zero_threshold = n.zero_threshold;
                h.zero_count = n.zero_count;
                h.positive_span = n
                    .spans
                    .iter()
                    .map(|(offset, length)| pb::BucketSpan {
                        offset: *offset,
                        length: *length,
                    })
                    .collect();
                h.positive_delta = n.deltas.clone();
            }
            self.push_metric(name, labels, None, |m, _| m.histogram = Some(h));
            return self;
        }
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

    /// The text (empty in protobuf mode: see `into_body`).
    pub fn finish(self) -> String {
        self.out
    }

    /// The exposition and its content type.
    pub fn into_body(mut self) -> (&'static str, bytes::Bytes) {
        self.flush_family();
        match self.proto.take() {
            Some((bytes, _)) => (PROTOBUF_TYPE, bytes.into()),
            None => (TEXT_TYPE, self.out.into()),
        }
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
    fn protobuf_is_negotiated_as_prometheus_asks_for_it() {
        // What Prometheus 2.42 sends with native histograms enabled, and without.
        assert!(accepts_protobuf("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"));
        assert!(!accepts_protobuf("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"));
        assert!(!accepts_protobuf(
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=text"
        ));
    }

    #[test]
    fn native_spans_and_deltas_follow_the_format() {
        // Buckets 3, 4, 7 (a gap of 2 after 4): spans (3, 2), (2, 1); counts 5, 2, 4.
        let n = Native::from_buckets(5, 1e-9, 0, &[(3, 5), (4, 2), (7, 4)]);
        assert_eq!(n.spans, vec![(3, 2), (2, 1)]);
        assert_eq!(n.deltas, vec![5, -3, 2]);
    }

    #[test]
    fn the_protobuf_exposition_decodes_to_the_same_families() {
        let mut w = Writer::protobuf();
        let l = Labels::new(&[("route", "a")]);
        w.family("c_total", "counter", "C.").sample_with(
            "c_total",
            &l,
            Some(("outcome", "ok")),
            3u64,
        );
        w.family("h_seconds", "histogram", "H.");
        let n = Native::from_buckets(5, 1e-9, 0, &[(-100, 2)]);
        w.histogram_with(
            "h_seconds",
            &l,
            &[0.1, 1.0],
            |le| if le >= 0.1 { 2 } else { 0 },
            0.2,
            2,
            Some(&n),
        );
        let (ctype, body) = w.into_body();
        assert_eq!(ctype, PROTOBUF_TYPE);
        let mut buf = &body[..];
        let c = <pb::MetricFamily as prost::Message>::decode_length_delimited(&mut buf)
            .unwrap_or_default();
        assert_eq!((c.name.as_str(), c.r#type), ("c_total", 0));
        assert_eq!(c.metric[0].counter.as_ref().map(|v| v.value), Some(3.0));
        assert_eq!(c.metric[0].label.len(), 2);
        let h = <pb::MetricFamily as prost::Message>::decode_length_delimited(&mut buf)
            .unwrap_or_default();
        let hist = h.metric[0].histogram.clone().unwrap_or_default();
        assert_eq!((h.r#type, hist.sample_count, hist.schema), (4, 2, 5));
        assert_eq!(
            hist.positive_span,
            vec![pb::BucketSpan {
                offset: -100,
                length: 1
            }]
        );
        assert_eq!(hist.positive_delta, vec![2]);
        assert_eq!(hist.bucket.len(), 2);
        assert!(buf.is_empty());
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
