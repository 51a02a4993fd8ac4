//! A JSON object written straight into a byte buffer, field by field: for the access log, where
//! a line per request through serde's serializer cost ~20,000 instructions (keys escaped byte by
//! byte like any string, every write through `io::Write`). Values are spelled exactly as
//! `serde_json` spells them (escapes, `zmij` floats, non-finite floats as `null`), which the tests
//! check against it.

/// A field's key as `Object` takes it: `key!("name")` is `,"name":` (the comma is left out
/// before the first field), one copy per field.
#[macro_export]
#[doc(hidden)]
macro_rules! json_key {
    ($name:literal) => {
        concat!(",\"", $name, "\":")
    };
}
pub use crate::json_key as key;

/// An object being written into `out`; `close` ends it. Keys are spelled by `key!`.
pub struct Object<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl<'a> Object<'a> {
    /// Opens an object at the end of `out`.
    pub fn open(out: &'a mut Vec<u8>) -> Self {
        out.push(b'{');
        Self { out, first: true }
    }

    /// Writes a key spelled by `key!` (the field names are ours: nothing to escape) and returns
    /// the buffer for its value.
    pub fn key(&mut self, key: &str) -> &mut Vec<u8> {
        let key = key.as_bytes();
        let key = if std::mem::take(&mut self.first) {
            key.get(1..).unwrap_or_default()
        } else {
            key
        };
        self.out.extend_from_slice(key);
        self.out
    }

    /// A string field.
    pub fn str(&mut self, key: &str, v: &str) {
        string(self.key(key), v);
    }

    /// A string field, `null` when absent.
    pub fn opt_str(&mut self, key: &str, v: Option<&str>) {
        match v {
            Some(v) => self.str(key, v),
            None => self.null(key),
        }
    }

    /// A `null` field.
    pub fn null(&mut self, key: &str) {
        self.key(key).extend_from_slice(b"null");
    }

    /// A boolean field.
    pub fn bool(&mut self, key: &str, v: bool) {
        let v: &[u8] = if v { b"true" } else { b"false" };
        self.key(key).extend_from_slice(v);
    }

    /// An integer field.
    pub fn u64(&mut self, key: &str, v: u64) {
        uint(self.key(key), v);
    }

    /// An integer field, `null` when absent.
    pub fn opt_u64(&mut self, key: &str, v: Option<u64>) {
        match v {
            Some(v) => self.u64(key, v),
            None => self.null(key),
        }
    }

    /// A number field of milliseconds given in whole microseconds, spelled as `float` spells
    /// `util::quantile::us_to_ms(us)`; `null` when absent.
    pub fn ms(&mut self, key: &str, us: Option<u64>) {
        match us {
            Some(us) => millis(self.key(key), us),
            None => self.null(key),
        }
    }

    /// A number field of single precision (`null` when absent or not finite).
    pub fn f32(&mut self, key: &str, v: Option<f32>) {
        match v.filter(|v| v.is_finite()) {
            Some(v) => self
                .key(key)
                .extend_from_slice(zmij::Buffer::new().format_finite(v).as_bytes()),
            None => self.null(key),
        }
    }

    /// Ends the object.
    pub fn close(self) {
        self.out.push(b'}');
    }
}

