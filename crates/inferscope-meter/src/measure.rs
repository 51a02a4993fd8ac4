//! `Meter`: what is measured about one response while its body flows — fed each frame by
//! `MeteredBody`, finalized into a `RequestRecord` exactly once.

use super::layer::{Held, Metering};
use super::record::{
    EventTokens, Gaps, ItlSample, Outcome, RequestMeta, RequestRecord, ResponseInfo, TokensSource,
};
use bytes::Bytes;
use inferscope_wire::dialect::{
    Dialect, FinishReason, Observation, Shapes, StreamClassifier, Usage,
};
use inferscope_wire::sse::{Event, NdjsonScanner, OpenBlock, SseScanner};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Response deadlines, enforced by `MeteredBody` while it waits for upstream bytes.
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct Deadlines {
    /// The first output event must arrive by then.
    pub first_token: Option<Instant>,
    /// No more than this between upstream frames.
    pub idle: Option<Duration>,
    /// The whole response must end by then.
    pub total: Option<Instant>,
}

/// Cap on a non-streaming body kept (as shared `Bytes`, no copy) to read its `usage`.
const MAX_JSON_CAPTURE: usize = 4 << 20;

/// Most bytes decoded from one encoded response for the meter (a decompression bomb stops here;
/// the bytes still reach the client as they came).
const MAX_DECODED: u64 = 256 << 20;

/// A copy of an encoded response body (`Content-Encoding: gzip` or `deflate` from a backend that
/// encoded although the gateway asked for `identity`), decoded for the meter only: the client
/// gets the bytes as the backend sent them.
pub(crate) struct Decoder {
    inner: DecoderKind,
    decoded: u64,
}

enum DecoderKind {
    Gzip(flate2::write::GzDecoder<Vec<u8>>),
    Zlib(flate2::write::ZlibDecoder<Vec<u8>>),
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("decoded", &self.decoded)
            .finish_non_exhaustive()
    }
}

impl Decoder {
    /// A decoder for a `Content-Encoding` value the meter can read through (`gzip`, `x-gzip`,
    /// `deflate`); `None` for `identity` or none. `Err` names an encoding it cannot read.
    pub(crate) fn for_encoding(value: Option<&str>) -> Result<Option<Self>, ()> {
        let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        let inner = if v.eq_ignore_ascii_case("gzip") || v.eq_ignore_ascii_case("x-gzip") {
            DecoderKind::Gzip(flate2::write::GzDecoder::new(Vec::new()))
        } else if v.eq_ignore_ascii_case("deflate") {
            DecoderKind::Zlib(flate2::write::ZlibDecoder::new(Vec::new()))
        } else if v.eq_ignore_ascii_case("identity") {
            return Ok(None);
        } else {
            return Err(());
        };
        Ok(Some(Self { inner, decoded: 0 }))
    }

    /// Decodes `parts` into pieces of at most ~32 KiB each; `None` when the data is not valid in
    /// its encoding or the response decoded past `MAX_DECODED`.
    fn decode(&mut self, parts: &[Bytes]) -> Option<Vec<Bytes>> {
        use std::io::Write as _;
        let mut out = Vec::new();
        for part in parts {
            let mut input = &part[..];
            while !input.is_empty() {
                let (n, buf) = match &mut self.inner {
                    DecoderKind::Gzip(d) => (
                        d.write(input).and_then(|n| d.flush().map(|()| n)).ok()?,
                        d.get_mut(),
                    ),
                    DecoderKind::Zlib(d) => (
                        d.write(input).and_then(|n| d.flush().map(|()| n)).ok()?,
                        d.get_mut(),
                    ),
                };
                if n == 0 && buf.is_empty() {
                    // The encoded stream has ended; whatever follows is not part of it.
                    break;
                }
                input = &input[n..];
                if !buf.is_empty() {
                    self.decoded += buf.len() as u64;
                    if self.decoded > MAX_DECODED {
                        return None;
                    }
                    out.push(Bytes::from(std::mem::take(buf)));
                }
            }
        }
        Some(out)
    }
}

/// How the response body is cut into events.
#[derive(Debug)]
pub enum Framing {
    /// `text/event-stream` from an OpenAI-format endpoint.
    Sse(SseScanner),
    /// `application/x-ndjson` (Ollama's streams).
    Ndjson(NdjsonScanner),
    /// A whole JSON body from an OpenAI-format endpoint: kept by reference, read at the end.
    Json {
        /// The body's frames (reference-counted, not copied).
        parts: Vec<Bytes>,
        /// Their total length; capture stops past `MAX_JSON_CAPTURE`.
        len: usize,
    },
    /// Anything else: timed and counted only.
    Opaque,
}

