//! `Frames`: data frames that were ready together, handed on as one buffer of several parts.
//!
//! hyper pays per data frame it is given (on HTTP/1.1: a chunk header formatted through
//! `core::fmt`, a write-queue entry whose length it sums again for every frame queued after it,
//! its dispatch loop). A streaming response whose upstream read brought several chunks hands
//! them on as one frame of several parts: one chunk header, one queue entry, and each part still
//! its own slice of the `writev` (nothing copied).

use bytes::{Buf, BufMut as _, Bytes};
use std::io::IoSlice;

/// Most parts one `Frames` holds.
pub const MAX_PARTS: usize = 8;

/// Up to `MAX_PARTS` non-empty `Bytes`, read in order as one `Buf`. Held inline: no allocation.
#[derive(Debug, Default)]
pub struct Frames {
    parts: [Bytes; MAX_PARTS],
    /// `parts[start..end]` are unread (the first maybe in part).
    start: usize,
    end: usize,
    remaining: usize,
}

impl Frames {
    /// Adds `data` after the parts held; an empty `data` adds nothing. `false` (and `data`
    /// dropped) when full: check `is_full` first.
    pub fn push(&mut self, data: Bytes) -> bool {
        if data.is_empty() {
            return true;
        }
        let Some(slot) = self.parts.get_mut(self.end) else {
            return false;
        };
        self.remaining += data.len();
        *slot = data;
        self.end += 1;
        true
    }

    /// No part can be added.
    pub fn is_full(&self) -> bool {
        self.end == MAX_PARTS
    }

    /// No byte is held.
    pub fn is_empty(&self) -> bool {
        self.remaining == 0
    }

    /// How many parts are unread.
    pub fn parts(&self) -> usize {
        self.end - self.start
    }
}

impl From<Bytes> for Frames {
    fn from(data: Bytes) -> Self {
        let mut f = Self::default();
        f.push(data);
        f
    }
}

impl Buf for Frames {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.parts[self.start..self.end]
            .first()
            .map_or(&[], |p| p.as_ref())
    }

    fn advance(&mut self, mut cnt: usize) {
        assert!(cnt <= self.remaining, "advance past the end of Frames");
        self.remaining -= cnt;
        while cnt > 0 {
            let part = &mut self.parts[self.start];
            if cnt < part.len() {
                part.advance(cnt);
                return;
            }
            cnt -= part.len();
            *part = Bytes::new();
            self.start += 1;
        }
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        for (slot, part) in dst.iter_mut().zip(&self.parts[self.start..self.end]) {
            *slot = IoSlice::new(part);
            n += 1;
        }
        n
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        // One part holds it: a slice of that part, not a copy.
        match self.parts[self.start..self.end].first() {
            Some(p) if len <= p.len() => {
                let out = p.slice(..len);
                self.advance(len);
                out
            }
            _ => {
                assert!(
                    len <= self.remaining,
                    "copy_to_bytes past the end of Frames"
                );
                let mut out = bytes::BytesMut::with_capacity(len);
                out.put((&mut *self).take(len));
                out.freeze()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(parts: &[&'static [u8]]) -> Frames {
        let mut f = Frames::default();
        for p in parts {
            assert!(f.push(Bytes::from_static(p)));
        }
        f
    }

    #[test]
    fn reads_its_parts_in_order_however_it_is_advanced() {
        let parts: [&[u8]; 5] = [
            b"data: a\n\n",
            b"",
            b"data: bc\n\n",
            b"x",
            b"data: [DONE]\n\n",
        ];
        let whole: Vec<u8> = parts.concat();
        for step in 1..=whole.len() {
            let mut f = frames(&parts);
            assert_eq!(f.parts(), 4, "empty parts are not kept");
            let mut got = Vec::new();
            while f.has_remaining() {
                let n = f.chunk().len().min(step);
                got.extend_from_slice(&f.chunk()[..n]);
                f.advance(n);
                assert_eq!(f.remaining(), whole.len() - got.len());
            }
            assert_eq!(got, whole, "step {step}");
            assert!(f.chunk().is_empty());
        }
    }

    #[test]
    fn vectored_reads_give_every_unread_part_and_copies_take_a_part_without_copying() {
        let mut f = frames(&[b"abc", b"de", b"fgh"]);
        f.advance(1);
        let mut io = [IoSlice::new(&[]); 8];
        let n = f.chunks_vectored(&mut io);
        let seen: Vec<&[u8]> = io[..n].iter().map(|s| &s[..]).collect();
        assert_eq!(seen, [&b"bc"[..], b"de", b"fgh"]);
        let mut two = [IoSlice::new(&[]); 2];
        assert_eq!(f.chunks_vectored(&mut two), 2);

        let part = f.copy_to_bytes(2);
        assert_eq!(&part[..], b"bc");
        let across = f.copy_to_bytes(4);
        assert_eq!(&across[..], b"defg");
        assert_eq!(f.remaining(), 1);
        assert_eq!(f.chunk(), b"h");
    }

    #[test]
    fn holds_at_most_max_parts() {
        let mut f = Frames::default();
        for _ in 0..MAX_PARTS {
            assert!(!f.is_full());
            assert!(f.push(Bytes::from_static(b"x")));
        }
        assert!(f.is_full());
        assert!(!f.push(Bytes::from_static(b"y")));
        assert!(f.push(Bytes::new()), "an empty part always fits");
        assert_eq!(f.remaining(), MAX_PARTS);
        assert_eq!(Frames::from(Bytes::from_static(b"ab")).remaining(), 2);
    }
}
