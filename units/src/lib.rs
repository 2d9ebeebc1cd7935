//! Units shared by every tailmesh crate, so a latency reads the same in the
//! terminal, report.html, an error message and a log line, and "now" means
//! the same thing in every process of a run.
//!
//! - [`duration`] and [`micros`]: a duration for people (`10.0 s`,
//!   `1.32 ms`, `87 us`), three significant digits.
//! - [`percent`] and [`signed_percent`]: a share for people (`27.1 %`,
//!   `0.05 %`, `+31 %`).
//! - [`nanos`] and [`unix_nanos`]: durations and wall-clock instants as
//!   integer nanoseconds, the unit of every wire field and record.
//!
//! No dependency, no I/O beyond reading the system clock in [`unix_nanos`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A duration for people and a unit after a space: whole nanoseconds and
/// microseconds from 10 us (`158 ns`, `87 us`, `8.75 us`), three
/// significant digits from a millisecond (`1.32 ms`, `132 ms`, `10.0 s`,
/// `1500 s`). A value that rounds up into the next unit is written in it
/// (`999.96 us` -> `1.00 ms`).
pub fn duration(d: Duration) -> String {
    seconds(d.as_secs_f64())
}

/// Microseconds (a histogram's unit) as [`duration`] writes them.
pub fn micros(us: f64) -> String {
    seconds(us / 1e6)
}

fn seconds(secs: f64) -> String {
    if !secs.is_finite() {
        return format!("{secs} s");
    }
    if secs < 0.0 {
        return format!("-{}", seconds(-secs));
    }
    if secs == 0.0 {
        return "0 s".to_string();
    }
    const UNITS: [(&str, f64); 4] = [("ns", 1e-9), ("us", 1e-6), ("ms", 1e-3), ("s", 1.0)];
    let mut unit = UNITS
        .iter()
        .rposition(|&(_, scale)| secs >= scale)
        .unwrap_or(0);
    loop {
        let (name, scale) = UNITS[unit];
        let value = secs / scale;
        let text = if name == "ns" || (name == "us" && value >= 9.5) {
            // Below a millisecond, the histograms' unit: whole numbers.
            format!("{value:.0}")
        } else {
            three_digits(value)
        };
        // Rounding can carry into the next unit: 999.96 us is 1.00 ms.
        if unit + 1 < UNITS.len() && text.parse::<f64>().is_ok_and(|v| v >= 1000.0) {
            unit += 1;
            continue;
        }
        return format!("{text} {name}");
    }
}

/// `value` (0 < value) with three significant digits, never fewer digits
/// than its integer part: `1.32`, `13.2`, `132`, `1500`.
fn three_digits(value: f64) -> String {
    // The band is the rounded value's: 9.996 is "10.0", 99.96 is "100".
    let decimals = if value >= 99.95 {
        0
    } else if value >= 9.995 {
        1
    } else {
        2
    };
    format!("{value:.decimals$}")
}

/// A share (0.271) as a percentage with the digits that tell it from its
/// neighbours: `100 %`, `27.1 %`, `1.50 %`, `0.05 %`, `0.0012 %`, `0 %`.
pub fn percent(share: f64) -> String {
    format!("{} %", percent_number(share))
}

/// [`percent`] with its sign, for a change: `+31.0 %`, `-4.50 %`, `+0 %`.
pub fn signed_percent(change: f64) -> String {
    let sign = if change < 0.0 { "-" } else { "+" };
    format!("{sign}{} %", percent_number(change.abs()))
}

fn percent_number(share: f64) -> String {
    let p = share * 100.0;
    if !p.is_finite() {
        return format!("{p}");
    }
    if p == 0.0 {
        return "0".to_string();
    }
    // The band is the rounded value's: 9.9999 % is "10.0", not "10.00".
    let magnitude = p.abs();
    if magnitude >= 99.95 {
        format!("{p:.0}")
    } else if magnitude >= 9.995 {
        format!("{p:.1}")
    } else if magnitude >= 0.9995 {
        format!("{p:.2}")
    } else {
        // Two significant digits below 1 %: 0.05, 0.012, 0.0012.
        let decimals = (1.0 - magnitude.log10().floor()).clamp(2.0, 9.0) as usize;
        let text = format!("{p:.decimals$}");
        if text.contains('.') {
            text.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            text
        }
    }
}

/// A duration in whole nanoseconds, saturating at `u64::MAX` (584 years).
pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `at` in nanoseconds since the Unix epoch (0 for a time before it).
pub fn unix_nanos_at(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map(nanos).unwrap_or(0)
}

/// Now, in nanoseconds since the Unix epoch: the clock of every wire
/// field, record and span a tailmesh process writes.
pub fn unix_nanos() -> u64 {
    unix_nanos_at(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_with_three_digits_and_a_unit() {
        let cases = [
            (Duration::from_nanos(158), "158 ns"),
            (Duration::from_micros(87), "87 us"),
            (Duration::from_nanos(8_750), "8.75 us"),
            (Duration::from_nanos(999_600), "1.00 ms"),
            (Duration::from_micros(1_320), "1.32 ms"),
            (Duration::from_millis(132), "132 ms"),
            (Duration::from_secs(10), "10.0 s"),
            (Duration::from_secs(1500), "1500 s"),
            (Duration::from_nanos(999_960), "1.00 ms"),
            (Duration::from_nanos(999_999_999), "1.00 s"),
            (Duration::ZERO, "0 s"),
            (Duration::from_nanos(99_960_000), "100 ms"),
            (Duration::from_nanos(9_996_000), "10.0 ms"),
            (Duration::from_nanos(9_600), "10 us"),
            (Duration::new(10, 1_320_158), "10.0 s"),
        ];
        for (d, want) in cases {
            assert_eq!(duration(d), want, "{d:?}");
        }
        assert_eq!(micros(1320.0), "1.32 ms");
        assert_eq!(micros(-1320.0), "-1.32 ms");
    }

    #[test]
    fn shares_keep_the_digits_that_tell_them_apart() {
        let cases = [
            (1.0, "100 %"),
            (0.271, "27.1 %"),
            (0.015, "1.50 %"),
            (0.0005, "0.05 %"),
            (0.000012, "0.0012 %"),
            (0.00123, "0.12 %"),
            (0.0, "0 %"),
            (0.09999999999999998, "10.0 %"),
            (0.99996, "100 %"),
            (0.0099999, "1.00 %"),
        ];
        for (share, want) in cases {
            assert_eq!(percent(share), want, "{share}");
        }
        assert_eq!(signed_percent(0.31), "+31.0 %");
        assert_eq!(signed_percent(-0.045), "-4.50 %");
        assert_eq!(signed_percent(0.0), "+0 %");
    }

    #[test]
    fn nanoseconds_saturate_and_the_epoch_is_zero() {
        assert_eq!(nanos(Duration::from_micros(3)), 3_000);
        assert_eq!(nanos(Duration::MAX), u64::MAX);
        assert_eq!(unix_nanos_at(UNIX_EPOCH), 0);
        assert_eq!(
            unix_nanos_at(UNIX_EPOCH + Duration::from_secs(2)),
            2_000_000_000
        );
        assert!(unix_nanos() > 1_700_000_000_000_000_000);
    }
}
