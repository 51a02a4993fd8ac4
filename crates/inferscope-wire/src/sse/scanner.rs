//! Server-sent events, scanned incrementally by the WHATWG rules.
//!
//! Lines end in CR, LF or CRLF (a CRLF may be split across chunks); a leading UTF-8 BOM is
//! skipped; lines starting with `:` are comments; `data:` takes one optional space; several `data`
//! lines join with `\n`; a blank line dispatches the event, and an event with no data is not
//! dispatched. A line longer than the cap is skipped (and counted) instead of growing memory.

use super::{Event, OpenBlock, ScanIssues, DEFAULT_MAX_LINE};

const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

/// Where the data of the event being built lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Data {
    /// No `data` line yet.
    Empty,
    /// Exactly one `data` line, still inside the current chunk (no copy made).
    InChunk(usize, usize),
    /// Assembled in `SseScanner::data`, each line followed by `\n`.
    Buffered,
}

/// Incremental SSE scanner. Feed it every chunk in order; it calls back once per event.
#[derive(Debug)]
pub struct SseScanner {
    /// Incomplete last line carried over from the previous chunk.
    line: Vec<u8>,
    /// The carried line passed the cap: skip the rest of it.
    skipping_line: bool,
    max_line: usize,
    data: Vec<u8>,
    data_at: Data,
    event_type: Vec<u8>,
    /// The previous chunk ended in CR: a leading LF in the next one belongs to it.
    after_cr: bool,
    /// BOM bytes matched so far; `None` once the stream start is behind us.
    bom: Option<usize>,
    /// Bytes of the current, undispatched block have been consumed.
    block_open: bool,
    block_start: Option<usize>,
    issues: ScanIssues,
}

impl Default for SseScanner {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_LINE)
    }
}

impl SseScanner {
    /// A scanner whose lines (and assembled event data) are capped at `max_line` bytes.
    pub fn new(max_line: usize) -> Self {
        Self {
            line: Vec::new(),
            skipping_line: false,
            max_line,
            data: Vec::new(),
            data_at: Data::Empty,
            event_type: Vec::new(),
            after_cr: false,
            bom: Some(0),
            block_open: false,
            block_start: None,
            issues: ScanIssues::default(),
        }
    }

    /// What was skipped so far.
    pub fn issues(&self) -> ScanIssues {
        self.issues
    }

    /// True when bytes of an incomplete event are pending (at end of stream: a truncated event).
    pub fn has_partial(&self) -> bool {
        self.block_open && (self.data_at != Data::Empty || !self.line.is_empty())
    }

