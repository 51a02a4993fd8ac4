//! Quality signals: `POST /feedback {request_id, name, value}` (a number or a boolean), joined to
//! the variant that served the request, appended to a JSONL file when one is configured, and
//! aggregated per variant with a 95% confidence interval.

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

/// Finished requests remembered for joining feedback (oldest forgotten first).
pub(super) const REMEMBERED: usize = 200_000;

/// Distinct signal names per route (a name beyond them is refused).
pub(super) const MAX_SIGNALS: usize = 32;

/// Largest magnitude of a value: sums of squares stay finite and means meaningful.
pub(super) const MAX_VALUE: f64 = 1e9;

/// Why feedback was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeedbackError {
    /// Not `{request_id, name, value}` with a number or boolean value.
    #[error("expected {{request_id, name, value: number or boolean}}: {0}")]
    Invalid(String),
    /// No finished experiment request with that id is remembered.
    #[error("no finished experiment request with that request_id")]
    UnknownRequest,
    /// This request already has a value for this signal.
    #[error("this request_id already has feedback named `{0}`")]
    Duplicate(String),
    /// The feedback file could not be written.
    #[error("feedback not stored: {0}")]
    Storage(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Posted {
    request_id: String,
    name: String,
    value: Value,
}

/// Running sums of one signal for one variant.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FeedbackStats {
    /// Values received.
    pub n: u64,
    sum: f64,
    sum_sq: f64,
}

impl FeedbackStats {
    fn add(&mut self, x: f64) {
        self.n += 1;
        self.sum += x;
        self.sum_sq += x * x;
    }

    /// Mean of the values.
    pub fn mean(&self) -> f64 {
        if self.n == 0 {
            f64::NAN
        } else {
            self.sum / self.n as f64
        }
    }

    /// 95% interval of the mean (normal approximation; for 0/1 values, the Wald interval).
    pub fn interval(&self) -> (f64, f64) {
        if self.n < 2 {
            return (f64::NAN, f64::NAN);
        }
        let n = self.n as f64;
        let mean = self.mean();
        let var = ((self.sum_sq - n * mean * mean) / (n - 1.0)).max(0.0);
        let half = 1.96 * (var / n).sqrt();
        (mean - half, mean + half)
    }
}

/// Per (variant, signal name): running sums.
type SignalStats = BTreeMap<(Arc<str>, String), FeedbackStats>;

/// A finished request feedback can join: its route and variant, and which of the route's
/// signals it already has (bit i: the route's i-th signal name).
#[derive(Debug, Clone)]
struct Served {
    route: Arc<str>,
    variant: Arc<str>,
    voted: u32,
}

#[derive(Debug, Default)]
struct Inner {
    by_request: HashMap<Arc<str>, Served>,
    order: VecDeque<Arc<str>>,
    stats: HashMap<Arc<str>, SignalStats>,
    /// Signal names seen per route, in arrival order (at most `MAX_SIGNALS`).
    names: HashMap<Arc<str>, Vec<String>>,
}

/// Feedback storage and aggregation.
#[derive(Debug, Default)]
pub struct Feedback {
    inner: Mutex<Inner>,
    /// `feedback.path`, where configured: accepted feedback as JSON lines (never read back).
    journal: std::sync::OnceLock<super::journal::Journal>,
}

impl Feedback {
    /// Appends accepted feedback to `path` as JSON lines (synced before each is answered, by the
    /// journal's own thread). Fails when `path` cannot be opened to append to (not a regular
    /// file, no such directory, read-only).
    pub fn persist_to(&self, path: &std::path::Path) -> std::io::Result<()> {
        let _ = self
            .journal
            .set(super::journal::Journal::log(path, "feedback")?);
        Ok(())
    }

    /// The journal, where configured.
    pub fn journal(&self) -> Option<&super::journal::Journal> {
        self.journal.get()
    }