impl Framing {
    /// How a response body with content type `content_type` is cut into events: SSE and NDJSON
    /// streams by line (at most `max_line` bytes kept per line), a whole JSON body of a known
    /// dialect by reference, anything else timed only.
    pub fn for_response(content_type: &str, dialect: Option<Dialect>, max_line: usize) -> Self {
        if content_type.starts_with("text/event-stream") {
            Framing::Sse(SseScanner::new(max_line))
        } else if content_type.starts_with("application/x-ndjson") {
            Framing::Ndjson(NdjsonScanner::new(max_line))
        } else if dialect.is_some() && content_type.starts_with("application/json") {
            Framing::Json {
                parts: Vec::new(),
                len: 0,
            }
        } else {
            Framing::Opaque
        }
    }
}

/// What the event callback updates. Kept apart from the scanner so both can be borrowed at once.
/// Its instants are packed (`clock::pack`: nanoseconds on one timeline), so the per-event
/// arithmetic is on integers.
#[derive(Debug, Default)]
struct Progress {
    t_chunk1: Option<u64>,
    t_tok1: Option<u64>,
    /// Kernel stamp of the upstream read current when the first output event was handed on.
    t_tok1_rx: Option<u64>,
    /// Largest hand-off − upstream read stamp.
    forward_lag: Option<Duration>,
    t_tok_last: Option<u64>,
    itl: Gaps,
    output_events: u64,
    /// Output events whose token count the backend reported.
    exact_events: u64,
    /// Sum of those reported counts.
    event_token_sum: u64,
    /// Cumulative completion tokens from per-chunk usage (vLLM `continuous_usage_stats`).
    cum_output: Option<u64>,
    engine: Option<inferscope_wire::dialect::EngineTimes>,
    usage: Usage,
    finish: Option<FinishReason>,
    done: bool,
    error_event: bool,
    malformed: u32,
    /// Reads events in the response's dialect (`None`: every event counts as output).
    classifier: Option<StreamClassifier>,
    strip_usage: bool,
    /// Range of the usage-only event to drop from this frame, if any.
    drop: Option<(Option<usize>, usize)>,
    response: ResponseInfo,
    /// Cap on captured output text; `None` when capture is off.
    capture: Option<usize>,
}

impl Progress {
    fn on_event(&mut self, ev: Event<'_>, now: u64) {
        let Some(classifier) = self.classifier.as_mut() else {
            self.t_chunk1.get_or_insert(now);
            self.output_events += 1;
            self.mark_output(now, 1);
            return;
        };
        let mut o = Observation::default();
        classifier.classify_into(ev.data, &mut o);
        self.apply(ev, &mut o, now);
    }

    /// `on_event` for the event of a frame `SseScanner::single_line` handed over, when a
    /// learned chunk shape reads it (which proves its data one line); `false`, with nothing
    /// done, when none does.
    fn on_line(&mut self, ev: Event<'_>, now: u64) -> bool {
        let mut o = Observation::default();
        let read = self
            .classifier
            .as_mut()
            .is_some_and(|c| c.read_line(ev.data, &mut o));
        if read {
            self.apply(ev, &mut o, now);
        }
        read
    }

    /// What a classified event means for the request. `o` is borrowed, not moved: it is built
    /// where the caller keeps it, and a move would copy it (~180 bytes) once per event.
    fn apply(&mut self, ev: Event<'_>, o: &mut Observation<'_>, now: u64) {
        self.t_chunk1.get_or_insert(now);
        if o.malformed {
            self.malformed += 1;
            return;
        }
        self.done |= o.done;
        self.error_event |= o.error;
        // Allocates once per request: only the first event that names them.
        if self.response.id.is_none() {
            self.response.id = o.id.take().map(|c| c.into_owned());
        }
        if self.response.model.is_none() {
            self.response.model = o.model.take().map(|c| c.into_owned());
        }
        if self.response.id.is_some() && self.response.model.is_some() {
            if let Some(c) = self.classifier.as_mut() {
                c.names_known();
            }
        }
        if let Some(u) = o.usage {
            self.usage.input = u.input.or(self.usage.input);
            self.usage.output = u.output.or(self.usage.output);
            self.usage.cached_input = u.cached_input.or(self.usage.cached_input);
            self.usage.reasoning = u.reasoning.or(self.usage.reasoning);
        }
        if o.engine.is_some() {
            self.engine = o.engine;
        }
        if let (Some(cap), Some(c)) = (self.capture.filter(|_| o.output), &self.classifier) {
            let out = self.response.output_content.get_or_insert_with(String::new);
            c.dialect().append_content(ev.data, out, cap);
        }
        if o.output {
            // The event's own count; else the step of a cumulative usage every output event
            // carries (vLLM `continuous_usage_stats`) — a total that first appears on a late
            // event is not that event's count.
            let cum = o.usage.and_then(|u| u.output);
            let reported = match (o.tokens, cum) {
                (Some(n), _) => Some(u64::from(n)),
                (None, Some(c)) if self.output_events == 0 || self.cum_output.is_some() => {
                    let step = c.saturating_sub(self.cum_output.unwrap_or(0));
                    self.cum_output = Some(c);
                    Some(step)
                }
                _ => None,
            };
            self.output_events += 1;
            if let Some(n) = reported {
                self.exact_events += 1;
                self.event_token_sum += n;
            }
            let tokens = reported.unwrap_or(1).max(1);
            self.mark_output(now, u32::try_from(tokens).unwrap_or(u32::MAX));
        }
        if o.finish.is_some() {
            self.finish = o.finish.take();
        }
        if o.usage_only && self.strip_usage {
            self.drop = Some((ev.start, ev.end));
        }
    }

