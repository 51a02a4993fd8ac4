//! The per-chunk path allocates nothing in the common case: a counting allocator watches
//! `Meter::observe` over a stream of ordinary content chunks, read through the stream's own
//! learned shape and through the shapes a backend's earlier stream shared (and, once the
//! stream's id and model are known, through its template).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use inferscope::accesslog::AccessLog;
use inferscope::dialect::{Dialect, Shapes};
use inferscope::meter::{
    Framing, Held, MeasureOptions, Meter, MeterSettings, Metering, RequestMeta,
};
use inferscope::recorder::Recorder;
use inferscope::sse::SseScanner;
use inferscope::stats::Stats;
use inferscope::util::Ids;
use std::sync::Arc;
use tokio::time::Instant;

#[test]
fn observing_content_chunks_does_not_allocate() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _g = rt.enter();
    let chunk = |i: usize, split: bool| {
        let s = format!("data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" w{i}\"}},\"finish_reason\":null}}]}}\n\n");
        if split {
            // A frame that also starts the next event: the partial line is carried over.
            Bytes::from(format!("{s}data: {{\"id\""))
        } else {
            Bytes::from(s)
        }
    };
    let frames: Vec<Bytes> = (0..60).map(|i| chunk(i, false)).collect();
    let recorder = Arc::new(Recorder::new(Stats::new(4), AccessLog::disabled(), None));
    let metering = Metering::new(recorder, Arc::new(Ids::default()), MeterSettings::default());
    let meter = |shapes: Option<Arc<Shapes>>| {
        let mut meta = RequestMeta::new(http::Method::POST, "/");
        meta.stream = true;
        let mut how = MeasureOptions::default();
        how.dialect = Some(Dialect::OpenAi);
        how.shapes = shapes;
        Meter::new(
            meta,
            200,
            Framing::Sse(SseScanner::default()),
            how,
            Arc::clone(&metering),
            Held::default(),
        )
    };
    // A stream learning on its own, and the second stream of a backend whose first stream
    // learned the shapes (how the gateway runs).
    let shapes = Arc::new(Shapes::default());
    let mut first = meter(Some(Arc::clone(&shapes)));
    for f in &frames {
        first.observe(f, Instant::now());
    }
    assert_eq!(
        shapes.len(),
        1,
        "the first stream shared its content chunk's shape"
    );
    for (kind, shapes) in [("own", None), ("shared", Some(shapes))] {
        let mut m = meter(shapes);
        // Warm-up: the scanner's carry buffer reaches its working size once, and the stream's
        // template (its last content chunk, kept once its id and model are known) its buffer.
        m.observe(&chunk(0, true), Instant::now());
        m.observe(
            &Bytes::from_static(b":\"c1\",\"choices\":[]}\n\n"),
            Instant::now(),
        );
        for f in &frames[..2] {
            m.observe(f, Instant::now());
        }
        let info = allocation_counter::measure(|| {
            for f in &frames {
                m.observe(f, Instant::now());
            }
        });
        assert_eq!(
            info.count_total, 0,
            "allocations while observing 60 content chunks ({kind} shapes)"
        );
    }
}
