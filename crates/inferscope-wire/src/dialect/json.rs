//! Borrowing serde views shared by the dialects: each reads one JSON value into the little
//! measurement needs, without allocating unless a string holds escapes.

use super::FinishReason;
use serde::de::{self, Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;
use std::borrow::Cow;
use std::fmt;

/// A string borrowed from the input when it has no escapes. (serde's own `Cow` does not borrow
/// inside an `Option`, which would allocate on every event.)
pub(super) struct Str<'a>(pub(super) Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Str<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Owned(s.to_owned())))
            }
        }
        d.deserialize_str(V(std::marker::PhantomData))
    }
}

/// A short tag (`"type"`, a stop reason) compared, not kept: borrowed when it has no escapes.
pub(super) type Tag<'a> = Option<Str<'a>>;

/// The tag's text, `""` when absent.
pub(super) fn tag<'a>(t: &'a Tag<'_>) -> &'a str {
    t.as_ref().map_or("", |s| &s.0)
}

/// True when a string value is present and non-empty (null, absent and `""` are false; an
/// array of parts is true when it has any part).
#[derive(Default)]
pub(super) struct NonEmpty(pub(super) bool);

impl<'de> Deserialize<'de> for NonEmpty {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NonEmpty;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or null")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<NonEmpty, E> {
                Ok(NonEmpty(!s.is_empty()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<NonEmpty, E> {
                Ok(NonEmpty(false))
            }
            fn visit_none<E: de::Error>(self) -> Result<NonEmpty, E> {
                Ok(NonEmpty(false))
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<NonEmpty, D::Error> {
                d.deserialize_any(V)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<NonEmpty, A::Error> {
                let mut any = false;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    any = true;
                }
                Ok(NonEmpty(any))
            }
        }
        d.deserialize_any(V)
    }
}

/// The length of an array (null and absent: 0), its elements skipped.
#[derive(Default)]
pub(super) struct Count(pub(super) u32);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Count;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array or null")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Count, E> {
                Ok(Count(0))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Count, A::Error> {
                let mut n = 0u32;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    n = n.saturating_add(1);
                }
                Ok(Count(n))
            }
        }
        d.deserialize_any(V)
    }
}

/// Present and not null: an error object or message of any shape.
#[derive(Default)]
pub(super) struct Present(pub(super) bool);

impl<'de> Deserialize<'de> for Present {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Present;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Present, E> {
                Ok(Present(false))
            }
            fn visit_none<E: de::Error>(self) -> Result<Present, E> {
                Ok(Present(false))
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Present, D::Error> {
                d.deserialize_any(V)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Present, E> {
                Ok(Present(true))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Present, E> {
                Ok(Present(true))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Present, E> {
                Ok(Present(true))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Present, E> {
                Ok(Present(true))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Present, E> {
                Ok(Present(true))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Present, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Present(true))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Present, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Present(true))
            }
        }
        d.deserialize_any(V)
    }
}

/// A non-negative count that some servers send as a float (`12.0`); negative or fractional
/// values are kept as absent rather than trusted.
#[derive(Default, Clone, Copy)]
pub(super) struct Num(pub(super) Option<u64>);

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Num;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a count")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Num, E> {
                Ok(Num(None))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Num, E> {
                Ok(Num(Some(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Num, E> {
                Ok(Num(u64::try_from(v).ok()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Num, E> {
                Ok(Num(
                    (v >= 0.0 && v.fract() == 0.0 && v < 1e18).then_some(v as u64)
                ))
            }
        }
        d.deserialize_any(V)
    }
}

/// A duration some servers send as float milliseconds (llama.cpp `timings`), kept in
/// nanoseconds; negative, NaN or absurd values are absent.
#[derive(Default, Clone, Copy)]
pub(super) struct Millis(pub(super) Option<u64>);

impl<'de> Deserialize<'de> for Millis {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Millis;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("milliseconds")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Millis, E> {
                Ok(Millis(None))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Millis, E> {
                Ok(Millis(v.checked_mul(1_000_000)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Millis, E> {
                Ok(Millis(
                    u64::try_from(v).ok().and_then(|v| v.checked_mul(1_000_000)),
                ))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Millis, E> {
                Ok(Millis(
                    (0.0..1e12).contains(&v).then_some((v * 1e6).round() as u64),
                ))
            }
        }
        d.deserialize_any(V)
    }
}

/// An OpenAI-spelled finish reason (string) or null.
pub(super) struct Reason(pub(super) FinishReason);

impl<'de> Deserialize<'de> for Reason {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Reason;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a finish reason")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Reason, E> {
                Ok(Reason(FinishReason::parse(s)))
            }
        }
        d.deserialize_str(V)
    }
}

/// Reads `data` (trimmed) as `T`; `None` when it is not that JSON.
pub(super) fn read<'a, T: Deserialize<'a>>(data: &'a [u8]) -> Option<T> {
    serde_json::from_slice::<T>(data.trim_ascii()).ok()
}

/// Appends `t` to `out`, up to `cap` bytes in all, cut at a character boundary.
pub(super) fn push_capped(out: &mut String, t: &str, cap: usize) {
    let room = cap.saturating_sub(out.len());
    let mut end = t.len().min(room);
    while !t.is_char_boundary(end) {
        end -= 1;
    }
    out.push_str(&t[..end]);
}
