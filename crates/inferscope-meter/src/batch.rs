//! `Batch`: the pieces of a response body that one upstream read made available, handed on
//! together as one frame (one chunk on an HTTP/1.1 client connection, one write), each piece
//! still the `Bytes` it was read into — nothing is copied to join them.
//!
//! A backend writes each streamed event as its own HTTP/1.1 chunk; under load several of them
//! arrive in one read. Handed on one frame each, every one pays the server's per-frame work
//! (a poll through the body stack, the meter's clock reads, a chunk header, a queue entry); as
//! one frame the read pays it once, as nginx does with `proxy_buffering off`. No piece waits
//! for another: a batch holds only what was already read when it was made.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use std::collections::VecDeque;
use std::io::IoSlice;

/// Most pieces in one batch: each is one `writev` slot of the client's connection.
pub const MAX_PIECES: usize = 32;

/// A body's data as the meter reads it: one or more `Bytes`, in order.
pub trait Parts: Buf + From<Bytes> {
    /// The pieces still to send, in order (none empty unless the data is).
    fn parts(&self) -> &[Bytes];

    /// `first` and as many of the pieces waiting in `rest` as one frame of this type holds.
    fn gather(first: Bytes, rest: &mut VecDeque<Bytes>) -> Self;
}

impl Parts for Bytes {
    fn parts(&self) -> &[Bytes] {
        std::slice::from_ref(self)
    }

    fn gather(first: Bytes, _: &mut VecDeque<Bytes>) -> Self {
        first
    }
}

/// Pieces of a body sent as one frame. One piece needs no allocation.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    /// `parts[at..]` are still to send; `parts[at]` may be partly sent (advanced in place).
    parts: Pieces,
    at: usize,
    len: usize,
}

#[derive(Debug, Clone)]
enum Pieces {
    One(Bytes),
    Many(Vec<Bytes>),
}

impl Default for Pieces {
    fn default() -> Self {
        Pieces::One(Bytes::new())
    }
}

impl Batch {
    /// Adds `b` after the pieces already held.
    pub fn push(&mut self, b: Bytes) {
        if b.is_empty() {
            return;
        }
        self.len += b.len();
        match &mut self.parts {
            Pieces::One(first) if first.is_empty() => *first = b,
            Pieces::One(first) => {
                let mut v = Vec::with_capacity(8);
                v.push(std::mem::take(first));
                v.push(b);
                self.parts = Pieces::Many(v);
            }
            Pieces::Many(v) => v.push(b),
        }
    }

    /// How many pieces it holds.
    pub fn count(&self) -> usize {
        self.parts().len()
    }

    fn all(&self) -> &[Bytes] {
        match &self.parts {
            Pieces::One(b) => std::slice::from_ref(b),
            Pieces::Many(v) => &v[self.at..],
        }
    }
}

impl From<Bytes> for Batch {
    fn from(b: Bytes) -> Self {
        Batch {
            len: b.len(),
            parts: Pieces::One(b),
            at: 0,
        }
    }
}

impl Parts for Batch {
    fn parts(&self) -> &[Bytes] {
        let all = self.all();
        if all.len() == 1 && all[0].is_empty() {
            &[]
        } else {
            all
        }
    }

    fn gather(first: Bytes, rest: &mut VecDeque<Bytes>) -> Self {
        let mut b = Batch::from(first);
        while b.count() < MAX_PIECES {
            let Some(next) = rest.pop_front() else { break };
            b.push(next);
        }
        b
    }
}

impl Buf for Batch {
    fn remaining(&self) -> usize {
        self.len
    }

    fn chunk(&self) -> &[u8] {
        self.all().first().map_or(&[], |b| &b[..])
    }