/// An unsigned integer, in decimal.
pub fn uint(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// A number as `serde_json` writes an `f64`: shortest round-trip form, `null` when absent or not
/// finite.
pub fn float(out: &mut Vec<u8>, v: Option<f64>) {
    match v.filter(|v| v.is_finite()) {
        Some(v) => out.extend_from_slice(zmij::Buffer::new().format_finite(v).as_bytes()),
        None => out.extend_from_slice(b"null"),
    }
}

/// Whole microseconds as milliseconds, spelled as `float` spells `us as f64 / 1000.0`, in
/// integer arithmetic. Below 10^15 µs the quotient has at most 15 significant digits, so no
/// shorter decimal reads back as the same `f64` and the shortest form is its own digits, trailing
/// zeros dropped (`12.5`, `3.0`); above, `float` writes it.
pub fn millis(out: &mut Vec<u8>, us: u64) {
    const EXACT: u64 = 1_000_000_000_000_000;
    if us >= EXACT {
        #[allow(clippy::cast_precision_loss)] // what `us_to_ms` does too
        return float(out, Some(us as f64 / 1000.0));
    }
    uint(out, us / 1000);
    let frac = us % 1000;
    let digits = [
        b'0' + (frac / 100) as u8,
        b'0' + (frac / 10 % 10) as u8,
        b'0' + (frac % 10) as u8,
    ];
    let keep = if frac % 100 == 0 {
        1
    } else if frac % 10 == 0 {
        2
    } else {
        3
    };
    out.push(b'.');
    out.extend_from_slice(&digits[..keep]);
}

/// A JSON string: quoted, with `"`, `\` and control characters escaped as `serde_json` escapes
/// them (short forms where JSON has them, else `\u00XX`); everything else as it is.
pub fn string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        // Eight plain bytes at a time, then straight to the first that is not.
        if let Some(w) = bytes.get(i..i + 8) {
            let mut word = [0u8; 8];
            word.copy_from_slice(w);
            let m = not_plain(u64::from_le_bytes(word));
            if m == 0 {
                i += 8;
                continue;
            }
            i += (m.trailing_zeros() / 8) as usize;
        }
        let b = bytes[i];
        i += 1;
        if b >= 0x20 && b != b'"' && b != b'\\' {
            continue;
        }
        out.extend_from_slice(&bytes[start..i - 1]);
        start = i;
        let short = match b {
            b'"' => b'"',
            b'\\' => b'\\',
            0x08 => b'b',
            0x0c => b'f',
            b'\n' => b'n',
            b'\r' => b'r',
            b'\t' => b't',
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
                continue;
            }
        };
        out.push(b'\\');
        out.push(short);
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// `not_plain` lives with the scanners that use it too (`inferscope_wire::text`).
pub use inferscope_wire::text::not_plain;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn written(f: impl FnOnce(&mut Vec<u8>)) -> String {
        let mut out = Vec::new();
        f(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_word_test_agrees_with_the_byte_test() {
        let plain_byte = |b: u8| (0x20..0x80).contains(&b) && b != b'"' && b != b'\\';
        let mut rng = crate::util::Rng::new(7);
        let mut words: Vec<[u8; 8]> = Vec::new();
        for pos in 0..8 {
            for b in 0..=255u8 {
                for fill in [b'a', b' ', b'~', b'0'] {
                    let mut w = [fill; 8];
                    w[pos] = b;
                    words.push(w);
                }
            }
        }
        for _ in 0..100_000 {
            let r = rng.next_u64();
            // Mostly plain bytes, some of anything.
            let mut w = r.to_le_bytes();
            for (i, b) in w.iter_mut().enumerate() {
                if (r >> (i * 3)) & 7 != 0 {
                    *b = 0x20 + *b % 0x60;
                }
            }
            words.push(w);
        }
        for w in words {
            let m = not_plain(u64::from_le_bytes(w));
            let first = w.iter().position(|&b| !plain_byte(b));
            assert_eq!(
                (m != 0).then(|| (m.trailing_zeros() / 8) as usize),
                first,
                "{w:?}"
            );
        }
    }

    #[test]
    fn strings_are_escaped_exactly_as_serde_json_escapes_them() {
        let mut cases: Vec<String> = (0u8..0x80).map(|b| char::from(b).to_string()).collect();
        cases.extend(
            [
                "",
                "plain /v1/chat/completions",
                "a\"b\\c\nd\te\u{1}f\u{7f}",
                "ünïcødé ✓ 🦀 \u{2028}",
                "\"\"\\\\",
                "end\\",
            ]
            .map(String::from),
        );
        let every: String = (0u8..0x80).map(char::from).collect();
        cases.push(every);
        // Strings long enough for the word test, with what needs escaping anywhere in them.
        let mut rng = crate::util::Rng::new(5);
        let pick = [
            'a', ' ', '~', '"', '\\', '\n', '\u{1}', '\u{7f}', 'é', '🦀', '/',
        ];
        for _ in 0..2000 {
            let n = (rng.next_u64() % 40) as usize;
            let s: String = (0..n)
                .map(|_| match rng.next_u64() % 4 {
                    0 => pick[(rng.next_u64() % pick.len() as u64) as usize],
                    _ => 'x',
                })
                .collect();
            cases.push(s);
        }
        for s in &cases {
            assert_eq!(
                written(|o| string(o, s)),
                serde_json::to_string(s).unwrap(),
                "{s:?}"
            );
        }
    }

    #[test]
    fn numbers_are_spelled_as_serde_json_spells_them() {
        let floats = [
            0.0,
            -0.0,
            1.0,
            0.1,
            12.345,
            1e-7,
            1.5e300,
            123_456_789.0,
            f64::MIN_POSITIVE,
            f64::MAX,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ];
        for v in floats {
            assert_eq!(
                written(|o| float(o, Some(v))),
                serde_json::to_string(&v).unwrap(),
                "{v}"
            );
            let v32 = v as f32;
            let mut out = Vec::new();
            let mut obj = Object::open(&mut out);
            obj.f32(key!("x"), Some(v32));
            obj.close();
            let want = format!("{{\"x\":{}}}", serde_json::to_string(&v32).unwrap());
            assert_eq!(String::from_utf8(out).unwrap(), want, "{v32}");
        }
        assert_eq!(written(|o| float(o, None)), "null");
        for v in [0, 7, 10, 999, u64::from(u32::MAX), u64::MAX] {
            assert_eq!(written(|o| uint(o, v)), v.to_string());
        }
    }

    #[test]
    fn milliseconds_are_spelled_as_the_float_of_whole_microseconds_is() {
        let mut values = vec![
            0,
            1,
            9,
            10,
            100,
            999,
            1000,
            1001,
            1010,
            1100,
            12_345,
            999_999_999_999_999,
            1_000_000_000_000_000,
            1_000_000_000_000_001,
            u64::MAX,
        ];
        let mut rng = crate::util::Rng::new(11);
        for bits in [10, 20, 30, 40, 50, 60, 64] {
            for _ in 0..2_000 {
                values.push(rng.next_u64() >> (64 - bits));
            }
        }
        for us in values {
            let want = written(|o| float(o, Some(crate::util::quantile::us_to_ms(us))));
            assert_eq!(written(|o| millis(o, us)), want, "{us} µs");
        }
        let mut out = Vec::new();
        let mut obj = Object::open(&mut out);
        obj.ms(key!("a"), Some(1500));
        obj.ms(key!("b"), None);
        obj.close();
        assert_eq!(String::from_utf8(out).unwrap(), r#"{"a":1.5,"b":null}"#);
    }

    #[test]
    fn an_object_is_valid_json_with_its_fields_in_order() {
        let mut out = b"x".to_vec();
        let mut obj = Object::open(&mut out);
        obj.str(key!("s"), "a\"b");
        obj.opt_str(key!("none"), None);
        obj.bool(key!("t"), true);
        obj.u64(key!("n"), 3);
        obj.opt_u64(key!("m"), None);
        obj.ms(key!("f"), Some(2500));
        obj.close();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"x{"s":"a\"b","none":null,"t":true,"n":3,"m":null,"f":2.5}"#
        );
    }
}
