//! Seeded per-request draws.
//!
//! Every random decision a hop makes for a request (how long its work takes,
//! whether it is slowed, whether it fails) comes from a generator keyed on
//! (scenario seed, hop name, request id, attempt). The same seed therefore
//! gives the same fault schedule, whatever order requests arrive in and
//! whichever replica serves them, and two variants of a scenario (push and
//! pull, say) face exactly the same slow requests: common random numbers
//! make their comparison sharper.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp, LogNormal};

use crate::model::{DurationDist, HopBehavior, Work};

pub use tailmesh_model::MAX_DRAW;

/// A generator for one (seed, stream, key, attempt), stable across
/// platforms and releases (FNV-1a and SplitMix64, no std hasher).
pub fn keyed_rng(seed: u64, stream: &str, key: u64, attempt: u32) -> ChaCha8Rng {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in stream.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mixed = splitmix64(splitmix64(splitmix64(seed ^ h) ^ key) ^ u64::from(attempt));
    ChaCha8Rng::seed_from_u64(mixed)
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Draws one duration from `dist`.
pub fn sample(dist: &DurationDist, rng: &mut impl Rng) -> Duration {
    let secs = match dist {
        DurationDist::Fixed { value } => return (*value).min(MAX_DRAW),
        DurationDist::Uniform { min, max } => {
            if min >= max {
                return *min;
            }
            rng.random_range(min.as_secs_f64()..=max.as_secs_f64())
        }
        DurationDist::Exp { mean } => match Exp::new(1.0 / mean.as_secs_f64()) {
            Ok(exp) => exp.sample(rng),
            Err(_) => 0.0,
        },
        DurationDist::Lognormal { mean, sigma } => {
            // mean = exp(mu + sigma^2 / 2)
            let mu = mean.as_secs_f64().ln() - sigma * sigma / 2.0;
            match LogNormal::new(mu, *sigma) {
                Ok(ln) => ln.sample(rng),
                Err(_) => 0.0,
            }
        }
        DurationDist::Empirical { .. } => {
            let u: f64 = rng.random();
            return dist.empirical_quantile(u).unwrap_or_default().min(MAX_DRAW);
        }
    };
    if secs.is_finite() && secs > 0.0 {
        Duration::from_secs_f64(secs.min(MAX_DRAW.as_secs_f64()))
    } else {
        Duration::ZERO
    }
}

/// The work a hop does for one request, already scaled for a slow replica.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PlannedWork {
    /// Wait this long.
    Sleep(Duration),
    /// Hash the block this many times.
    Cpu {
        /// SHA-256 passes.
        rounds: u32,
        /// Bytes per pass.
        block_bytes: usize,
    },
}

/// Everything a hop decided about one request before doing it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Plan {
    pub work: PlannedWork,
    /// Injected extra delay, if this request is slowed here.
    pub slow: Option<Duration>,
    /// Injected error code, if this request fails here.
    pub error: Option<i32>,
}

