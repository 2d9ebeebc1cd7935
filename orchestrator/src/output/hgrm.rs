//! `.hgrm` files: HdrHistogram's percentile distribution text, byte for byte
//! as Java HdrHistogram's `outputPercentileDistribution(out, 5, 1000.0)`
//! prints it, so HdrHistogram's plotter and other readers take them as is.
//!
//! Layout (values scaled: µs recorded / 1000 = ms):
//!
//! ```text
//!        Value     Percentile TotalCount 1/(1-Percentile)
//!
//!        0.981 0.000000000000          1           1.00
//!        ...
//!       21.007 1.000000000000       1000
//! #[Mean    =        6.433, StdDeviation   =        8.886]
//! #[Max     =       21.007, Total count    =         1000]
//! #[Buckets =            7, SubBuckets     =         2048]
//! ```
//!
//! Rows follow the percentile iterator (5 ticks per half distance to 100 %);
//! the last row, at percentile 1.0, has no `1/(1-Percentile)` column. Values
//! are the highest value equivalent to each bucket, the mean and standard
//! deviation use bucket midpoints, as in Java.
//!
//! One known difference: Rust rounds an exact halfway value to even where
//! Java's `%f` rounds it up. Values (whole µs at 3 decimals) and
//! `1/(1-Percentile)` at these ticks are never exactly halfway, so only a
//! mean or standard deviation could ever differ, in its last digit.

use std::fmt::Write as _;
use std::path::Path;

use hdrhistogram::Histogram;

use super::OutputError;

/// Percentile ticks per half distance to 100 %, Java's default.
pub const TICKS_PER_HALF_DISTANCE: u32 = 5;

/// Divides recorded microseconds into the file's milliseconds.
pub const US_PER_MS: f64 = 1000.0;

/// Writes `histogram` (µs) to `path` in milliseconds.
pub fn write_hgrm(path: &Path, histogram: &Histogram<u64>) -> Result<(), OutputError> {
    let text = format_percentile_distribution(histogram, TICKS_PER_HALF_DISTANCE, US_PER_MS);
    super::write_atomically(path, |out| std::io::Write::write_all(out, text.as_bytes()))
}

/// The percentile distribution text of `histogram`, values divided by
/// `scaling`. Empty histograms give the header and footer only, as in Java.
pub fn format_percentile_distribution(
    histogram: &Histogram<u64>,
    ticks_per_half_distance: u32,
    scaling: f64,
) -> String {
    let digits = usize::from(histogram.sigfig());
    let mut out = String::new();
    // Writing to a String cannot fail; `let _` keeps that visible.
    let _ = write!(
        out,
        "{:>12} {:>14} {:>10} {:>14}\n\n",
        "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
    );
    let mut total = 0u64;
    for v in histogram.iter_quantiles(ticks_per_half_distance) {
        total += v.count_since_last_iteration();
        let value = v.value_iterated_to() as f64 / scaling;
        let q = v.quantile_iterated_to();
        if q < 1.0 {
            let _ = writeln!(
                out,
                "{value:>12.digits$} {q:>2.12} {total:>10} {:>14.2}",
                1.0 / (1.0 - q)
            );
        } else {
            let _ = writeln!(out, "{value:>12.digits$} {q:>2.12} {total:>10}");
        }
    }
    let _ = writeln!(
        out,
        "#[Mean    = {:>12.digits$}, StdDeviation   = {:>12.digits$}]",
        histogram.mean() / scaling,
        histogram.stdev() / scaling
    );
    let max = if histogram.is_empty() {
        0
    } else {
        histogram.max()
    };
    let _ = writeln!(
        out,
        "#[Max     = {:>12.digits$}, Total count    = {:>12}]",
        max as f64 / scaling,
        histogram.len()
    );
    let _ = writeln!(
        out,
        "#[Buckets = {:>12}, SubBuckets     = {:>12}]",
        histogram.buckets(),
        sub_buckets(histogram)
    );
    out
}