    fn mark_output(&mut self, now: u64, tokens: u32) {
        match self.t_tok_last {
            Some(last) => self
                .itl
                .push(ItlSample::from_nanos(now.saturating_sub(last), tokens)),
            None => self.t_tok1 = Some(now),
        }
        self.t_tok_last = Some(now);
    }
}

/// Result of observing one frame when the injected usage chunk must be removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StripPlan {
    /// Range of the usage-only event in this frame (`start == None`: it began in held bytes).
    pub drop: Option<(Option<usize>, usize)>,
    /// Where the frame's incomplete trailing block began.
    pub open: Option<OpenBlock>,
}

/// How a response is measured.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct MeasureOptions {
    /// Read events in this dialect (`None`: every event counts as output, timing only).
    pub dialect: Option<Dialect>,
    /// The backend's shared chunk shapes (`dialect::Shapes`), read through and learned into.
    pub shapes: Option<Arc<Shapes>>,
    /// Remove the usage-only chunk the gateway asked for on the client's behalf.
    pub strip_usage: bool,
    /// Capture output text up to this many bytes (content capture opted in, shadow comparison).
    pub capture_output: Option<usize>,
    /// Response deadlines.
    pub deadlines: Deadlines,
}

/// Per-request measurement state. Created when the response head is known; consumed by
/// `finish`, exactly once.
#[derive(Debug)]
pub struct Meter {
    meta: RequestMeta,
    status: u16,
    framing: Framing,
    progress: Progress,
    bytes_out: u64,
    observe_cost: Duration,
    /// The receipt instant `observe_cost` was last charged from, and how much of the time since
    /// it was charged: the pieces of one frame, observed one at a time with the frame's one
    /// instant, are charged that frame's time once, not once per piece.
    cost_from: Option<(Instant, Duration)>,
    /// `meta.t_sent` packed, once a frame needed it (0: not yet).
    sent_packed: u64,
    metering: Arc<Metering>,
    /// The response is the service's own refusal: its outcome and error kind.
    refused: Option<(Outcome, &'static str)>,
    /// Reads an encoded body through its encoding (a copy, for the meter).
    decoder: Option<Box<Decoder>>,
    /// The body was encoded in a way the meter could not read (`unmeasured_encoding`).
    undecodable: bool,
    /// Set by the server when it closed the connection on a client that stopped taking bytes.
    stalled: Option<crate::conn::StalledCut>,
    /// When the frames it handed on were written, where the server says.
    handoff: Handoff,
    /// Kept for the life of the response: concurrency limits count streams, not headers.
    _held: Held,
    /// Deadlines of this response.
    pub deadlines: Deadlines,
}

/// Which of the connection's write attempts (`server::WriteClock`) carried the frames of the
/// events a record times: the first attempt after each was handed to the server.
#[derive(Debug, Default)]
struct Handoff {
    clock: Option<Arc<crate::conn::WriteClock>>,
    chunk1: Option<u64>,
    tok1: Option<u64>,
    /// The last output event's instant (packed) when its frame was handed on, and the attempt.
    tok_last: Option<(u64, u64)>,
    /// The attempt after the latest frame handed on.
    last: Option<u64>,
    /// When the record was due (the end handed on) while that attempt had not happened yet.
    due_at: Option<Instant>,
}

/// How the body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The upstream body ended.
    Complete,
    /// The upstream body failed mid-way.
    BodyError,
    /// The client dropped the response before its end.
    Dropped,
    /// A deadline passed (the kind says which); the stream was ended by the gateway.
    TimedOut(&'static str),
}

impl Meter {
    /// A meter for a response with `status`, cut by `framing`; its record goes to `metering`'s
    /// sink. `held` is dropped with the meter (when the body ends).
    pub fn new(
        meta: RequestMeta,
        status: u16,
        framing: Framing,
        opts: MeasureOptions,
        metering: Arc<Metering>,
        held: Held,
    ) -> Self {
        let MeasureOptions {
            dialect,
            shapes,
            strip_usage,
            capture_output,
            deadlines,
        } = opts;
        Self {
            meta,
            status,
            framing,
            progress: Progress {
                classifier: dialect.map(|d| match shapes {
                    Some(shapes) => StreamClassifier::sharing(d, shapes),
                    None => StreamClassifier::new(d),
                }),
                strip_usage,
                capture: capture_output,
                itl: Gaps::with_capacity(64),
                ..Progress::default()
            },
            bytes_out: 0,
            observe_cost: Duration::ZERO,
            cost_from: None,
            sent_packed: 0,
            metering,
            refused: None,
            decoder: None,
            undecodable: false,
            stalled: None,
            handoff: Handoff::default(),
            _held: held,
            deadlines,
        }
    }

