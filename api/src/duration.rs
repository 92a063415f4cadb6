//! Kubernetes-style duration strings (`"10m"`, `"1h30m"`, `"250ms"`, `"7d"`) used in every spec.
//! One parser for the controller, the node agent and the CRD schema pattern.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Pattern the CRD schema enforces on every duration field: one or more `<number><unit>` groups,
/// units `ms`, `s`, `m`, `h` and `d` (a day is 24h).
pub const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h|d))+$";

/// Why a duration string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("empty duration: write a number followed by a unit, e.g. \"30s\", \"10m\", \"1h30m\"")]
    Empty,
    #[error(
        "invalid duration {input:?}: {problem} (use <number><unit> groups with units ms, s, m, h, d, e.g. \"90s\" or \"1h30m\")"
    )]
    Invalid {
        input: String,
        problem: &'static str,
    },
    #[error("duration {input:?} is too large")]
    Overflow { input: String },
}

/// Parse a duration such as `"10m"`, `"1h30m"`, `"1.5h"`, `"250ms"` or `"7d"`.
pub fn parse_duration(input: &str) -> Result<std::time::Duration, DurationError> {
    if input.is_empty() {
        return Err(DurationError::Empty);
    }
    let invalid = |problem| DurationError::Invalid {
        input: input.to_string(),
        problem,
    };
    let bytes = input.as_bytes();
    let mut i = 0;
    let mut total_nanos: u128 = 0;
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return Err(invalid("expected a number"));
        }
        let int_part = &input[start..i];
        let mut frac_part = "";
        if i < bytes.len() && bytes[i] == b'.' {
            i += 1;
            let fstart = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            if i == fstart {
                return Err(invalid("expected digits after the decimal point"));
            }
            frac_part = &input[fstart..i];
        }
        let ustart = i;
        while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
            i += 1;
        }
        let unit_nanos: u128 = match &input[ustart..i] {
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3_600 * 1_000_000_000,
            "d" => 86_400 * 1_000_000_000,
            "" => return Err(invalid("missing unit")),
            _ => return Err(invalid("unknown unit")),
        };
        let overflow = || DurationError::Overflow {
            input: input.to_string(),
        };
        let int: u128 = int_part.parse().map_err(|_| overflow())?;
        let mut nanos = int.checked_mul(unit_nanos).ok_or_else(overflow)?;
        if !frac_part.is_empty() {
            // Keep at most 9 fractional digits: finer than a nanosecond of a day is noise.
            let digits = &frac_part[..frac_part.len().min(9)];
            let frac: u128 = digits.parse().map_err(|_| overflow())?;
            let scale = 10u128.pow(digits.len() as u32);
            nanos = nanos
                .checked_add(frac * unit_nanos / scale)
                .ok_or_else(overflow)?;
        }
        total_nanos = total_nanos.checked_add(nanos).ok_or_else(overflow)?;
    }
    let secs = u64::try_from(total_nanos / 1_000_000_000).map_err(|_| DurationError::Overflow {
        input: input.to_string(),
    })?;
    Ok(std::time::Duration::new(
        secs,
        (total_nanos % 1_000_000_000) as u32,
    ))
}

/// Format a duration the way [`parse_duration`] reads it, largest units first (`"1h30m"`).
pub fn format_duration(d: std::time::Duration) -> String {
    let total_ms = d.as_millis();
    if total_ms == 0 {
        return "0s".to_string();
    }
    let mut out = String::new();
    let mut rest = total_ms;
    for (unit, ms) in [
        ("d", 86_400_000u128),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ] {
        if rest >= ms {
            out.push_str(&format!("{}{}", rest / ms, unit));
            rest %= ms;
        }
    }
    out
}

/// A duration field of a custom resource: written as text (`"10m"`), validated by
/// [`DURATION_PATTERN`] in the schema and by [`parse_duration`] when read.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct KubeDuration(pub std::time::Duration);

impl KubeDuration {
    pub const fn from_secs(secs: u64) -> Self {
        Self(std::time::Duration::from_secs(secs))
    }
    pub const fn from_millis(ms: u64) -> Self {
        Self(std::time::Duration::from_millis(ms))
    }
    pub fn as_duration(&self) -> std::time::Duration {
        self.0
    }
    /// The duration as a signed span for timestamp arithmetic.
    pub fn as_span(&self) -> jiff::SignedDuration {
        jiff::SignedDuration::try_from(self.0).unwrap_or(jiff::SignedDuration::MAX)
    }
}

impl fmt::Display for KubeDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_duration(self.0))
    }
}

impl fmt::Debug for KubeDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KubeDuration({self})")
    }
}

impl FromStr for KubeDuration {
    type Err = DurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_duration(s).map(Self)
    }
}

impl From<std::time::Duration> for KubeDuration {
    fn from(d: std::time::Duration) -> Self {
        Self(d)
    }
}

impl Serialize for KubeDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for KubeDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = Cow::<str>::deserialize(d)?;
        parse_duration(&text)
            .map(Self)
            .map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for KubeDuration {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": DURATION_PATTERN,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn parses_units_and_combinations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1m0.5s"), Ok(Duration::from_millis(60_500)));
    }

    #[test]
    fn rejects_malformed_input_with_reason() {
        assert_eq!(parse_duration(""), Err(DurationError::Empty));
        for (bad, problem) in [
            ("10", "missing unit"),
            ("m", "expected a number"),
            ("10x", "unknown unit"),
            ("1.h", "expected digits after the decimal point"),
            ("-5s", "expected a number"),
            ("5 s", "missing unit"),
            ("10mm", "unknown unit"),
        ] {
            match parse_duration(bad) {
                Err(DurationError::Invalid { input, problem: p }) => {
                    assert_eq!(input, bad);
                    assert_eq!(p, problem, "for {bad:?}");
                }
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
        assert!(matches!(
            parse_duration("99999999999999999999999d"),
            Err(DurationError::Overflow { .. })
        ));
    }

    #[test]
    fn error_message_tells_the_user_what_to_write() {
        let msg = parse_duration("10").unwrap_err().to_string();
        assert!(msg.contains("\"10\"") && msg.contains("1h30m"), "{msg}");
    }

    #[test]
    fn formats_largest_units_first() {
        assert_eq!(format_duration(Duration::from_secs(5400)), "1h30m");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1s500ms");
        assert_eq!(format_duration(Duration::ZERO), "0s");
        assert_eq!(format_duration(Duration::from_secs(86_400 * 7)), "7d");
    }

    #[test]
    fn serde_round_trip_and_error() {
        let d: KubeDuration = serde_json::from_str("\"2m\"").unwrap();
        assert_eq!(d.as_duration(), Duration::from_secs(120));
        assert_eq!(serde_json::to_string(&d).unwrap(), "\"2m\"");
        let err = serde_json::from_str::<KubeDuration>("\"2 minutes\"").unwrap_err();
        assert!(err.to_string().contains("invalid duration"), "{err}");
    }

    proptest::proptest! {
        #[test]
        fn format_then_parse_is_identity(ms in 0u64..10_000_000_000) {
            let d = Duration::from_millis(ms);
            proptest::prop_assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }
    }
}
