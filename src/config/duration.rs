//! Durations in the config: humantime strings (`250ms`, `1.5s`, `2m`, `1h`, `1m 30s`).
//!
//! A serde adapter of its own rather than `humantime-serde`'s: that one reports every bad value as
//! "expected a duration", dropping humantime's reason (which unit is unknown, a missing unit); the
//! config's errors keep it.

use humantime::DurationError;
use serde::{Deserialize, Deserializer};
use std::time::Duration;

/// Parses a duration as the config does.
pub fn parse(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    humantime::parse_duration(s).map_err(|e| match e {
        DurationError::UnknownUnit { unit, .. } => {
            format!("`{s}`: unknown unit `{unit}` (use ms, s, m, h)")
        }
        DurationError::NumberExpected(_) | DurationError::InvalidCharacter(_) => {
            format!("`{s}` is not a duration (e.g. 250ms, 1.5s, 2m)")
        }
        DurationError::NumberOverflow => format!("`{s}` is out of range"),
        DurationError::Empty => "empty duration (e.g. 250ms, 1.5s, 2m)".into(),
    })
}

/// `#[serde(with = "duration")]` for `Duration` fields.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    parse(&s).map_err(serde::de::Error::custom)
}

/// `#[serde(with = "duration::option")]` for `Option<Duration>` fields.
pub mod option {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    /// Deserializes an optional duration.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| super::parse(&s).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1m 30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert!(parse("5").is_err());
        let e = parse("5 parsecs").err().unwrap_or_default();
        assert!(e.contains("unknown unit `parsecs`"), "{e}");
    }
}