    /// Remembers which variant served a finished request.
    pub fn remember(&self, request_id: &Arc<str>, route: &Arc<str>, variant: &Arc<str>) {
        let mut i = self.inner.lock();
        if i.order.len() >= REMEMBERED {
            if let Some(old) = i.order.pop_front() {
                i.by_request.remove(&old);
            }
        }
        i.order.push_back(Arc::clone(request_id));
        i.by_request.insert(
            Arc::clone(request_id),
            Served {
                route: Arc::clone(route),
                variant: Arc::clone(variant),
                voted: 0,
            },
        );
    }

    /// Accepts one posted feedback body; returns the route and variant it was joined to, the
    /// signal's name and its value as a number. Bounded against hostile posts: a name is 1 to 64
    /// characters of `[A-Za-z0-9_.:-]`, a value at most `MAX_VALUE` in magnitude, a route has at
    /// most `MAX_SIGNALS` names, and a request one value per name.
    pub async fn post(
        &self,
        body: &[u8],
    ) -> Result<(Arc<str>, Arc<str>, String, f64), FeedbackError> {
        let p: Posted =
            serde_json::from_slice(body).map_err(|e| FeedbackError::Invalid(e.to_string()))?;
        let x = match &p.value {
            Value::Bool(b) => f64::from(u8::from(*b)),
            Value::Number(n) => n.as_f64().filter(|f| f.abs() <= MAX_VALUE).ok_or_else(|| {
                FeedbackError::Invalid(format!("value must be within ±{MAX_VALUE:e}"))
            })?,
            _ => {
                return Err(FeedbackError::Invalid(
                    "value must be a number or a boolean".into(),
                ))
            }
        };
        let name_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-');
        if p.name.is_empty() || p.name.len() > 64 || !p.name.chars().all(name_ok) {
            return Err(FeedbackError::Invalid(
                "name must be 1 to 64 characters of A-Z a-z 0-9 _ . : -".into(),
            ));
        }
        // Claim the (request, name) slot first, so concurrent duplicates cannot both count.
        let (route, variant, bit) = {
            let mut guard = self.inner.lock();
            let i = &mut *guard;
            let served = i
                .by_request
                .get_mut(p.request_id.as_str())
                .ok_or(FeedbackError::UnknownRequest)?;
            let names = i.names.entry(Arc::clone(&served.route)).or_default();
            let index = match names.iter().position(|n| *n == p.name) {
                Some(k) => k,
                None if names.len() < MAX_SIGNALS => {
                    names.push(p.name.clone());
                    names.len() - 1
                }
                None => {
                    return Err(FeedbackError::Invalid(format!(
                        "route `{}` has {MAX_SIGNALS} signal names already",
                        served.route
                    )))
                }
            };
            let bit = 1u32 << index;
            if served.voted & bit != 0 {
                return Err(FeedbackError::Duplicate(p.name));
            }
            served.voted |= bit;
            (Arc::clone(&served.route), Arc::clone(&served.variant), bit)
        };
        let stored = self
            .store(&json!({
                "ts": crate::util::time::rfc3339(std::time::SystemTime::now()),
                "request_id": p.request_id, "route": route.as_ref(), "variant": variant.as_ref(),
                "name": p.name, "value": p.value,
            }))
            .await;
        let mut i = self.inner.lock();
        if let Err(e) = stored {
            // Not stored, not counted: the client may send it again.
            if let Some(s) = i.by_request.get_mut(p.request_id.as_str()) {
                s.voted &= !bit;
            }
            return Err(e);
        }
        let key = (Arc::clone(&variant), p.name.clone());
        i.stats
            .entry(Arc::clone(&route))
            .or_default()
            .entry(key)
            .or_default()
            .add(x);
        Ok((route, variant, p.name, x))
    }

