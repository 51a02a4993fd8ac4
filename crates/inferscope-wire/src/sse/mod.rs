//! Incremental, zero-copy scanners for streamed inference responses.
//!
//! Both scanners observe bytes that are forwarded elsewhere: they never own the payload, keep only
//! the incomplete tail of the last line (with a hard cap), and hand out events that borrow from the
//! chunk whenever the event lies inside it — the common case — so scanning allocates nothing.
//!
//! Hand-written rather than taken from an SSE crate because it is on the per-chunk path and
//! measured there: 22.6 ns per vLLM-style chunk against 11.5 ns for a bare `memchr` pass over the
//! same bytes (`cargo bench --bench data_path`, docs/perf-log/), with borrowed events and no
//! allocation (tests/alloc.rs); SSE crates such as `eventsource-stream` hand out owned events (a copy of each).

mod ndjson;
mod scanner;

pub use ndjson::NdjsonScanner;
pub use scanner::SseScanner;

/// Default hard cap on one line (and on one event's assembled data), in bytes.
pub const DEFAULT_MAX_LINE: usize = 1 << 20;

/// One complete event, valid for the duration of the callback that receives it.
#[derive(Debug, Clone, Copy)]
pub struct Event<'a> {
    /// The SSE `event:` field (empty for the default `message` type, and for NDJSON).
    pub event_type: &'a [u8],
    /// The event's data: SSE `data` lines joined by `\n`, or one NDJSON line.
    pub data: &'a [u8],
    /// Byte range of the event's block inside the chunk that completed it. `start` is `None` when
    /// the block began in an earlier chunk; `end` is just past the blank line (or newline).
    pub start: Option<usize>,
    /// See `start`.
    pub end: usize,
}

impl<'a> Event<'a> {
    /// The one event of a frame of `len` bytes that holds it whole (`data` inside it), of the
    /// default type.
    pub fn whole(data: &'a [u8], len: usize) -> Self {
        Self {
            event_type: b"",
            data,
            start: Some(0),
            end: len,
        }
    }
}

/// Where the block that is still incomplete after a `feed` began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenBlock {
    /// Nothing pending: the chunk ended on an event boundary.
    None,
    /// The pending block began in an earlier chunk.
    Earlier,
    /// The pending block began at this offset of the last chunk.
    At(usize),
}

/// Counters of what a scanner saw that was not a well-formed event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanIssues {
    /// Lines longer than the cap (their content is skipped, the bytes are still forwarded).
    pub oversized_lines: u32,
}
