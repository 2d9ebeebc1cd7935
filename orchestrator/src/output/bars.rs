//! Latency histograms for the terminal, one bucket per line with a bar, as
//! back-to-back's study printed them: the shape of a distribution at a
//! glance, beside the percentile table.

use hdrhistogram::Histogram;

use tailmesh_units::micros;

/// Most bucket lines before the overflow line.
const MAX_BUCKETS: u64 = 24;
/// Width of the longest bar.
const BAR_WIDTH: u64 = 50;

/// Renders `histogram` (microseconds) under a `title` line. Buckets have a
/// round width (1, 2 or 5 times a power of ten) chosen so that up to p99.9
/// fits in `MAX_BUCKETS` lines; slower values share a last `>` line.
pub fn render_histogram(title: &str, histogram: &Histogram<u64>) -> String {
    let mut out = format!("{title}\n");
    if histogram.is_empty() {
        out.push_str("  (no successful requests)\n");
        return out;
    }
    let top = histogram.value_at_quantile(0.999).max(1);
    let width = bucket_width(top);
    let mut counts = vec![0u64; MAX_BUCKETS as usize + 1];
    for v in histogram.iter_recorded() {
        let bucket = (v.value_iterated_to() / width).min(MAX_BUCKETS) as usize;
        counts[bucket] += v.count_since_last_iteration();
    }
    let last = counts.iter().rposition(|c| *c > 0).unwrap_or(0);
    let most = counts.iter().copied().max().unwrap_or(1).max(1);
    for (i, count) in counts.iter().enumerate().take(last + 1) {
        let i = i as u64;
        let label = if i == MAX_BUCKETS {
            format!(">{}", micros((i * width) as f64))
        } else {
            format!("<{}", micros(((i + 1) * width) as f64))
        };
        let bar = "#".repeat(((count * BAR_WIDTH).div_ceil(most)) as usize);
        out.push_str(&format!("  {label:>10} | {bar:<50} {count}\n"));
    }
    out
}

/// The smallest 1/2/5 x 10^k microseconds that covers `top` in at most
/// [`MAX_BUCKETS`] buckets.
fn bucket_width(top: u64) -> u64 {
    let mut scale = 1u64;
    loop {
        for step in [1, 2, 5] {
            let width = step * scale;
            if top.div_ceil(width) <= MAX_BUCKETS {
                return width;
            }
        }
        scale = scale.saturating_mul(10);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::stats::{new_histogram, record_us};

    #[test]
    fn widths_are_round_and_cover_the_top() {
        assert_eq!(bucket_width(1), 1);
        assert_eq!(bucket_width(24), 1);
        assert_eq!(bucket_width(25), 2);
        assert_eq!(bucket_width(48_000), 2_000);
        assert_eq!(bucket_width(100_000), 5_000);
    }

    #[test]
    fn one_line_per_bucket_with_counts_and_a_scaled_bar() {
        let mut h = new_histogram();
        for _ in 0..1000 {
            record_us(&mut h, 1_500);
        }
        for _ in 0..500 {
            record_us(&mut h, 3_500);
        }
        record_us(&mut h, 9_999_000);
        let text = render_histogram("base", &h);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "base");
        let with_count = |n: &str| {
            lines
                .iter()
                .find(|l| l.ends_with(&format!(" {n}")))
                .copied()
        };
        let full = with_count("1000").unwrap_or_else(|| panic!("no 1000 line in\n{text}"));
        let half = with_count("500").unwrap_or_else(|| panic!("no 500 line in\n{text}"));
        assert_eq!(full.matches('#').count(), 50, "{text}");
        assert_eq!(half.matches('#').count(), 25, "{text}");
        assert!(
            lines
                .last()
                .is_some_and(|l| l.contains('>') && l.ends_with(" 1")),
            "{text}"
        );
        let total: u64 = lines[1..]
            .iter()
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum();
        assert_eq!(total, 1501, "{text}");
    }

    #[test]
    fn empty_histograms_say_so() {
        assert!(render_histogram("x", &new_histogram()).contains("no successful requests"));
    }
}