    /// The data of `chunk` when nothing is pending and `chunk` may be one whole event of a single
    /// `data: ` line: `data: ` + the data + `\n\n`, within the line cap. Only the ends are
    /// looked at: the caller must know the data holds no CR or LF (a chunk shape read it); then
    /// `feed` would call back once with that data, at `0..chunk.len()`, and return
    /// `OpenBlock::None` with nothing kept, so the chunk needs no `feed`.
    ///
    /// At the stream's start a BOM may come first; a chunk that begins with `data: ` has none,
    /// and the scanner concludes so as `feed` would from the same first byte (so a stream's
    /// first event, its role chunk, needs no `feed` either).
    pub fn single_line<'c>(&mut self, chunk: &'c [u8]) -> Option<&'c [u8]> {
        if self.bom == Some(0) && chunk.starts_with(b"data: ") {
            self.bom = None;
        }
        let clean = self.bom.is_none()
            && !self.after_cr
            && !self.block_open
            && !self.skipping_line
            && self.line.is_empty()
            && self.data_at == Data::Empty
            && self.event_type.is_empty();
        if !clean || chunk.len() > self.max_line.saturating_add(2) {
            return None;
        }
        chunk.strip_prefix(b"data: ")?.strip_suffix(b"\n\n")
    }

    /// Scans one chunk, calling `on_event` for every event it completes, and reports where the
    /// still-incomplete block (if any) began.
    pub fn feed(&mut self, chunk: &[u8], mut on_event: impl FnMut(Event<'_>)) -> OpenBlock {
        let mut pos = 0;
        if let Some(matched) = self.bom {
            let mut m = matched;
            while pos < chunk.len() && m < BOM.len() && chunk[pos] == BOM[m] {
                m += 1;
                pos += 1;
            }
            if m == BOM.len() || (pos < chunk.len()) {
                // Either the BOM is complete or the stream does not start with one; a partial
                // match followed by other bytes is dropped like the BOM would have been.
                self.bom = None;
            } else {
                self.bom = Some(m);
                return self.open_block();
            }
        }
        if self.after_cr && pos < chunk.len() {
            self.after_cr = false;
            if chunk[pos] == b'\n' {
                pos += 1;
            }
        }
        self.block_start = if self.block_open { None } else { Some(pos) };

        while pos < chunk.len() {
            let Some(i) = memchr::memchr2(b'\r', b'\n', &chunk[pos..]) else {
                self.carry(&chunk[pos..]);
                break;
            };
            let line_end = pos + i;
            let mut next = line_end + 1;
            if chunk[line_end] == b'\r' {
                if next < chunk.len() {
                    if chunk[next] == b'\n' {
                        next += 1;
                    }
                } else {
                    self.after_cr = true;
                }
            }
            let blank = if !self.line.is_empty() || self.skipping_line {
                let skipped = self.skipping_line;
                self.skipping_line = false;
                if skipped || self.line.len() + (line_end - pos) > self.max_line {
                    if !skipped {
                        self.issues.oversized_lines += 1;
                    }
                    self.line.clear();
                    false
                } else {
                    let mut line = std::mem::take(&mut self.line);
                    line.extend_from_slice(&chunk[pos..line_end]);
                    self.field(chunk, &line, None);
                    line.clear();
                    self.line = line;
                    false
                }
            } else if line_end == pos {
                true
            } else if line_end - pos > self.max_line {
                // Over the cap whether or not it spans chunks: how the stream was cut into
                // chunks never changes what is measured.
                self.issues.oversized_lines += 1;
                false
            } else {
                self.field(chunk, &chunk[pos..line_end], Some(pos));
                false
            };
            if blank {
                self.dispatch(chunk, next, &mut on_event);
            } else {
                self.block_open = true;
            }
            pos = next;
        }
        // The chunk is about to go away: an in-chunk data slice must be copied to survive it.
        if let Data::InChunk(s, e) = self.data_at {
            self.data.clear();
            self.data.extend_from_slice(&chunk[s..e]);
            self.data.push(b'\n');
            self.data_at = Data::Buffered;
        }
        self.open_block()
    }

    fn open_block(&self) -> OpenBlock {
        match (self.block_open, self.block_start) {
            (false, _) => OpenBlock::None,
            (true, None) => OpenBlock::Earlier,
            (true, Some(s)) => OpenBlock::At(s),
        }
    }

    /// Keeps an incomplete trailing line for the next chunk, within the cap.
    fn carry(&mut self, rest: &[u8]) {
        self.block_open = true;
        if self.skipping_line {
            return;
        }
        if self.line.len() + rest.len() > self.max_line {
            self.issues.oversized_lines += 1;
            self.skipping_line = true;
            self.line.clear();
        } else {
            self.line.extend_from_slice(rest);
        }
    }

    /// Processes one non-blank line. `at` is the line's offset in `chunk` when it lies inside it.
    fn field(&mut self, chunk: &[u8], line: &[u8], at: Option<usize>) {
        if line[0] == b':' {
            return; // comment
        }
        let (name, value, value_off) = match memchr::memchr(b':', line) {
            Some(c) => {
                let v = c + 1;
                let v = if line.get(v) == Some(&b' ') { v + 1 } else { v };
                (&line[..c], &line[v..], v)
            }
            None => (line, &line[line.len()..], line.len()),
        };
        match name {
            b"data" => self.push_data(chunk, value, at.map(|a| a + value_off)),
            b"event" => {
                self.event_type.clear();
                self.event_type.extend_from_slice(value);
            }
            _ => {} // id, retry and unknown fields do not affect measurement
        }
    }

    fn push_data(&mut self, chunk: &[u8], value: &[u8], at: Option<usize>) {
        match (self.data_at, at) {
            (Data::Empty, Some(a)) => self.data_at = Data::InChunk(a, a + value.len()),
            (state, _) => {
                if let Data::InChunk(s, e) = state {
                    self.data.clear();
                    self.data.extend_from_slice(&chunk[s..e]);
                    self.data.push(b'\n');
                } else if state == Data::Empty {
                    self.data.clear();
                }
                if self.data.len() + value.len() > self.max_line {
                    // Keep memory bounded: the event's data is cut and the cut counted.
                    self.issues.oversized_lines += 1;
                } else {
                    self.data.extend_from_slice(value);
                }
                self.data.push(b'\n');
                self.data_at = Data::Buffered;
            }
        }
    }

    fn dispatch(&mut self, chunk: &[u8], end: usize, on_event: &mut impl FnMut(Event<'_>)) {
        let data: Option<&[u8]> = match self.data_at {
            Data::Empty => None,
            Data::InChunk(s, e) => Some(&chunk[s..e]),
            Data::Buffered => Some(&self.data[..self.data.len().saturating_sub(1)]),
        };
        if let Some(data) = data {
            on_event(Event {
                event_type: &self.event_type,
                data,
                start: self.block_start,
                end,
            });
        }
        self.data_at = Data::Empty;
        self.event_type.clear();
        self.block_open = false;
        self.block_start = Some(end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (event type, data, start, end) of every event, feeding `parts` in order.
    fn scan(parts: &[&[u8]]) -> Vec<(String, String)> {
        let mut s = SseScanner::new(64);
        let mut out = Vec::new();
        for p in parts {
            s.feed(p, |e| {
                out.push((
                    String::from_utf8_lossy(e.event_type).into_owned(),
                    String::from_utf8_lossy(e.data).into_owned(),
                ))
            });
        }
        out
    }

    /// Every fixture, split into two and into three pieces at every offset, gives the same events.
    fn every_split(input: &[u8], expected: &[(&str, &str)]) {
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(scan(&[input]), expected, "whole");
        for i in 0..=input.len() {
            assert_eq!(scan(&[&input[..i], &input[i..]]), expected, "split at {i}");
            for j in i..=input.len() {
                let got = scan(&[&input[..i], &input[i..j], &input[j..]]);
                assert_eq!(got, expected, "split at {i},{j}");
            }
        }
    }

    #[test]
    fn line_endings_all_split_points() {
        let want = [("", "a"), ("", "b")];
        every_split(b"data: a\n\ndata: b\n\n", &want);
        every_split(b"data: a\r\n\r\ndata: b\r\n\r\n", &want);
        every_split(b"data: a\r\rdata: b\r\r", &want);
        every_split(b"data: a\r\n\ndata: b\n\r\n", &want);
    }

    #[test]
    fn bom_comments_multiline_and_space_rules() {
        every_split(
            b"\xEF\xBB\xBF: keep-alive\ndata:x\ndata:  y\n\nevent: delta\ndata\n\n",
            &[("", "x\n y"), ("delta", "")],
        );
    }

    #[test]
    fn event_without_data_is_not_dispatched_and_eof_drops_partial() {
        every_split(b"event: ping\n\nid: 3\n\ndata: tail", &[]);
        let mut s = SseScanner::new(64);
        s.feed(b"data: tail", |_| {});
        assert!(s.has_partial());
    }

    #[test]
    fn oversized_line_is_skipped_and_counted() {
        let mut s = SseScanner::new(8);
        let mut got = Vec::new();
        for part in [&b"data: 0123"[..], b"456789\n\n", b"data: ok\n\n"] {
            s.feed(part, |e| got.push(e.data.to_vec()));
        }
        assert_eq!(got, vec![b"ok".to_vec()]);
        assert_eq!(s.issues().oversized_lines, 1);
    }

    #[test]
    fn ranges_locate_events_inside_chunks() {
        let mut s = SseScanner::default();
        let chunk = b"data: a\n\n: c\ndata: b\n\ndata: par";
        let mut ranges = Vec::new();
        let open = s.feed(chunk, |e| ranges.push((e.start, e.end)));
        assert_eq!(ranges, vec![(Some(0), 9), (Some(9), 22)]);
        assert_eq!(open, OpenBlock::At(22));
        let mut ranges = Vec::new();
        let open = s.feed(b"t\n\ndata: z\n", |e| ranges.push((e.start, e.end)));
        assert_eq!(ranges, vec![(None, 3)]);
        assert_eq!(open, OpenBlock::At(3));
    }

    #[test]
    fn single_line_event_inside_chunk_is_borrowed() {
        let mut s = SseScanner::default();
        let chunk = b"data: {\"x\":1}\n\n";
        s.feed(chunk, |e| {
            let inside = chunk.as_ptr_range();
            assert!(
                inside.contains(&e.data.as_ptr()),
                "data must borrow the chunk"
            );
        });
    }

    #[test]
    fn single_line_is_offered_only_between_events_and_within_the_cap() {
        let mut s = SseScanner::new(16);
        let one = b"data: {\"x\":1}\n\n";
        // At the stream's start: a chunk that begins with `data: ` has no BOM.
        assert_eq!(s.single_line(one), Some(&b"{\"x\":1}"[..]));
        // One that begins otherwise may be a BOM's first bytes: `feed` decides.
        let mut bom = SseScanner::new(16);
        assert_eq!(bom.single_line(b"\xEF\xBB\xBFdata: 1\n\n"), None);
        assert_eq!(bom.single_line(b"\n\n"), None);
        assert_eq!(bom.single_line(one), Some(&b"{\"x\":1}"[..]));
        s.feed(b"data: a\n\n", |_| {});
        assert_eq!(s.single_line(one), Some(&b"{\"x\":1}"[..]));
        for other in [
            &b"data:{\"x\":1}\n\n"[..],
            b"data: {\"x\":1}\r\n\r\n",
            b"data: {\"x\":1}\n",
            b"event: e\ndata: 1\n\n",
            b"data: {\"x\":12345678901}\n\n",
            b"\n\n",
            b"",
        ] {
            assert_eq!(s.single_line(other), None, "{other:?}");
        }
        // A block is open: the next frame's data would join it.
        s.feed(b"data: b\n", |_| {});
        assert_eq!(s.single_line(one), None);
        s.feed(b"\n", |_| {});
        assert_eq!(s.single_line(one), Some(&b"{\"x\":1}"[..]));
    }
}
