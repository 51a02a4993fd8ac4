//! Time formatting.

use std::time::{SystemTime, UNIX_EPOCH};

/// RFC 3339 UTC timestamp with milliseconds, from the system clock.
pub fn rfc3339(t: SystemTime) -> String {
    let mut out = Vec::with_capacity(24);
    write_rfc3339(&mut out, t);
    // Digits and ASCII punctuation only.
    String::from_utf8(out).unwrap_or_default()
}

/// `rfc3339`, appended to `out` (the access log writes it in place).
pub fn write_rfc3339(out: &mut Vec<u8>, t: SystemTime) {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil-from-days (Howard Hinnant's algorithm), valid for all dates after 1970.
    let z = days as i64 + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    // Fixed width, digit by digit: this runs for every access-log line, where `format!`'s
    // machinery cost more than the rest of the date.
    let fields = [
        (year.clamp(0, 9999) as u64, 4, b'-'),
        (month as u64, 2, b'-'),
        (day as u64, 2, b'T'),
        (rem / 3600, 2, b':'),
        (rem % 3600 / 60, 2, b':'),
        (rem % 60, 2, b'.'),
    ];
    for (v, n, then) in fields {
        push_digits(out, v, n);
        out.push(then);
    }
    push_digits(out, u64::from(d.subsec_millis()), 3);
    out.push(b'Z');
}

/// The last `n` decimal digits of `v`, zero-padded.
fn push_digits(out: &mut Vec<u8>, v: u64, n: u32) {
    for i in (0..n).rev() {
        out.push(b'0' + (v / 10u64.pow(i) % 10) as u8);
    }
}

/// Seconds since the Unix epoch of a UTC timestamp as `rfc3339` writes it
/// (`YYYY-MM-DDTHH:MM:SS[.fff]Z`); `None` for anything else.
pub fn parse_rfc3339(s: &str) -> Option<f64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || !s.ends_with('Z') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, m, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || h > 23 || m > 59 || sec > 60 {
        return None;
    }
    let frac = match &s[19..s.len() - 1] {
        "" => 0.0,
        f if f.starts_with('.') && f.len() > 1 && f[1..].bytes().all(|c| c.is_ascii_digit()) => {
            format!("0{f}").parse::<f64>().ok()?
        }
        _ => return None,
    };
    // Days-from-civil (Howard Hinnant's algorithm), the inverse of `rfc3339`'s.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + h * 3600 + m * 60 + sec) as f64 + frac)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_formats_known_instants() {
        let t = UNIX_EPOCH + Duration::from_millis(1_796_140_800_123);
        assert_eq!(rfc3339(t), "2026-12-01T16:00:00.123Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn rfc3339_writes_what_format_would() {
        let mut ms = 0u64;
        while ms < 253_402_300_799_999 {
            let t = UNIX_EPOCH + Duration::from_millis(ms);
            let d = t.duration_since(UNIX_EPOCH).unwrap();
            let days = d.as_secs() / 86_400;
            let rem = d.as_secs() % 86_400;
            let (y, m, day) = civil(days as i64);
            let want = format!(
                "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
                rem / 3600,
                rem % 3600 / 60,
                rem % 60,
                d.subsec_millis()
            );
            assert_eq!(rfc3339(t), want);
            ms += ms / 97 + 7_919_113;
        }
    }

    /// Year, month and day of a day count, by counting (the oracle for `rfc3339`'s arithmetic).
    fn civil(mut days: i64) -> (i64, i64, i64) {
        let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        let mut y = 1970;
        while days >= if leap(y) { 366 } else { 365 } {
            days -= if leap(y) { 366 } else { 365 };
            y += 1;
        }
        let feb = if leap(y) { 29 } else { 28 };
        let lens = [31, feb, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
        let mut m = 0;
        while days >= lens[m] {
            days -= lens[m];
            m += 1;
        }
        (y, m as i64 + 1, days + 1)
    }

    #[test]
    fn parse_reads_what_rfc3339_writes() {
        for secs in [0u64, 951_782_400, 1_700_000_000, 4_102_444_799] {
            let t = UNIX_EPOCH + Duration::from_millis(secs * 1000 + 250);
            let back = parse_rfc3339(&rfc3339(t)).unwrap();
            assert!((back - (secs as f64 + 0.25)).abs() < 1e-6, "{secs}: {back}");
        }
        assert_eq!(parse_rfc3339("2026-12-01T22:45:26Z"), Some(1_796_165_126.0));
        for bad in [
            "",
            "2026-13-01T00:00:00Z",
            "2026-12-01 22:45:26Z",
            "2026-12-01T22:45:26.Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }
}
