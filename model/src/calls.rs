//! How a hop calls its downstream hops once its own work is done: stages
//! one after another, each stage's calls side by side; a call made with a
//! probability, a number of times (fixed or drawn from weights), its
//! repeats one after another or together. Every request draws its own
//! calls (seeded), so its path through the mesh varies from request to
//! request. The default, a hop that calls every downstream hop once, side
//! by side, is one stage of plain calls ([`Calls::is_fixed`]).

use serde::{Deserialize, Serialize};

/// The most times one call may be repeated for one request.
pub const MAX_COUNT: u32 = 64;

/// The most hop visits one request may make, counts multiplied down the
/// tree at their largest: what sizes a reply's path records.
pub const MAX_VISITS: u64 = 1024;

/// One downstream call of a stage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Call {
    /// The hop called.
    pub hop: String,
    /// The share of requests that make the call, in (0, 1].
    #[serde(default = "one")]
    pub probability: f64,
    /// How many times it is made when it is.
    #[serde(default)]
    pub count: CallCount,
    /// How the repeats of a call made more than once run.
    #[serde(default)]
    pub repeats: Repeats,
}

fn one() -> f64 {
    1.0
}

impl Call {
    /// Hop `hop` called once on every request.
    pub fn once(hop: impl Into<String>) -> Call {
        Call {
            hop: hop.into(),
            probability: 1.0,
            count: CallCount::Fixed(1),
            repeats: Repeats::Sequential,
        }
    }

    /// Made on every request, exactly once.
    pub fn is_once(&self) -> bool {
        self.probability >= 1.0 && self.count == CallCount::Fixed(1)
    }

    /// How many times the call is made for one request, 0 included, with
    /// each number's probability.
    pub fn visits(&self) -> Vec<(u32, f64)> {
        let mut out = Vec::with_capacity(2);
        if self.probability < 1.0 {
            out.push((0, 1.0 - self.probability));
        }
        out.extend(
            self.count
                .weights()
                .into_iter()
                .map(|(n, p)| (n, p * self.probability)),
        );
        out
    }

    /// The calls made per request on average.
    pub fn mean(&self) -> f64 {
        self.probability * self.count.mean()
    }

    /// The number of calls made for one request, from two uniform draws in
    /// [0, 1): `made` decides whether the call is made at all, `which` how
    /// many times.
    pub fn count_for(&self, made: f64, which: f64) -> u32 {
        if made >= self.probability {
            return 0;
        }
        self.count.pick(which)
    }
}

/// How many times a call is made, when it is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallCount {
    /// Always this many, 1..=[`MAX_COUNT`].
    Fixed(u32),
    /// Each count with its weight (weights sum to 1), counts ascending.
    Weighted(Vec<(u32, f64)>),
}

impl Default for CallCount {
    fn default() -> Self {
        CallCount::Fixed(1)
    }
}

impl CallCount {
    /// The mean count.
    pub fn mean(&self) -> f64 {
        match self {
            CallCount::Fixed(n) => f64::from(*n),
            CallCount::Weighted(w) => w.iter().map(|(n, p)| f64::from(*n) * p).sum(),
        }
    }

    /// Each count with its probability.
    pub fn weights(&self) -> Vec<(u32, f64)> {
        match self {
            CallCount::Fixed(n) => vec![(*n, 1.0)],
            CallCount::Weighted(w) => w.clone(),
        }
    }

    /// The count at the uniform draw `u` in [0, 1).
    pub fn pick(&self, u: f64) -> u32 {
        match self {
            CallCount::Fixed(n) => *n,
            CallCount::Weighted(w) => weighted_index(w.iter().map(|(_, p)| *p), u)
                .and_then(|k| w.get(k))
                .map_or(1, |(n, _)| *n),
        }
    }
}

/// How the repeats of one call run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Repeats {
    /// One after another, each once the one before answered.
    #[default]
    Sequential,
    /// All at once.
    Parallel,
}

impl Repeats {
    pub fn as_str(self) -> &'static str {
        match self {
            Repeats::Sequential => "sequential",
            Repeats::Parallel => "parallel",
        }
    }
}

/// A hop's calls: stages run one after another, each stage's calls side
/// by side.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Calls {
    pub stages: Vec<Vec<Call>>,
}