    /// The server's flag that says its connection was closed on a stalled client: a response
    /// dropped after it is set is recorded `client_stalled`.
    pub(crate) fn set_stalled_flag(&mut self, flag: crate::conn::StalledCut) {
        self.stalled = Some(flag);
    }

    /// The server's record of its connection's write attempts: events are timed when their
    /// frame was written (tried to be), and the record waits for the last frame's attempt.
    pub(crate) fn set_write_clock(&mut self, clock: Arc<crate::conn::WriteClock>) {
        self.handoff.clock = Some(clock);
    }

    /// The body arrives with this `Content-Encoding`: the meter reads a decoded copy (gzip,
    /// deflate), or, for an encoding it cannot read, times the stream only and says so in the
    /// record (`error: unmeasured_encoding`).
    pub fn set_encoding(&mut self, value: Option<&str>) {
        match Decoder::for_encoding(value) {
            Ok(d) => self.decoder = d.map(Box::new),
            Err(()) => {
                self.undecodable = true;
                self.framing = Framing::Opaque;
            }
        }
        if self.decoder.is_some() || self.undecodable {
            // Encoded bytes cannot be cut: nothing is stripped from them.
            self.progress.strip_usage = false;
        }
    }

    /// Marks the response as the service's own refusal: recorded with this outcome and error
    /// kind whatever its status says.
    pub(crate) fn set_refused(&mut self, outcome: Outcome, error: &'static str) {
        self.refused = Some((outcome, error));
    }

    /// True once an output event has been seen.
    pub fn has_output(&self) -> bool {
        self.progress.t_tok1.is_some()
    }

    /// True once the stream's terminal event (`[DONE]`) has been observed.
    pub(crate) fn terminal_seen(&self) -> bool {
        self.progress.done
    }

    /// Longest SSE/NDJSON event measured (`limits.max_event_bytes`).
    pub fn max_event_bytes(&self) -> usize {
        self.metering.settings().max_event_bytes
    }

    /// True while the usage-only chunk still has to be removed from the stream.
    pub(crate) fn stripping(&self) -> bool {
        self.progress.strip_usage
    }

    /// Observes one frame received at `now`. Never copies the frame's bytes (a non-streaming JSON
    /// body is kept by reference).
    pub fn observe(&mut self, data: &Bytes, now: Instant) -> StripPlan {
        self.observe_parts(std::slice::from_ref(data), now)
    }

