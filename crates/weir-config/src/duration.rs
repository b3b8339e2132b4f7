//! Parsing and formatting of durations in Flink's `TimeUtils.parseDuration` syntax.
//!
//! A duration is a whole number, optional whitespace and an optional unit (`500ms`, `10 s`,
//! `1min`, `2h`). Without a unit the number means milliseconds, as in Flink.

use std::time::Duration;

/// Short description of the accepted duration forms, appended to every parse error.
pub const DURATION_FORMS: &str = "expected a duration such as '500ms', '10s', '1min' or '2h' \
     (a whole number with an optional unit: d, h, min, s, ms, us, ns; no unit means milliseconds)";

/// The units a duration may carry, in nanoseconds per unit, with every accepted label.
///
/// Labels are matched after lowercasing, so `10S` and `10 Seconds` work like Flink.
const UNITS: &[(u64, &[&str])] = &[
    (86_400_000_000_000, &["d", "day", "days"]),
    (3_600_000_000_000, &["h", "hour", "hours"]),
    (60_000_000_000, &["min", "m", "minute", "minutes"]),
    (1_000_000_000, &["s", "sec", "secs", "second", "seconds"]),
    (1_000_000, &["ms", "milli", "millis", "millisecond", "milliseconds"]),
    (1_000, &["us", "\u{b5}s", "\u{3bc}s", "micro", "micros", "microsecond", "microseconds"]),
    (1, &["ns", "nano", "nanos", "nanosecond", "nanoseconds"]),
];

/// Parses a duration the way Flink's `TimeUtils.parseDuration` does.
///
/// Accepts a whole number followed by optional whitespace and a case-insensitive unit
/// (`d`, `h`, `min`/`m`, `s`, `ms`, `us`/`µs`, `ns` and their long forms such as `seconds`).
/// A bare number means milliseconds. Negative numbers, fractions, empty text, unknown units
/// and values too large to represent are errors; the error text lists the accepted forms.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(format!("the duration is empty; {DURATION_FORMS}"));
    }

    let digits_end = trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len());
    let (number, rest) = trimmed.split_at(digits_end);
    if number.is_empty() {
        return Err(format!("the duration does not start with a number; {DURATION_FORMS}"));
    }
    let Ok(value) = number.parse::<u64>() else {
        return Err(format!("the number '{number}' is too large; {DURATION_FORMS}"));
    };

    let label = rest.trim().to_lowercase();
    if label.is_empty() {
        return Ok(Duration::from_millis(value));
    }
    let Some(nanos_per_unit) = unit_for_label(&label) else {
        return Err(format!("unknown time unit '{label}'; {DURATION_FORMS}"));
    };
    let Some(duration) = scale(value, nanos_per_unit) else {
        return Err(format!("the duration '{trimmed}' is too large; {DURATION_FORMS}"));
    };
    Ok(duration)
}

