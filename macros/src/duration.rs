//! Durations written in attributes (`wait = "5s"`), read at compile time,
//! so that a typo is an error at the literal rather than at run time.
//!
//! The grammar is deliberately small: a whole number (underscores allowed)
//! and one unit of `ms`, `s`, `m` or `h`. Leases and waits are counted in
//! milliseconds by Redis and by the lock, so nothing finer is offered.

use std::time::Duration;

/// The units, longest suffix first so that `ms` is not read as `m` + `s`.
const UNITS: &[(&str, u64)] = &[("ms", 1), ("s", 1_000), ("m", 60_000), ("h", 3_600_000)];

/// What a bad duration is told, after its text.
pub(crate) const GRAMMAR: &str =
    "write a whole number and a unit: \"250ms\", \"5s\", \"2m\" or \"1h\"";

/// Reads `text` as a duration, or says why it is not one.
pub(crate) fn parse(text: &str) -> Result<Duration, String> {
    let digits_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '_'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    let number: String = number.chars().filter(|c| *c != '_').collect();
    if number.is_empty() {
        return Err(format!("{text:?} is not a duration: {GRAMMAR}"));
    }
    let Some((_, millis_per_unit)) = UNITS.iter().find(|(name, _)| *name == unit) else {
        return Err(if unit.is_empty() {
            format!("{text:?} has no unit: {GRAMMAR}")
        } else {
            format!("{text:?} is not a duration (unknown unit {unit:?}): {GRAMMAR}")
        });
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(*millis_per_unit))
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long a duration"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_is_read() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3_600)));
        assert_eq!(parse("1_500ms"), Ok(Duration::from_millis(1_500)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn anything_else_is_refused_with_the_grammar() {
        for bad in [
            "", "5", "s", "5 s", "5sec", "1.5s", "-1s", "5S", " 5s", "5s ", "1h30m",
        ] {
            let error = parse(bad).unwrap_err();
            assert!(error.contains(GRAMMAR), "{bad:?}: {error}");
        }
    }

    #[test]
    fn a_number_past_u64_milliseconds_is_refused() {
        assert!(parse("18446744073709551615ms").is_ok());
        assert!(parse("18446744073709551615s")
            .unwrap_err()
            .contains("too long"));
        assert!(parse("99999999999999999999999ms")
            .unwrap_err()
            .contains("too long"));
    }
}