    /// Durable before acknowledged: on disk (synced) before the post is answered.
    async fn store(&self, line: &Value) -> Result<(), FeedbackError> {
        let Some(j) = self.journal.get() else {
            return Ok(());
        };
        j.append_synced(line.to_string())
            .await
            .map_err(|e| FeedbackError::Storage(e.to_string()))
    }

    /// Per variant and signal name: n, mean and 95% interval, for one route.
    pub fn summary(&self, route: &str) -> Vec<FeedbackMean> {
        let i = self.inner.lock();
        let Some(stats) = i.stats.get(route) else {
            return Vec::new();
        };
        stats
            .iter()
            .map(|((variant, name), s)| {
                let (lo, hi) = s.interval();
                let f = |x: f64| x.is_finite().then_some(x);
                FeedbackMean {
                    variant: variant.to_string(),
                    name: name.clone(),
                    n: s.n,
                    mean: f(s.mean()),
                    ci: [f(lo), f(hi)],
                }
            })
            .collect()
    }
}

/// One signal of one variant: how many values, their mean and its 95% interval (`None`, `null`
/// in JSON, where too few values give none).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeedbackMean {
    /// The variant that served the requests.
    pub variant: String,
    /// The signal's name.
    pub name: String,
    /// Values received.
    pub n: u64,
    /// Their mean.
    pub mean: Option<f64>,
    /// 95% interval of the mean.
    pub ci: [Option<f64>; 2],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn joins_to_the_variant_and_aggregates() {
        let fb = Feedback::default();
        let (r, v1, v2) = (Arc::from("chat"), Arc::from("fp16"), Arc::from("int8"));
        for i in 0..10 {
            let id: Arc<str> = Arc::from(format!("req-{i}"));
            fb.remember(&id, &r, if i % 2 == 0 { &v1 } else { &v2 });
        }
        for i in 0..10 {
            let body = format!(
                r#"{{"request_id":"req-{i}","name":"thumbs_up","value":{}}}"#,
                i % 4 == 0
            );
            fb.post(body.as_bytes())
                .await
                .unwrap_or_else(|e| panic!("{e:?}"));
        }
        assert_eq!(
            fb.post(br#"{"request_id":"nope","name":"x","value":1}"#)
                .await,
            Err(FeedbackError::UnknownRequest)
        );
        assert!(matches!(
            fb.post(br#"{"request_id":"req-1","name":"x","value":"good"}"#)
                .await,
            Err(FeedbackError::Invalid(_))
        ));
        // One value per request and name; bounded values and names.
        assert_eq!(
            fb.post(br#"{"request_id":"req-0","name":"thumbs_up","value":true}"#)
                .await,
            Err(FeedbackError::Duplicate("thumbs_up".into()))
        );
        for bad in [
            r#"{"request_id":"req-0","name":"x","value":1e308}"#,
            r#"{"request_id":"req-0","name":"a\nb","value":1}"#,
            r#"{"request_id":"req-0","name":"","value":1}"#,
        ] {
            assert!(
                matches!(
                    fb.post(bad.as_bytes()).await,
                    Err(FeedbackError::Invalid(_))
                ),
                "{bad}"
            );
        }
        for k in 1..MAX_SIGNALS {
            let body = format!(r#"{{"request_id":"req-1","name":"s{k}","value":1}}"#);
            fb.post(body.as_bytes())
                .await
                .unwrap_or_else(|e| panic!("{e:?}"));
        }
        assert!(matches!(
            fb.post(br#"{"request_id":"req-1","name":"one-too-many","value":1}"#)
                .await,
            Err(FeedbackError::Invalid(_))
        ));
        let s = fb.summary("chat");
        let fp16 = s.iter().find(|x| x.variant == "fp16");
        // fp16 got req-0,2,4,6,8: thumbs up for 0, 4, 8 → 3 of 5.
        assert_eq!(fp16.map(|f| f.n), Some(5));
        assert!((fp16.and_then(|f| f.mean).unwrap_or(0.0) - 0.6).abs() < 1e-9);
    }
}
