//! Durations in the config: humantime strings (`250ms`, `1.5s`, `2m`, `1h`, `1m 30s`).
//!
//! A serde adapter of its own rather than `humantime-serde`'s: that one reports every bad value as
//! "expected a duration", dropping humantime's reason (which unit is unknown, a missing unit); the
//! config's errors keep it.

use humantime::DurationError;
use serde::{Deserialize, Deserializer};
use std::time::Duration;

/// A string that is not a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadDuration {
    /// A number with a unit humantime does not know (or none).
    #[error("`{value}`: unknown unit `{unit}` (use ms, s, m, h)")]
    UnknownUnit {
        /// As given.
        value: String,
        /// The unit.
        unit: String,
    },
    /// Not a number and unit.
    #[error("`{0}` is not a duration (e.g. 250ms, 1.5s, 2m)")]
    Malformed(String),
    /// Too large.
    #[error("`{0}` is out of range")]
    OutOfRange(String),
}

/// Parses a duration as the config does.
pub fn parse(s: &str) -> Result<Duration, BadDuration> {
    let s = s.trim();
    humantime::parse_duration(s).map_err(|e| match e {
        DurationError::UnknownUnit { unit, .. } => BadDuration::UnknownUnit {
            value: s.into(),
            unit,
        },
        DurationError::NumberOverflow => BadDuration::OutOfRange(s.into()),
        DurationError::NumberExpected(_)
        | DurationError::InvalidCharacter(_)
        | DurationError::Empty => BadDuration::Malformed(s.into()),
    })
}

/// A duration as the JSON Schema shows it: a string such as `250ms`, `1.5s` or `1m 30s`
/// (`#[schemars(with = "duration::Text")]`).
pub(super) struct Text;

impl schemars::JsonSchema for Text {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "title": "duration",
            "description": "A number and a unit (ns, us, ms, s, m, h, d), several added: `250ms`, `1.5s`, `1m 30s`.",
            "examples": ["250ms", "1.5s", "1m 30s"],
        })
    }
}

/// `#[serde(with = "duration")]` for `Duration` fields.
pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    parse(&s).map_err(serde::de::Error::custom)
}

/// Writes a duration as the config reads it (`2s`, `1m 30s`): the defaults in the JSON Schema.
pub(super) fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_duration(*d))
}

/// `#[serde(with = "duration::option")]` for `Option<Duration>` fields.
pub(super) mod option {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    /// Writes an optional duration as the config reads it.
    pub(crate) fn serialize<S: serde::Serializer>(
        d: &Option<Duration>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::serialize(d, s),
            None => s.serialize_none(),
        }
    }

    /// Deserializes an optional duration.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
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
        // What `serialize` writes reads back.
        for d in [
            Duration::from_millis(1500),
            Duration::from_secs(90),
            Duration::ZERO,
        ] {
            let written = humantime::format_duration(d).to_string();
            assert_eq!(parse(&written), Ok(d), "{written}");
        }
        assert!(parse("5").is_err());
        let e = parse("5 parsecs")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("unknown unit `parsecs`"), "{e}");
    }
}
