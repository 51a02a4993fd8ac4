//! Newline-delimited JSON (Ollama `/api/chat`, `/api/generate`), scanned incrementally.
//!
//! Each non-empty line is one event; a trailing CR is dropped. Only an incomplete last line is
//! kept between chunks, under the same hard cap as the SSE scanner.

use super::{Event, OpenBlock, ScanIssues, DEFAULT_MAX_LINE};

/// Incremental NDJSON line scanner.
#[derive(Debug)]
pub struct NdjsonScanner {
    line: Vec<u8>,
    skipping_line: bool,
    max_line: usize,
    issues: ScanIssues,
}

impl Default for NdjsonScanner {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_LINE)
    }
}

impl NdjsonScanner {
    /// A scanner whose lines are capped at `max_line` bytes.
    pub fn new(max_line: usize) -> Self {
        Self {
            line: Vec::new(),
            skipping_line: false,
            max_line,
            issues: ScanIssues::default(),
        }
    }

    /// What was skipped so far.
    pub fn issues(&self) -> ScanIssues {
        self.issues
    }

    /// True when an incomplete line is pending.
    pub fn has_partial(&self) -> bool {
        !self.line.is_empty() || self.skipping_line
    }

    /// Scans one chunk, calling `on_event` for every complete non-empty line.
    pub fn feed(&mut self, chunk: &[u8], mut on_event: impl FnMut(Event<'_>)) -> OpenBlock {
        let carried = self.has_partial();
        let mut start = if carried { None } else { Some(0) };
        let mut pos = 0;
        while let Some(i) = memchr::memchr(b'\n', &chunk[pos..]) {
            let end = pos + i + 1;
            let piece = &chunk[pos..pos + i];
            if self.skipping_line {
                self.skipping_line = false;
            } else if !self.line.is_empty() {
                if self.line.len() + piece.len() > self.max_line {
                    self.issues.oversized_lines += 1;
                } else {
                    let mut line = std::mem::take(&mut self.line);
                    line.extend_from_slice(piece);
                    emit(&line, start, end, &mut on_event);
                    line.clear();
                    self.line = line;
                }
                self.line.clear();
            } else if piece.len() > self.max_line {
                // Over the cap whether or not it spans chunks (see the SSE scanner).
                self.issues.oversized_lines += 1;
            } else {
                emit(piece, start, end, &mut on_event);
            }
            start = Some(end);
            pos = end;
        }
        if pos < chunk.len() {
            let rest = &chunk[pos..];
            if !self.skipping_line {
                if self.line.len() + rest.len() > self.max_line {
                    self.issues.oversized_lines += 1;
                    self.skipping_line = true;
                    self.line.clear();
                } else {
                    self.line.extend_from_slice(rest);
                }
            }
            return start.map_or(OpenBlock::Earlier, OpenBlock::At);
        }
        if self.has_partial() {
            OpenBlock::Earlier
        } else {
            OpenBlock::None
        }
    }
}

fn emit(line: &[u8], start: Option<usize>, end: usize, on_event: &mut impl FnMut(Event<'_>)) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return;
    }
    on_event(Event {
        event_type: b"",
        data: line,
        start,
        end,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(parts: &[&[u8]]) -> Vec<String> {
        let mut s = NdjsonScanner::new(32);
        let mut out = Vec::new();
        for p in parts {
            s.feed(p, |e| {
                out.push(String::from_utf8_lossy(e.data).into_owned())
            });
        }
        out
    }

    #[test]
    fn every_split_point_gives_the_same_lines() {
        let input = b"{\"a\":1}\r\n\n{\"b\":2}\n{\"c\":3}\n";
        let want = vec!["{\"a\":1}", "{\"b\":2}", "{\"c\":3}"];
        for i in 0..=input.len() {
            for j in i..=input.len() {
                let got = scan(&[&input[..i], &input[i..j], &input[j..]]);
                assert_eq!(got, want, "split at {i},{j}");
            }
        }
    }

    #[test]
    fn oversized_line_is_skipped() {
        let got = scan(&[
            b"{\"long\":\"0123456789",
            b"0123456789012345678901\"}\n{}\n",
        ]);
        assert_eq!(got, vec!["{}"]);
    }
}