    /// Observes the pieces of one frame (`Batch`: what one upstream read brought), all received
    /// at `now`, in order. The plan is the last piece's: while stripping, a frame is observed
    /// one piece at a time.
    pub(crate) fn observe_parts(&mut self, parts: &[Bytes], now: Instant) -> StripPlan {
        debug_assert!(parts.len() <= 1 || !self.stripping());
        let at = crate::clock::pack(now.into_std());
        // The stamp of the upstream read current now (packed, 0: none): that read brought this
        // frame or came after it. One that does not fall between sending and now is not believed.
        let rx = match &self.meta.upstream_rx {
            Some(c) => c.load(std::sync::atomic::Ordering::Relaxed),
            None => 0,
        };
        let rx = (rx != 0 && rx <= at && rx >= self.sent_packed()).then_some(rx);
        let p = &mut self.progress;
        if let Some(rx) = rx {
            let lag = Duration::from_nanos(at - rx);
            p.forward_lag = Some(p.forward_lag.map_or(lag, |l| l.max(lag)));
            if let Some(h) = self.metering.heartbeat() {
                h.frame(at, lag);
            }
        }
        let had_output = p.t_tok1.is_some();
        p.drop = None;
        let mut open = None;
        let decoded;
        let parts = match &mut self.decoder {
            Some(d) => match d.decode(parts) {
                Some(v) => {
                    decoded = v;
                    &decoded[..]
                }
                None => {
                    // Not valid in its encoding, or a bomb: timed only from here on.
                    self.decoder = None;
                    self.undecodable = true;
                    self.framing = Framing::Opaque;
                    parts
                }
            },
            None => parts,
        };
        for data in parts {
            open = match &mut self.framing {
                // A piece that is one whole single-line event a learned shape reads skips the
                // scan for line ends (what `feed` would do with it, without reading its bytes
                // twice).
                Framing::Sse(s) => Some(match s.single_line(data) {
                    Some(line) if p.on_line(Event::whole(line, data.len()), at) => OpenBlock::None,
                    _ => s.feed(data, |ev| p.on_event(ev, at)),
                }),
                Framing::Ndjson(s) => Some(s.feed(data, |ev| p.on_event(ev, at))),
                Framing::Json { parts, len } => {
                    p.t_chunk1.get_or_insert(at);
                    *len += data.len();
                    if *len <= MAX_JSON_CAPTURE {
                        parts.push(data.clone());
                    }
                    None
                }
                Framing::Opaque => {
                    p.t_chunk1.get_or_insert(at);
                    None
                }
            };
        }
        if !had_output && p.t_tok1.is_some() {
            p.t_tok1_rx = rx;
        }
        let plan = StripPlan { drop: p.drop, open };
        if p.drop.is_some() {
            // Only one usage-only chunk is ever added; after it, frames pass untouched.
            p.strip_usage = false;
        }
        // The time from the frame's receipt to now is the gateway's; a frame observed a piece at
        // a time is charged only what came since its last piece (no preemption counted twice).
        let spent = now.elapsed();
        let charged = match self.cost_from {
            Some((from, charged)) if from == now => charged,
            _ => Duration::ZERO,
        };
        self.observe_cost += spent.saturating_sub(charged);
        self.cost_from = Some((now, spent.max(charged)));
        plan
    }

    /// `meta.t_sent` packed (`u64::MAX` while unsent: no stamp falls after it).
    fn sent_packed(&mut self) -> u64 {
        if self.sent_packed == 0 {
            match self.meta.t_sent {
                Some(s) => self.sent_packed = crate::clock::pack(s.into_std()),
                None => return u64::MAX,
            }
        }
        self.sent_packed
    }

    /// Counts bytes actually handed to the client, and notes which write attempt will carry them.
    pub fn sent(&mut self, n: usize) {
        self.bytes_out += n as u64;
        let h = &mut self.handoff;
        let Some(c) = &h.clock else {
            return;
        };
        let next = c.next();
        h.last = Some(next);
        let p = &self.progress;
        if h.chunk1.is_none() && p.t_chunk1.is_some() {
            h.chunk1 = Some(next);
        }
        if h.tok1.is_none() && p.t_tok1.is_some() {
            h.tok1 = Some(next);
        }
        if let Some(t) = p.t_tok_last {
            if h.tok_last.is_none_or(|(v, _)| v != t) {
                h.tok_last = Some((t, next));
            }
        }
    }

    /// Builds the record and hands it to the sink. Consumes the meter: exactly once. A body that
    /// ended while its last frame waits to be written is recorded at that write attempt (at once
    /// if the connection closes first), so its end is when the user got it.
    /// Boxed, as `MeteredBody` holds it: waiting moves only the pointer.
    pub fn finish(mut self: Box<Self>, end: End) {
        if end != End::Dropped {
            if let (Some(c), Some(n)) = (self.handoff.clock.clone(), self.handoff.last) {
                if c.next() <= n {
                    self.handoff.due_at = Some(Instant::now());
                    c.after_attempt(n, Box::new(move |_| self.finish_now(end)));
                    return;
                }
            }
        }
        self.finish_now(end);
    }

    fn finish_now(self: Box<Self>, end: End) {
        let (rec, metering) = self.into_record(end);
        metering.finish(rec);
    }

    /// The instant (packed) of write attempt `w`, when the server keeps it.
    fn written(&self, w: Option<u64>) -> Option<u64> {
        let at = self.handoff.clock.as_ref()?.attempt(w?)?;
        Some(crate::clock::pack(at))
    }

    fn into_record(self: Box<Self>, end: End) -> (RequestRecord, Arc<Metering>) {
        (*self).record(end)
    }