/// Plans request `request_id` (attempt `attempt`) at replica `replica` of the
/// hop; `caller_slow` says whether the calling hop slowed this request with
/// its own injected slowness. The draws are made in a fixed order and
/// unconditionally, so changing one fault's probability does not shift the
/// others' schedules. The slowness coin is the same draw whoever called:
/// it is compared with `slow.follow` when the caller was slow (and `follow`
/// is set), with `slow.probability` otherwise, so a seed keeps its meaning.
pub fn plan(
    behavior: &HopBehavior,
    replica: u32,
    request_id: u64,
    attempt: u32,
    caller_slow: bool,
) -> Plan {
    let mut rng = keyed_rng(behavior.seed, &behavior.name, request_id, attempt);
    let factor = behavior
        .replica_slow
        .as_ref()
        .filter(|rs| rs.replica == replica)
        .map_or(1.0, |rs| rs.factor);

    let work = match &behavior.work {
        Work::None => PlannedWork::Sleep(Duration::ZERO),
        Work::Sleep { dist } => {
            let base = sample(dist, &mut rng);
            PlannedWork::Sleep(base.mul_f64(factor).min(MAX_DRAW))
        }
        Work::Cpu {
            min_rounds,
            max_rounds,
            block_bytes,
        } => {
            let base = rng.random_range(*min_rounds..=(*max_rounds).max(*min_rounds));
            let scaled = (f64::from(base) * factor).round().min(f64::from(u32::MAX));
            PlannedWork::Cpu {
                rounds: scaled as u32,
                block_bytes: *block_bytes,
            }
        }
    };

    let slow_coin: f64 = rng.random();
    let slow = behavior
        .slow
        .as_ref()
        .map(|s| (s, sample(&s.extra, &mut rng)));
    let error_coin: f64 = rng.random();

    Plan {
        work,
        slow: slow.and_then(|(s, extra)| (slow_coin < s.chance(caller_slow)).then_some(extra)),
        error: behavior
            .error
            .as_ref()
            .and_then(|e| (error_coin < e.probability).then_some(e.code)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ReplicaSlow, Slowness};

    fn behavior() -> HopBehavior {
        HopBehavior {
            name: "b".into(),
            seed: 7,
            work: Work::Sleep {
                dist: DurationDist::Exp {
                    mean: Duration::from_millis(1),
                },
            },
            slow: Some(Slowness {
                probability: 0.1,
                extra: DurationDist::Fixed {
                    value: Duration::from_millis(20),
                },
                follow: None,
            }),
            replica_slow: None,
            error: None,
        }
    }

    #[test]
    fn same_key_same_plan_other_key_other_plan() {
        let b = behavior();
        assert_eq!(
            plan(&b, 0, 42, 0, false),
            plan(&b, 1, 42, 0, false),
            "replica must not change the draw"
        );
        let plans: Vec<Plan> = (0..50).map(|id| plan(&b, 0, id, 0, false)).collect();
        let again: Vec<Plan> = (0..50).map(|id| plan(&b, 0, id, 0, false)).collect();
        assert_eq!(plans, again);
        assert_ne!(plan(&b, 0, 1, 0, false), plan(&b, 0, 2, 0, false));
        let mut other_seed = b.clone();
        other_seed.seed = 8;
        let differs =
            (0..50).any(|id| plan(&b, 0, id, 0, false) != plan(&other_seed, 0, id, 0, false));
        assert!(differs, "the seed must change the schedule");
    }

    #[test]
    fn slow_fraction_matches_probability() {
        let b = behavior();
        let n = 100_000u64;
        let slow = (0..n)
            .filter(|id| plan(&b, 0, *id, 0, false).slow.is_some())
            .count() as f64;
        // 5 standard deviations of a binomial(100000, 0.1): 0.0047.
        assert!(
            (slow / n as f64 - 0.1).abs() < 0.0047,
            "slow fraction {}",
            slow / n as f64
        );
    }

    #[test]
    fn a_follower_is_slowed_with_follow_after_a_slow_caller_and_probability_otherwise() {
        let mut b = behavior();
        if let Some(s) = &mut b.slow {
            s.follow = Some(0.9);
        }
        let n = 20_000u64;
        let share = |caller_slow: bool| {
            (0..n)
                .filter(|id| plan(&b, 0, *id, 0, caller_slow).slow.is_some())
                .count() as f64
                / n as f64
        };
        // 5 standard deviations of a binomial(20000, 0.9), as of one of
        // (20000, 0.1): 0.0106.
        let after_slow = share(true);
        assert!(
            (after_slow - 0.9).abs() < 0.0106,
            "after a slow caller: {after_slow}"
        );
        let otherwise = share(false);
        assert!((otherwise - 0.1).abs() < 0.0106, "otherwise: {otherwise}");
        // The same coin: every request slow on its own is slow after a slow
        // caller too (follow > probability), and the rest of the plan is
        // the same draw.
        for id in 0..1000 {
            let (alone, after) = (plan(&b, 0, id, 0, false), plan(&b, 0, id, 0, true));
            assert!(
                alone.slow.is_none() || after.slow == alone.slow,
                "request {id}"
            );
            assert_eq!((alone.work, alone.error), (after.work, after.error));
        }
        // Without `follow`, the caller changes nothing.
        let plain = behavior();
        assert!((0..1000).all(|id| plan(&plain, 0, id, 0, true) == plan(&plain, 0, id, 0, false)));
    }

    #[test]
    fn distributions_have_their_means() {
        let n = 200_000;
        let mut rng = keyed_rng(1, "t", 0, 0);
        for dist in [
            DurationDist::Exp {
                mean: Duration::from_millis(2),
            },
            DurationDist::Lognormal {
                mean: Duration::from_millis(2),
                sigma: 0.5,
            },
            DurationDist::Uniform {
                min: Duration::from_millis(1),
                max: Duration::from_millis(3),
            },
            // Halves uniform on 1-2 ms and 2-3 ms.
            DurationDist::Empirical {
                quantiles: vec![
                    (0.0, Duration::from_millis(1)),
                    (0.5, Duration::from_millis(2)),
                    (1.0, Duration::from_millis(3)),
                ],
            },
        ] {
            let total: f64 = (0..n).map(|_| sample(&dist, &mut rng).as_secs_f64()).sum();
            let mean = total / f64::from(n);
            assert!((mean - 0.002).abs() < 0.00005, "{dist:?}: mean {mean}");
        }
        assert_eq!(
            sample(
                &DurationDist::Fixed {
                    value: Duration::from_micros(250)
                },
                &mut rng
            ),
            Duration::from_micros(250)
        );
    }

    #[test]
    fn slow_replica_scales_work_only_on_that_replica() {
        let mut b = behavior();
        b.replica_slow = Some(ReplicaSlow {
            replica: 1,
            factor: 10.0,
        });
        let fast = plan(&b, 0, 5, 0, false);
        let slow = plan(&b, 1, 5, 0, false);
        match (fast.work, slow.work) {
            (PlannedWork::Sleep(f), PlannedWork::Sleep(s)) => {
                assert!(f > Duration::ZERO);
                let ratio = s.as_secs_f64() / f.as_secs_f64();
                assert!((ratio - 10.0).abs() < 1e-6, "ratio {ratio}");
            }
            other => panic!("unexpected work {other:?}"),
        }
        assert_eq!(fast.slow, slow.slow);
    }
}
