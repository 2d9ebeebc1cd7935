//! Independence reached another way: a seeded uniform reservoir of the
//! run's rows, and requests recomposed from columns drawn from different
//! rows, sorted, with each column's mean over the slowest 1 %.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::segments::{PER_HOP, Tree, recompose};

/// Requests the reservoir keeps for the shuffled estimate and the
/// correlations (a uniform sample of the run's ok requests), at most: a
/// row holds 1 + 5 values per hop, and the reservoir at most
/// [`RESERVOIR_VALUES`] (20 000 rows of a 3-hop chain, 6 000 of 64 hops:
/// 16 MB).
pub(super) const RESERVOIR: usize = 20_000;
pub(super) const RESERVOIR_VALUES: usize = 2_000_000;

/// Requests drawn for the shuffled estimate, at most, and the values they
/// draw at most (a 64-hop row draws 321).
pub(super) const SHUFFLED: usize = 200_000;
pub(super) const SHUFFLED_VALUES: usize = 20_000_000;

/// A uniform sample of the run's rows (Vitter's algorithm R), seeded.
pub(super) struct Reservoir {
    pub(super) rows: Vec<Vec<u64>>,
    /// The most rows it keeps.
    pub(super) size: usize,
    pub(super) seen: u64,
    pub(super) rng: ChaCha8Rng,
}

impl Reservoir {
    /// An empty reservoir for rows of `hops` hops, seeded.
    pub(super) fn for_hops(hops: usize) -> Reservoir {
        Reservoir {
            rows: Vec::new(),
            size: RESERVOIR.min(RESERVOIR_VALUES / (1 + PER_HOP * hops)),
            seen: 0,
            rng: ChaCha8Rng::seed_from_u64(0x636f_6d70),
        }
    }

    pub(super) fn offer(&mut self, row: impl FnOnce() -> Vec<u64>) {
        self.seen += 1;
        if self.rows.len() < self.size {
            self.rows.push(row());
            return;
        }
        let at = self.rng.random_range(0..self.seen);
        if let Ok(at) = usize::try_from(at)
            && at < self.size
        {
            self.rows[at] = row();
        }
    }
}

/// The shuffled requests' latencies (ns, sorted) and each column's mean
/// over the slowest 1 % of them (µs).
pub(super) struct Shuffled {
    pub(super) sorted: Vec<u64>,
    pub(super) tail_mean: Vec<f64>,
}

impl Shuffled {
    /// The quantile `q` (µs) of all requests, the censored share last.
    pub(super) fn quantile(&self, q: f64, censored: f64) -> Option<f64> {
        let within = q / (1.0 - censored);
        if within > 1.0 || self.sorted.is_empty() {
            return None;
        }
        let k =
            ((within * self.sorted.len() as f64).ceil() as usize).clamp(1, self.sorted.len()) - 1;
        Some(self.sorted[k] as f64 / 1_000.0)
    }
}

/// The shuffled estimate from the reservoir's `rows`; `None` when it is
/// empty.
/// Each synthetic request takes every column from a request drawn
/// apart. Two passes over the same seeded draws: the latencies, then
/// the columns' means over the slowest 1 % (so no synthetic row is
/// kept).
pub(super) fn shuffle(tree: &Tree, rows: &[Vec<u64>]) -> Option<Shuffled> {
    let width = rows.first()?.len();
    let draws = SHUFFLED.min(SHUFFLED_VALUES / width).max(rows.len());
    let synthetic = |rng: &mut ChaCha8Rng, row: &mut Vec<u64>| {
        row.clear();
        row.extend((0..width).map(|c| rows[rng.random_range(0..rows.len())][c]));
    };
    let mut row = Vec::with_capacity(width);
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let mut sorted: Vec<u64> = (0..draws)
        .map(|_| {
            synthetic(&mut rng, &mut row);
            recompose(tree, &row)
        })
        .collect();
    sorted.sort_unstable();
    let tail_from = sorted[draws - (draws / 100).max(1)];
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let (mut sums, mut count) = (vec![0.0; width], 0usize);
    for _ in 0..draws {
        synthetic(&mut rng, &mut row);
        if recompose(tree, &row) >= tail_from {
            count += 1;
            for (s, v) in sums.iter_mut().zip(&row) {
                *s += *v as f64;
            }
        }
    }
    let tail_mean = sums
        .iter()
        .map(|s| s / count.max(1) as f64 / 1_000.0)
        .collect();
    Some(Shuffled { sorted, tail_mean })
}
