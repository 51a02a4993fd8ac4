//! One response measured by a `Meter` fed by hand: for tests of what a record says of given
//! bytes, however they are cut.
#![allow(dead_code, clippy::unwrap_used)]

use bytes::Bytes;
use inferscope::dialect::Endpoint;
use inferscope::meter::{
    End, Framing, Held, MeasureOptions, Meter, MeterSettings, Metering, RecordSink, RequestMeta,
    RequestRecord,
};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A sink that keeps every record it is given.
#[derive(Default, Clone)]
pub struct Collect(pub Arc<Mutex<Vec<Arc<RequestRecord>>>>);

impl RecordSink for Collect {
    fn record(&self, rec: &Arc<RequestRecord>) {
        self.0.lock().push(Arc::clone(rec));
    }
}

/// What a record says, timings aside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub outcome: &'static str,
    pub error: Option<&'static str>,
    pub output_events: u64,
    pub output_tokens: Option<u64>,
    pub input_tokens: Option<u64>,
    pub tokens_source: Option<&'static str>,
    pub event_tokens: Option<&'static str>,
    pub finish: Option<String>,
    pub id: Option<String>,
    pub model: Option<String>,
    pub engine: Option<(Option<Duration>, Option<Duration>)>,
    pub malformed: u32,
    pub content: Option<String>,
}

/// Measures `pieces` as one response of `path` (content type `ctype`).
pub fn measure(path: &str, ctype: &str, pieces: &[&[u8]]) -> Seen {
    let sink = Collect::default();
    let metering = Metering::new(sink.clone(), Arc::default(), MeterSettings::default());
    let dialect = Endpoint::from_path(path).and_then(Endpoint::dialect);
    let mut how = MeasureOptions::default();
    how.dialect = dialect;
    how.capture_output = Some(1 << 10);
    let mut meter = Meter::new(
        RequestMeta::new(http::Method::POST, path),
        200,
        Framing::for_response(ctype, dialect, 1 << 20),
        how,
        metering,
        Held::default(),
    );
    let t = Instant::now();
    for (i, p) in pieces.iter().enumerate() {
        // Distinct instants, so gaps are counted and not merged.
        meter.observe(
            &Bytes::copy_from_slice(p),
            t + Duration::from_millis(i as u64),
        );
    }
    Box::new(meter).finish(End::Complete);
    let r = sink.0.lock().pop().unwrap();
    Seen {
        outcome: r.outcome.as_str(),
        error: r.error,
        output_events: if r.ttft.is_some() { r.itl.len() + 1 } else { 0 },
        output_tokens: r.output_tokens,
        input_tokens: r.input_tokens,
        tokens_source: r.tokens_source.map(|t| t.as_str()),
        event_tokens: r.event_tokens.map(|t| t.as_str()),
        finish: r.finish_reason.as_ref().map(|f| f.as_str().to_owned()),
        id: r.response.id.clone(),
        model: r.response.model.clone(),
        engine: r.response.engine.map(|e| (e.prefill, e.decode)),
        malformed: r.malformed_events,
        content: r.response.output_content.clone(),
    }
}