/// Formats a duration compactly in the largest unit that represents it exactly.
///
/// Produces forms like `200ms`, `10s`, `1min`, `2h` or `3d`; sub-millisecond durations use
/// `us` or `ns`. The result parses back with [`parse_duration`] to the same duration
/// (for durations below roughly 584 years, the range of a 64-bit nanosecond count).
pub fn format_duration(duration: Duration) -> String {
    if duration.is_zero() {
        return "0ms".to_string();
    }
    let total_nanos = duration.as_nanos();
    for (label, nanos_per_unit) in [
        ("d", 86_400_000_000_000u128),
        ("h", 3_600_000_000_000),
        ("min", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
    ] {
        if total_nanos.is_multiple_of(nanos_per_unit) {
            return format!("{}{label}", total_nanos / nanos_per_unit);
        }
    }
    format!("{total_nanos}ns")
}

/// Returns the number of nanoseconds per unit for a lowercased unit label.
fn unit_for_label(label: &str) -> Option<u64> {
    for (nanos_per_unit, labels) in UNITS {
        if labels.contains(&label) {
            return Some(*nanos_per_unit);
        }
    }
    None
}

/// Multiplies `value` units of `nanos_per_unit` nanoseconds without overflowing.
fn scale(value: u64, nanos_per_unit: u64) -> Option<Duration> {
    const NANOS_PER_SECOND: u64 = 1_000_000_000;
    if nanos_per_unit >= NANOS_PER_SECOND {
        // Whole seconds per unit: multiply in seconds so large values stay exact.
        let seconds = value.checked_mul(nanos_per_unit / NANOS_PER_SECOND)?;
        return Some(Duration::from_secs(seconds));
    }
    let units_per_second = NANOS_PER_SECOND / nanos_per_unit;
    let seconds = value / units_per_second;
    let subsecond_nanos = (value % units_per_second) * nanos_per_unit;
    // `subsecond_nanos` is below one second, so the cast cannot truncate.
    Some(Duration::new(seconds, subsecond_nanos as u32))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ok(text: &str) -> Duration {
        match parse_duration(text) {
            Ok(duration) => duration,
            Err(message) => panic!("'{text}' should parse but failed: {message}"),
        }
    }

    #[test]
    fn parses_flink_examples() {
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("10 s"), Duration::from_secs(10));
        assert_eq!(ok("1min"), Duration::from_secs(60));
        assert_eq!(ok("2h"), Duration::from_secs(7200));
        assert_eq!(ok("3d"), Duration::from_secs(3 * 86_400));
        assert_eq!(ok("123"), Duration::from_millis(123));
        assert_eq!(ok("  7   seconds  "), Duration::from_secs(7));
        assert_eq!(ok("0"), Duration::ZERO);
    }

    #[test]
    fn every_unit_label_is_accepted_case_insensitively() {
        let cases: &[(&str, Duration)] = &[
            ("1d", Duration::from_secs(86_400)),
            ("1 day", Duration::from_secs(86_400)),
            ("2 DAYS", Duration::from_secs(2 * 86_400)),
            ("1H", Duration::from_secs(3600)),
            ("1hour", Duration::from_secs(3600)),
            ("2hours", Duration::from_secs(7200)),
            ("1m", Duration::from_secs(60)),
            ("1MIN", Duration::from_secs(60)),
            ("1minute", Duration::from_secs(60)),
            ("2minutes", Duration::from_secs(120)),
            ("1sec", Duration::from_secs(1)),
            ("2secs", Duration::from_secs(2)),
            ("1second", Duration::from_secs(1)),
            ("1milli", Duration::from_millis(1)),
            ("2millis", Duration::from_millis(2)),
            ("1millisecond", Duration::from_millis(1)),
            ("2milliseconds", Duration::from_millis(2)),
            ("3us", Duration::from_micros(3)),
            ("3\u{b5}s", Duration::from_micros(3)),
            ("3micro", Duration::from_micros(3)),
            ("3micros", Duration::from_micros(3)),
            ("3microsecond", Duration::from_micros(3)),
            ("3microseconds", Duration::from_micros(3)),
            ("4ns", Duration::from_nanos(4)),
            ("4nano", Duration::from_nanos(4)),
            ("4nanos", Duration::from_nanos(4)),
            ("4nanosecond", Duration::from_nanos(4)),
            ("4NanoSeconds", Duration::from_nanos(4)),
        ];
        for (text, expected) in cases {
            assert_eq!(ok(text), *expected, "{text}");
        }
    }

    #[test]
    fn large_sub_second_values_carry_into_seconds() {
        assert_eq!(ok("2500ms"), Duration::from_millis(2500));
        assert_eq!(ok("18446744073709551615ns"), Duration::from_nanos(u64::MAX));
        assert_eq!(ok("18446744073709551615ms"), Duration::from_millis(u64::MAX));
    }

    #[test]
    fn rejects_bad_input_with_the_accepted_forms() {
        for text in ["", "   ", "-5s", "abc", "1.5s", "10 parsecs", "5 s s", "+5s"] {
            let err = parse_duration(text).expect_err(text);
            assert!(err.contains("expected a duration"), "{text}: {err}");
        }
        let err = parse_duration("10 parsecs").unwrap_err();
        assert!(err.contains("unknown time unit 'parsecs'"), "{err}");
    }

    #[test]
    fn rejects_overflow() {
        let err = parse_duration("99999999999999999999999s").unwrap_err();
        assert!(err.contains("too large"), "{err}");
        let err = parse_duration("18446744073709551615d").unwrap_err();
        assert!(err.contains("too large"), "{err}");
    }

    #[test]
    fn formats_compactly() {
        assert_eq!(format_duration(Duration::from_millis(200)), "200ms");
        assert_eq!(format_duration(Duration::from_secs(10)), "10s");
        assert_eq!(format_duration(Duration::from_secs(60)), "1min");
        assert_eq!(format_duration(Duration::from_secs(600)), "10min");
        assert_eq!(format_duration(Duration::from_secs(7200)), "2h");
        assert_eq!(format_duration(Duration::from_secs(86_400)), "1d");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format_duration(Duration::from_micros(7)), "7us");
        assert_eq!(format_duration(Duration::from_nanos(1_000_001)), "1000001ns");
        assert_eq!(format_duration(Duration::ZERO), "0ms");
    }

    proptest! {
        #[test]
        fn format_then_parse_round_trips(seconds in 0u64..10_000_000_000, nanos in 0u32..1_000_000_000) {
            let duration = Duration::new(seconds, nanos);
            let text = format_duration(duration);
            prop_assert_eq!(parse_duration(&text), Ok(duration), "formatted as {}", text);
        }

        #[test]
        fn whole_units_round_trip(value in 0u64..100_000, unit in 0usize..7) {
            let nanos_per_unit = UNITS[unit].0;
            let duration = Duration::from_nanos(value * nanos_per_unit);
            let text = format_duration(duration);
            prop_assert_eq!(parse_duration(&text), Ok(duration), "formatted as {}", text);
        }

        #[test]
        fn parse_never_panics(text in "\\PC{0,20}") {
            let _ = parse_duration(&text);
        }
    }
}