/// Sub-buckets per bucket: the crate keeps this private, but its counts
/// array holds `(buckets + 1) * sub_buckets / 2` slots.
fn sub_buckets(histogram: &Histogram<u64>) -> usize {
    2 * histogram.distinct_values() / (usize::from(histogram.buckets()) + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::stats::{new_histogram, record_us};

    /// Java HdrHistogram's (and hdr-histogram-js's) documented output for
    /// 25, 50, 75 in a histogram of 1..2^53-1 at 3 digits, unscaled.
    const JAVA_25_50_75: &str = "       Value     Percentile TotalCount 1/(1-Percentile)

      25.000 0.000000000000          1           1.00
      25.000 0.100000000000          1           1.11
      25.000 0.200000000000          1           1.25
      25.000 0.300000000000          1           1.43
      50.000 0.400000000000          2           1.67
      50.000 0.500000000000          2           2.00
      50.000 0.550000000000          2           2.22
      50.000 0.600000000000          2           2.50
      50.000 0.650000000000          2           2.86
      75.000 0.700000000000          3           3.33
      75.000 1.000000000000          3
#[Mean    =       50.000, StdDeviation   =       20.412]
#[Max     =       75.000, Total count    =            3]
#[Buckets =           43, SubBuckets     =         2048]
";

    #[test]
    fn matches_the_reference_output_byte_for_byte() {
        let mut h = Histogram::<u64>::new_with_bounds(1, (1 << 53) - 1, 3).expect("valid bounds");
        for v in [25, 50, 75] {
            h.record(v).expect("in range");
        }
        assert_eq!(format_percentile_distribution(&h, 5, 1.0), JAVA_25_50_75);
    }

    /// A row: (value, percentile, total count, 1/(1-p) if present).
    type Row = (f64, f64, u64, Option<f64>);

    /// The rows and the footer lines of a distribution.
    fn parse(text: &str) -> (Vec<Row>, Vec<&str>) {
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some("       Value     Percentile TotalCount 1/(1-Percentile)")
        );
        assert_eq!(lines.next(), Some(""));
        let (mut rows, mut footer) = (Vec::new(), Vec::new());
        for line in lines {
            if line.starts_with("#[") {
                footer.push(line);
                continue;
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            let num = |s: &str| s.parse::<f64>().expect("numeric field");
            rows.push((
                num(f[0]),
                num(f[1]),
                f[2].parse().expect("integer count"),
                f.get(3).map(|s| num(s)),
            ));
        }
        (rows, footer)
    }

    #[test]
    fn latencies_read_back_in_milliseconds() {
        let mut h = new_histogram();
        for us in 1..=10_000 {
            record_us(&mut h, us);
        }
        let text = format_percentile_distribution(&h, TICKS_PER_HALF_DISTANCE, US_PER_MS);
        let (rows, footer) = parse(&text);
        assert!(rows.len() > 20);
        for pair in rows.windows(2) {
            assert!(pair[0].0 <= pair[1].0, "values not monotone: {pair:?}");
            assert!(pair[0].1 <= pair[1].1, "percentiles not monotone: {pair:?}");
            assert!(pair[0].2 <= pair[1].2, "counts not monotone: {pair:?}");
        }
        for row in &rows[..rows.len() - 1] {
            let inverse = row.3.expect("1/(1-p) on every row but the last");
            assert!((inverse - 1.0 / (1.0 - row.1)).abs() < 0.01 * inverse);
        }
        let last = rows.last().expect("rows");
        assert_eq!((last.1, last.2, last.3), (1.0, 10_000, None));
        assert!((last.0 - 10.0).abs() < 0.01, "max {} ms", last.0);
        let median = rows.iter().find(|r| r.1 == 0.5).expect("a 0.5 row");
        assert!((median.0 - 5.0).abs() < 0.005, "median {} ms", median.0);
        assert_eq!(footer.len(), 3);
        assert!(
            footer[1].ends_with("Total count    =        10000]"),
            "{}",
            footer[1]
        );
        assert!(
            footer[2].ends_with("SubBuckets     =         2048]"),
            "{}",
            footer[2]
        );
    }

    #[test]
    fn empty_histogram_has_header_and_footer_only() {
        let text = format_percentile_distribution(&new_histogram(), 5, US_PER_MS);
        let (rows, footer) = parse(&text);
        assert!(rows.is_empty());
        assert_eq!(
            footer[0],
            "#[Mean    =        0.000, StdDeviation   =        0.000]"
        );
        assert_eq!(
            footer[1],
            "#[Max     =        0.000, Total count    =            0]"
        );
    }

    #[test]
    fn writes_the_file_and_names_it_on_error() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut h = new_histogram();
        record_us(&mut h, 1_500);
        let path = dir.path().join("base.hgrm");
        write_hgrm(&path, &h).expect("written");
        let text = std::fs::read_to_string(&path).expect("readable");
        assert!(
            text.contains("       1.500 1.000000000000          1\n"),
            "{text}"
        );
        let bad = dir.path().join("missing").join("x.hgrm");
        let err = write_hgrm(&bad, &h).expect_err("no such folder");
        assert!(err.to_string().contains("missing/x.hgrm"), "{err}");
    }
}