    fn advance(&mut self, mut cnt: usize) {
        assert!(cnt <= self.len, "advance past the end of a batch");
        self.len -= cnt;
        match &mut self.parts {
            Pieces::One(b) => b.advance(cnt),
            Pieces::Many(v) => {
                while cnt > 0 {
                    let b = &mut v[self.at];
                    if cnt < b.len() {
                        b.advance(cnt);
                        return;
                    }
                    cnt -= b.len();
                    // Sent: release the buffer now rather than with the batch.
                    *b = Bytes::new();
                    self.at += 1;
                }
            }
        }
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        for (slot, b) in dst
            .iter_mut()
            .zip(self.all().iter().filter(|b| !b.is_empty()))
        {
            *slot = IoSlice::new(b);
            n += 1;
        }
        n
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        // Within the first piece: a slice of it, no copy.
        let first = match &mut self.parts {
            Pieces::One(b) => Some(b),
            Pieces::Many(v) => v.get_mut(self.at),
        };
        if let Some(b) = first.filter(|b| b.len() >= len) {
            let out = b.split_to(len);
            self.len -= len;
            if b.is_empty() && matches!(self.parts, Pieces::Many(_)) {
                self.at += 1;
            }
            return out;
        }
        assert!(len <= self.len, "copy_to_bytes past the end of a batch");
        let mut out = BytesMut::with_capacity(len);
        out.put((&mut *self).take(len));
        out.freeze()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn batch(pieces: &[&'static [u8]]) -> Batch {
        let mut b = Batch::default();
        for p in pieces {
            b.push(Bytes::from_static(p));
        }
        b
    }

    /// Everything a `Buf` reader gets, reading `step` bytes at a time through `chunk`.
    fn drain(mut b: Batch, step: usize) -> Vec<u8> {
        let mut out = Vec::new();
        while b.has_remaining() {
            let c = b.chunk();
            assert!(
                !c.is_empty(),
                "an empty chunk with {} bytes left",
                b.remaining()
            );
            let n = c.len().min(step);
            out.extend_from_slice(&c[..n]);
            b.advance(n);
        }
        out
    }

    #[test]
    fn reads_back_its_pieces_in_order_however_it_is_advanced() {
        let pieces: &[&[u8]] = &[
            b"data: a\n\n",
            b"",
            b"data: bb\n\n",
            b"x",
            b"data: [DONE]\n\n",
        ];
        let whole: Vec<u8> = pieces.concat();
        for step in [1, 2, 3, 7, 9, 10, 64] {
            let b = batch(pieces);
            assert_eq!(b.remaining(), whole.len());
            assert_eq!(b.count(), 4, "empty pieces are not kept");
            assert_eq!(drain(b, step), whole, "step {step}");
        }
        assert_eq!(drain(batch(&[b"one"]), 2), b"one");
        let empty = Batch::default();
        assert_eq!((empty.remaining(), empty.count()), (0, 0));
        assert!(empty.chunk().is_empty());
    }

    #[test]
    fn gathers_what_waits_up_to_its_limit() {
        let mut q: VecDeque<Bytes> = (0..MAX_PIECES + 3)
            .map(|i| Bytes::from(i.to_string()))
            .collect();
        let first = q.pop_front().unwrap();
        let b = Batch::gather(first, &mut q);
        assert_eq!(b.count(), MAX_PIECES);
        assert_eq!(&b.parts()[1][..], b"1");
        assert_eq!(q.len(), 3);
        let one = Bytes::gather(Bytes::from_static(b"x"), &mut q);
        assert_eq!((&one[..], q.len()), (&b"x"[..], 3));
    }

    #[test]
    fn vectored_chunks_are_the_unsent_pieces() {
        let mut b = batch(&[b"abc", b"de", b"fgh"]);
        b.advance(4);
        let mut io = [IoSlice::new(&[]); 4];
        let n = b.chunks_vectored(&mut io);
        let got: Vec<&[u8]> = io[..n].iter().map(|s| &s[..]).collect();
        assert_eq!(got, [&b"e"[..], b"fgh"]);
        let mut one = [IoSlice::new(&[]); 1];
        assert_eq!(b.chunks_vectored(&mut one), 1);
        assert_eq!(&one[0][..], b"e");
    }

    #[test]
    fn copy_to_bytes_slices_within_a_piece_and_joins_across_pieces() {
        let mut b = batch(&[b"abc", b"defg"]);
        assert_eq!(&b.copy_to_bytes(2)[..], b"ab");
        assert_eq!(&b.copy_to_bytes(3)[..], b"cde");
        assert_eq!(b.remaining(), 2);
        assert_eq!(&b.copy_to_bytes(2)[..], b"fg");
        assert_eq!(b.remaining(), 0);
        let mut one = Batch::from(Bytes::from_static(b"xyz"));
        assert_eq!(&one.copy_to_bytes(3)[..], b"xyz");
        assert!(!one.has_remaining());
    }

    #[test]
    #[should_panic(expected = "advance past the end")]
    fn advancing_past_the_end_panics_as_bytes_does() {
        batch(&[b"ab", b"c"]).advance(4);
    }
}
