//! Go-style durations in configuration files and flags (`720h`, `30m`, `1h30m`, `1.5h`, `90s`), as Go's `time.ParseDuration` reads them.
//!
//! People who run kcp write durations the Go way everywhere else (cert-manager `duration: 2160h`, kcp-operator
//! `validity: 8766h`), so the grace is read with the same grammar. `humantime` would also accept `30days` or
//! `1month` (which it takes as 30.44 days) and reject `1.5h`; a few lines here give exactly Go's rules. Unlike
//! Go, a sign is refused: a negative grace means nothing.

use std::time::Duration;

/// Why a duration string was refused. The field path says where; the value is not repeated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("must not be empty")]
    Empty,
    #[error("must not have a sign")]
    Signed,
    #[error("is not a duration like 720h, 1h30m or 90s")]
    Malformed,
    #[error("has an unknown unit (use ns, us, ms, s, m or h)")]
    UnknownUnit,
    #[error("is too large")]
    Overflow,
}

const NANOS_PER: [(&str, u128); 8] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("μs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Parses a Go duration. `"0"` alone is zero; otherwise every number needs a unit.
pub fn parse_go_duration(text: &str) -> Result<Duration, DurationError> {
    if text.is_empty() {
        return Err(DurationError::Empty);
    }
    if text.starts_with(['+', '-']) {
        return Err(DurationError::Signed);
    }
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = text;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let (int_digits, after_int) = rest.split_at(int_len);
        let (frac_digits, after_number) = match after_int.strip_prefix('.') {
            Some(after_dot) => {
                let frac_len = after_dot.find(|c: char| !c.is_ascii_digit()).unwrap_or(after_dot.len());
                after_dot.split_at(frac_len)
            }
            None => ("", after_int),
        };
        if int_digits.is_empty() && frac_digits.is_empty() {
            return Err(DurationError::Malformed);
        }
        let unit_len = after_number.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(after_number.len());
        let (unit, after_unit) = after_number.split_at(unit_len);
        if unit.is_empty() {
            return Err(DurationError::Malformed);
        }
        let per =
            NANOS_PER.iter().find(|(name, _)| *name == unit).map(|(_, n)| *n).ok_or(DurationError::UnknownUnit)?;
        total = total.checked_add(component_nanos(int_digits, frac_digits, per)?).ok_or(DurationError::Overflow)?;
        rest = after_unit;
    }
    let nanos = u64::try_from(total).map_err(|_| DurationError::Overflow)?;
    Ok(Duration::from_nanos(nanos))
}

/// `int.frac` × `per` nanoseconds; fractions below a nanosecond are dropped, as Go does.
fn component_nanos(int_digits: &str, frac_digits: &str, per: u128) -> Result<u128, DurationError> {
    let int: u128 = if int_digits.is_empty() { 0 } else { int_digits.parse().map_err(|_| DurationError::Overflow)? };
    let mut nanos = int.checked_mul(per).ok_or(DurationError::Overflow)?;
    // Digits beyond what a nanosecond can resolve do not change the result; ignoring them keeps 10^n in range.
    let frac_digits = &frac_digits[..frac_digits.len().min(30)];
    if !frac_digits.is_empty() {
        let frac: u128 = frac_digits.parse().map_err(|_| DurationError::Malformed)?;
        let scale = 10u128.pow(u32::try_from(frac_digits.len()).map_err(|_| DurationError::Malformed)?);
        // frac < 10^30 and per ≤ 3.6e12, so the product fits in u128 (< 3.4e38).
        nanos = nanos.checked_add(frac * per / scale).ok_or(DurationError::Overflow)?;
    }
    Ok(nanos)
}

/// A configuration duration; deserializes from Go-style strings like `30s`, `5m`, `1h30m`, `720h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ConfigDuration(pub Duration);

impl<'de> serde::Deserialize<'de> for ConfigDuration {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        parse_go_duration(&text).map(ConfigDuration).map_err(|e| serde::de::Error::custom(format!("duration {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn go_durations_parse_like_go() {
        let cases = [
            ("720h", secs(720 * 3600)),
            ("8766h", secs(8766 * 3600)),
            ("30m", secs(1800)),
            ("90s", secs(90)),
            ("1h30m", secs(5400)),
            ("1h30m15s", secs(5415)),
            ("1.5h", secs(5400)),
            (".5s", Duration::from_millis(500)),
            ("1.s", secs(1)),
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("250ms", Duration::from_millis(250)),
            ("3us", Duration::from_micros(3)),
            ("3µs", Duration::from_micros(3)),
            ("7ns", Duration::from_nanos(7)),
            ("1.0000000001s", secs(1)),
            ("2h2h", secs(4 * 3600)),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_go_duration(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn malformed_durations_are_refused_with_a_reason() {
        let cases = [
            ("", DurationError::Empty),
            ("-1h", DurationError::Signed),
            ("+1h", DurationError::Signed),
            ("10", DurationError::Malformed),
            ("h", DurationError::Malformed),
            (".h", DurationError::Malformed),
            ("1h 30m", DurationError::UnknownUnit),
            ("30d", DurationError::UnknownUnit),
            ("1month", DurationError::UnknownUnit),
            ("1H", DurationError::UnknownUnit),
            ("99999999999999999999999999999999999999999h", DurationError::Overflow),
            ("600000000h", DurationError::Overflow),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_go_duration(text), Err(expected), "{text}");
        }
    }
}