    fn record(mut self, end: End) -> (RequestRecord, Arc<Metering>) {
        let now = Instant::now();
        let truncated_partial = match &self.framing {
            Framing::Sse(s) => s.has_partial(),
            Framing::Ndjson(s) => s.has_partial(),
            _ => false,
        };
        let mut malformed = self.progress.malformed;
        if let Framing::Sse(s) = &self.framing {
            malformed += s.issues().oversized_lines;
        }
        if let Framing::Json { parts, len } = &mut self.framing {
            let dialect = self
                .progress
                .classifier
                .as_ref()
                .map(StreamClassifier::dialect);
            if let (End::Complete, true, true, Some(dialect)) =
                (end, *len <= MAX_JSON_CAPTURE, self.status < 300, dialect)
            {
                let body: Vec<u8> = parts.concat();
                let o = dialect.classify(&body);
                if o.malformed {
                    malformed += 1;
                }
                self.progress.error_event |= o.error;
                self.progress.engine = o.engine;
                if let Some(u) = o.usage {
                    self.progress.usage = u;
                }
                self.progress.response.id = o.id.map(|c| c.into_owned());
                self.progress.response.model = o.model.map(|c| c.into_owned());
                self.progress.finish = o.finish;
                self.progress.done = true;
                if let Some(cap) = self.progress.capture {
                    let mut text = String::new();
                    dialect.append_content(&body, &mut text, cap);
                    self.progress.response.output_content = Some(text);
                }
            }
        }
        let p = &self.progress;
        let streamed = matches!(self.framing, Framing::Sse(_) | Framing::Ndjson(_));
        // A streamed response is one even where nobody read the request (an embedding app).
        self.meta.stream |= streamed;
        let judged = match end {
            End::Dropped if self.metering.cutting() => (Outcome::Shutdown, Some("shutdown")),
            End::Dropped
                if self
                    .stalled
                    .as_ref()
                    .is_some_and(|s| s.0.load(std::sync::atomic::Ordering::Relaxed)) =>
            {
                (Outcome::ClientCancelled, Some("client_stalled"))
            }
            End::Dropped => (Outcome::ClientCancelled, Some("client_disconnected")),
            End::TimedOut(kind) => (Outcome::Timeout, Some(kind)),
            End::BodyError => (Outcome::Truncated, Some("upstream_body_error")),
            End::Complete if self.status >= 500 => (Outcome::BackendError, Some("upstream_status")),
            End::Complete if self.status == 429 => {
                (Outcome::RateLimited, Some("upstream_rate_limited"))
            }
            End::Complete if self.status >= 400 => (Outcome::ClientError, None),
            End::Complete if p.error_event => (Outcome::BackendError, Some("stream_error_event")),
            End::Complete if self.undecodable => (Outcome::Ok, Some("unmeasured_encoding")),
            End::Complete
                if p.classifier.is_some() && streamed && (!p.done || truncated_partial) =>
            {
                (Outcome::Truncated, Some("no_terminal_event"))
            }
            End::Complete => (Outcome::Ok, None),
        };
        // A refusal is what the service decided, however the client then read it.
        let (outcome, error) = match self.refused {
            Some((o, e)) => (o, Some(e)),
            None => judged,
        };
        let all_exact = p.output_events > 0 && p.exact_events == p.output_events;
        let (output_tokens, tokens_source) = match p.usage.output {
            Some(n) => (Some(n), Some(TokensSource::Usage)),
            None if streamed && all_exact => (Some(p.event_token_sum), Some(TokensSource::Events)),
            None if streamed => (Some(p.output_events), Some(TokensSource::Counted)),
            None => (None, None),
        };
        let event_tokens = (streamed && p.output_events > 0).then(|| {
            if all_exact {
                EventTokens::Exact
            } else if p.usage.output.is_some() {
                EventTokens::Derived
            } else {
                EventTokens::Assumed
            }
        });
        let t0 = self.meta.t0;
        let packed = |t: Instant| crate::clock::pack(t.into_std());
        let since =
            |t: Option<u64>, from: u64| t.map(|t| Duration::from_nanos(t.saturating_sub(from)));
        // What the user felt: each event when its frame was written (tried to be), where the
        // server says; the longest wait between handing a frame on and writing it is the
        // hand-off lag.
        let h = &self.handoff;
        let mut handoff_lag = h.due_at.map(|at| {
            u64::try_from(now.saturating_duration_since(at).as_nanos()).unwrap_or(u64::MAX)
        });
        let mut later = |t: Option<u64>, w: Option<u64>| match (t, self.written(w)) {
            (Some(t), Some(w)) if w > t => {
                handoff_lag = Some(handoff_lag.unwrap_or(0).max(w - t));
                Some(w)
            }
            (t, Some(_)) => {
                handoff_lag.get_or_insert(0);
                t
            }
            (t, None) => t,
        };
        let t_chunk1 = later(p.t_chunk1, h.chunk1);
        let t_tok1 = later(p.t_tok1, h.tok1);
        let t_tok_last = later(p.t_tok_last, h.tok_last.map(|(_, w)| w));
        let handoff_lag = handoff_lag.map(Duration::from_nanos);
        // A lower bound on the gateway's hold of a frame: read → handed on (each frame), read →
        // written (the first token's), handed on → written.
        let forward_lag = [
            p.forward_lag,
            handoff_lag,
            t_tok1
                .zip(p.t_tok1_rx)
                .map(|(t, rx)| Duration::from_nanos(t.saturating_sub(rx))),
        ]
        .into_iter()
        .flatten()
        .max();
        let tpot = match (t_tok1, t_tok_last, output_tokens) {
            (Some(a), Some(b), Some(n)) if n > 1 => Some(
                Duration::from_nanos(b.saturating_sub(a))
                    / u32::try_from(n - 1).unwrap_or(u32::MAX),
            ),
            _ => None,
        };
        let overhead = self
            .meta
            .t_sent
            .map(|s| s.saturating_duration_since(t0) + self.observe_cost);
        // From the kernel's stamp of the read that had the first token (or a later one) when
        // there is one: the backend's time without the gateway's wait for a CPU.
        let upstream_ttft = self
            .meta
            .t_sent
            .and_then(|s| since(p.t_tok1_rx.or(t_tok1), packed(s)));
        let rec = RequestRecord {
            status: self.status,
            outcome,
            ttft: since(t_tok1, packed(t0)),
            ttfc: if streamed {
                since(t_chunk1, packed(t0))
            } else {
                None
            },
            tpot,
            e2e: now.saturating_duration_since(t0),
            upstream_ttft,
            forward_lag,
            handoff_lag,
            overhead,
            itl: std::mem::take(&mut self.progress.itl),
            input_tokens: self.progress.usage.input,
            output_tokens,
            tokens_source,
            event_tokens,
            finish_reason: self.progress.finish.take(),
            bytes_out: self.bytes_out,
            malformed_events: malformed,
            error,
            response: ResponseInfo {
                cached_input_tokens: self.progress.usage.cached_input,
                reasoning_tokens: self.progress.usage.reasoning,
                engine: self.progress.engine,
                ..std::mem::take(&mut self.progress.response)
            },
            engine_span: std::sync::OnceLock::new(),
            meta: self.meta,
        };
        (rec, self.metering)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::{MeterSettings, RecordSink};

    #[derive(Default, Clone)]
    struct Collect(Arc<parking_lot::Mutex<Vec<Arc<RequestRecord>>>>);

    impl RecordSink for Collect {
        fn record(&self, rec: &Arc<RequestRecord>) {
            self.0.lock().push(Arc::clone(rec));
        }
    }

    /// A meter for a streamed chat completion, reading OpenAI's events.
    fn chat_stream_meter(meta: RequestMeta, metering: Arc<Metering>) -> Meter {
        let dialect = inferscope_wire::dialect::Endpoint::from_path("/v1/chat/completions")
            .and_then(inferscope_wire::dialect::Endpoint::dialect);
        Meter::new(
            meta,
            200,
            Framing::for_response("text/event-stream", dialect, 1 << 20),
            MeasureOptions {
                dialect,
                ..MeasureOptions::default()
            },
            metering,
            Held::default(),
        )
    }

    /// A frame of many pieces, observed a piece at a time with the frame's one instant (the
    /// usage-stripping path) after a preemption between its receipt and its observation: the
    /// preemption is charged to the gateway once, and the overhead stays within the request's
    /// whole time.
    #[test]
    fn a_frame_observed_piece_by_piece_is_charged_once() {
        let sink = Collect::default();
        let metering = Metering::new(sink.clone(), Arc::default(), MeterSettings::default());
        let mut meta = RequestMeta::new(http::Method::POST, "/v1/chat/completions");
        let t0 = Instant::now();
        meta.t0 = t0;
        meta.t_sent = Some(t0);
        let mut meter = chat_stream_meter(meta, metering);
        let piece = Bytes::from_static(
            b"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n",
        );
        let now = Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        for _ in 0..100 {
            meter.observe(&piece, now);
        }
        meter.observe(&Bytes::from_static(b"data: [DONE]\n\n"), Instant::now());
        Box::new(meter).finish(End::Complete);
        let r = sink.0.lock().pop().unwrap();
        let overhead = r.overhead.unwrap();
        assert!(overhead <= r.e2e, "overhead {overhead:?} > e2e {:?}", r.e2e);
        assert!(overhead >= Duration::from_millis(20), "{overhead:?}");
    }

    /// Random streams, with the gateway preempted at random: before it sends, between an
    /// upstream read and the frame's observation, and between the pieces of a frame observed a
    /// piece at a time. Whatever the pattern, a request's time adds up: the overhead is exactly
    /// the time before sending plus the time frames spent with the gateway, never more than the
    /// whole; TTFT, the ITL gaps and the backend's share fit inside E2E; the forward lag is the
    /// longest hold. (Paused Tokio time: every duration is the one the test chose.)
    #[tokio::test(start_paused = true)]
    async fn a_requests_time_adds_up_however_the_gateway_is_preempted() {
        use std::sync::atomic::{AtomicU64, Ordering};
        use tokio::time::advance;
        let content = Bytes::from_static(
            b"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n",
        );
        let role = Bytes::from_static(
            b"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n",
        );
        let ms = |rng: &mut crate::util::rng::Rng, hi: u32| {
            Duration::from_micros(u64::from(rng.range(0, hi * 1000)))
        };
        let mut rng = crate::util::rng::Rng::new(42);
        for case in 0..300 {
            let sink = Collect::default();
            let metering = Metering::new(sink.clone(), Arc::default(), MeterSettings::default());
            let mut meta = RequestMeta::new(http::Method::POST, "/v1/chat/completions");
            let rx = Arc::new(AtomicU64::new(0));
            meta.upstream_rx = Some(Arc::clone(&rx));
            let t0 = Instant::now();
            meta.t0 = t0;
            advance(ms(&mut rng, 50)).await;
            let t_sent = Instant::now();
            meta.t_sent = Some(t_sent);
            let before_send = t_sent - t0;
            let mut meter = chat_stream_meter(meta, metering);
            let mut held = Duration::ZERO;
            let mut longest_hold = Duration::ZERO;
            let mut first_output = None;
            let mut last_output = None;
            let frames = rng.range(1, 12);
            for f in 0..frames {
                // The backend's pace, then the read, then the gateway's wait for a CPU.
                advance(ms(&mut rng, 40)).await;
                rx.store(
                    crate::clock::pack(Instant::now().into_std()),
                    Ordering::Relaxed,
                );
                let read = Instant::now();
                advance(ms(&mut rng, 30)).await;
                let now = Instant::now();
                longest_hold = longest_hold.max(now - read);
                let mut pieces = vec![];
                if f == 0 && rng.range(0, 2) == 0 {
                    pieces.push(role.clone());
                }
                for _ in 0..rng.range(1, 6) {
                    pieces.push(content.clone());
                }
                if f + 1 == frames {
                    pieces.push(Bytes::from_static(b"data: [DONE]\n\n"));
                }
                if rng.range(0, 2) == 0 {
                    meter.observe_parts(&pieces, now);
                } else {
                    // A piece at a time, all with the frame's instant, preempted in between.
                    for (i, piece) in pieces.iter().enumerate() {
                        if i > 0 {
                            advance(ms(&mut rng, 10)).await;
                        }
                        meter.observe(piece, now);
                    }
                }
                first_output.get_or_insert(now);
                last_output = Some(now);
                // The frame was the gateway's from its observation's instant until now.
                held += Instant::now() - now;
                advance(ms(&mut rng, 5)).await;
            }
            let end = Instant::now();
            Box::new(meter).finish(End::Complete);
            let r = sink.0.lock().pop().unwrap();
            let ctx = format!("case {case}: {r:?}");
            let overhead = r.overhead.unwrap();
            assert_eq!(overhead, before_send + held, "{ctx}");
            assert!(overhead <= r.e2e, "{ctx}");
            assert_eq!(r.e2e, end - t0, "{ctx}");
            let ttft = r.ttft.unwrap();
            assert_eq!(ttft, first_output.unwrap() - t0, "{ctx}");
            assert!(r.ttfc.unwrap() <= ttft, "{ctx}");
            assert!(before_send + r.upstream_ttft.unwrap() <= ttft, "{ctx}");
            // TTFT and the gaps after it reach the last token (each gap kept to the
            // microsecond), within the whole.
            let gaps: Duration = r.itl.samples().iter().map(ItlSample::gap).sum();
            let to_last = last_output.unwrap() - t0;
            let slack = Duration::from_micros(r.itl.len());
            assert!(
                ttft + gaps <= to_last && to_last <= ttft + gaps + slack,
                "{ctx}"
            );
            assert!(to_last <= r.e2e, "{ctx}");
            assert_eq!(r.forward_lag, Some(longest_hold), "{ctx}");
        }
    }
}