impl Calls {
    /// One stage calling each of `hops` once.
    pub fn all_once<S: Into<String>>(hops: impl IntoIterator<Item = S>) -> Calls {
        let stage: Vec<Call> = hops.into_iter().map(Call::once).collect();
        Calls {
            stages: if stage.is_empty() {
                Vec::new()
            } else {
                vec![stage]
            },
        }
    }

    /// Whether every request makes the same calls: one stage (or none),
    /// each hop in it called once. The path of a request is then the same
    /// tree every time, which the compounding check and the per-request
    /// rows of the composition need.
    pub fn is_fixed(&self) -> bool {
        self.stages.len() <= 1 && self.stages.iter().flatten().all(Call::is_once)
    }

    /// Every call, stage by stage.
    pub fn iter(&self) -> impl Iterator<Item = &Call> {
        self.stages.iter().flatten()
    }

    /// The hops called, each once, in the order first called.
    pub fn hops(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for c in self.iter() {
            if !out.contains(&c.hop) {
                out.push(c.hop.clone());
            }
        }
        out
    }

    /// The calls of `hop` made per request on average, over every stage.
    pub fn mean_calls_of(&self, hop: &str) -> f64 {
        self.iter().filter(|c| c.hop == hop).map(Call::mean).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.stages.iter().all(Vec::is_empty)
    }
}

/// Where `u` (in [0, 1)) falls among `shares` laid end to end: the index
/// of the share it falls in, the last one past their sum (rounding);
/// `None` without any.
pub fn weighted_index(shares: impl IntoIterator<Item = f64>, u: f64) -> Option<usize> {
    let mut sum = 0.0;
    let mut last = None;
    for (k, share) in shares.into_iter().enumerate() {
        sum += share;
        last = Some(k);
        if u < sum {
            break;
        }
    }
    last
}

/// The most hops one invocation of hop `i` can visit, itself included
/// (saturating), in an acyclic mesh whose hop `j` makes `calls(j)`;
/// `memo` holds each hop's once known.
pub fn most_visits<'a>(
    i: usize,
    calls: &dyn Fn(usize) -> &'a Calls,
    index: &dyn Fn(&str) -> Option<usize>,
    memo: &mut [Option<u64>],
) -> u64 {
    if let Some(v) = memo[i] {
        return v;
    }
    let mut v: u64 = 1;
    for c in calls(i).iter() {
        let most = c.count.weights().iter().map(|(n, _)| *n).max().unwrap_or(1);
        let below = index(&c.hop).map_or(1, |j| most_visits(j, calls, index, memo));
        v = v.saturating_add(u64::from(most).saturating_mul(below));
    }
    memo[i] = Some(v);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_weighted_count_is_picked_by_its_cumulative_weights() {
        let c = Call {
            count: CallCount::Weighted(vec![(1, 0.5), (2, 0.3), (4, 0.2)]),
            probability: 0.6,
            ..Call::once("b")
        };
        assert_eq!(
            [0.0, 0.49, 0.5, 0.79, 0.8, 0.999].map(|u| c.count.pick(u)),
            [1, 1, 2, 2, 4, 4]
        );
        assert_eq!((c.count_for(0.6, 0.0), c.count_for(0.59, 0.9)), (0, 4));
        let visits = c.visits();
        assert_eq!(
            visits.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            [0, 1, 2, 4]
        );
        let want = [0.4, 0.3, 0.18, 0.12];
        assert!(
            visits
                .iter()
                .zip(want)
                .all(|((_, p), w)| (p - w).abs() < 1e-12)
        );
        assert!((c.mean() - 0.6 * (0.5 + 0.6 + 0.8)).abs() < 1e-12);
    }

    #[test]
    fn only_one_stage_of_single_calls_is_a_fixed_path() {
        assert!(Calls::all_once(["b", "c"]).is_fixed());
        assert!(Calls::default().is_fixed());
        let two_stages = Calls {
            stages: vec![vec![Call::once("b")], vec![Call::once("c")]],
        };
        assert!(!two_stages.is_fixed());
        let maybe = Calls {
            stages: vec![vec![Call {
                probability: 0.5,
                ..Call::once("b")
            }]],
        };
        assert!(!maybe.is_fixed());
        assert_eq!(two_stages.hops(), ["b", "c"]);
    }
}
