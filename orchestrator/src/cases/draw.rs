//! What each case injects: a fault kind, a target (a hop, one of its
//! replicas or its link) and a window, drawn from a seed, and the scenario
//! a case runs: the steady mesh with that one fault. Pure: no I/O.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tailmesh_model::scenario::{
    Hop, KeepShare, Kill, Launcher, LoadMode, NetFault, ReplicaNet, Scenario, Stop, Variant, Window,
};
use tailmesh_model::{DurationDist, ErrorInjection, ReplicaSlow, Slowness};

/// A fault kind a case can inject: the scenario's own fault keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// `slow`: a share of the hop's requests delayed.
    Slow,
    /// `replica_slow`: one replica's work multiplied.
    ReplicaSlow,
    /// `error`: a share of the hop's requests answered with an error.
    Error,
    /// `net` / `replica_net` loss on the hop's (or a replica's) link.
    Loss,
    /// `net` / `replica_net` delay on the hop's (or a replica's) link.
    Delay,
    /// `kill`: a replica stopped, started again when the window ends.
    Kill,
}

impl Kind {
    /// Every kind, in the order tables show them.
    pub const ALL: [Kind; 6] = [
        Kind::Slow,
        Kind::ReplicaSlow,
        Kind::Error,
        Kind::Loss,
        Kind::Delay,
        Kind::Kill,
    ];

    /// The name on the command line and in files.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Slow => "slow",
            Kind::ReplicaSlow => "replica_slow",
            Kind::Error => "error",
            Kind::Loss => "loss",
            Kind::Delay => "delay",
            Kind::Kill => "kill",
        }
    }

    /// The kind `name` names.
    pub fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// Whether it is a network fault, which needs the netns launcher.
    pub fn is_network(self) -> bool {
        matches!(self, Kind::Loss | Kind::Delay)
    }
}

/// One case's fault, as `label.json` states it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fault {
    pub kind: Kind,
    /// The root cause: the hop (its service).
    pub service: String,
    /// The replica, when the fault is on one replica only.
    pub replica: Option<u32>,
    /// When the fault starts, seconds on the measured clock.
    pub start_s: f64,
    /// When it ends, seconds on the measured clock.
    pub end_s: f64,
    /// `slow`, `error`: the share of the hop's requests hit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probability: Option<f64>,
    /// `slow`: the delay added to each one hit, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_us: Option<u64>,
    /// `replica_slow`: the multiplier on the replica's work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub factor: Option<f64>,
    /// `error`: the gRPC status code answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    /// `loss`: the drop probability per packet and direction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    /// `delay`: the delay per packet and direction, and its jitter, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter_us: Option<u64>,
}

impl Fault {
    /// `slow b`, `kill b/1`, ...: the fault's phase label.
    pub fn describe(&self) -> String {
        match self.replica {
            Some(r) => format!("{} {}/{r}", self.kind.as_str(), self.service),
            None => format!("{} {}", self.kind.as_str(), self.service),
        }
    }
}

/// How the cases are drawn.
#[derive(Clone, Debug)]
pub struct DrawPlan {
    /// How many.
    pub count: usize,
    /// The kinds, taken in turn (case i gets `kinds[i % len]`).
    pub kinds: Vec<Kind>,
    pub seed: u64,
    /// How long each case's load lasts after warmup; the window falls
    /// inside it.
    pub length: Duration,
    /// The scenario's slow threshold: a slow fault's delay and a link's
    /// delay are drawn as multiples of it.
    pub slow_threshold: Duration,
}

/// Why cases cannot be drawn.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DrawError {
    #[error("no fault kinds to draw from")]
    NoKinds,
    #[error("{0} is too short for a case: at least 3s, so a window has time before and after it")]
    TooShort(String),
    #[error(
        "no hop of variant {variant:?} can take a {kind} fault: {why}",
        kind = kind.as_str()
    )]
    NoTarget {
        variant: String,
        kind: Kind,
        /// Why the first hop cannot.
        why: &'static str,
    },
}

/// The steady mesh: the variant with no fault at all unless `background`
/// (then its whole-run slowness, errors and link faults stay), no
/// scheduled fault, kill or load step in any case, its load lasting
/// `length`, and every trace kept (a case is a short run: unbiased sets).
/// `netns` puts every case on the netns launcher, so cases with and
/// without link faults run on the same network.
pub fn steady(
    scenario: &Scenario,
    variant: &Variant,
    background: bool,
    length: Duration,
    netns: bool,
) -> Scenario {
    let mut s = scenario.clone();
    let mut v = variant.clone();
    if netns {
        v.launcher = Launcher::Netns;
    }
    for hop in &mut v.hops {
        let w = hop.windows;
        if !background || w.slow.is_scheduled() {
            hop.slow = None;
        }
        if !background || w.replica_slow.is_scheduled() {
            hop.replica_slow = None;
        }
        if !background || w.error.is_scheduled() {
            hop.error = None;
        }
        hop.windows = Default::default();
        let whole_run = |f: &NetFault| f.start.is_zero() && f.duration.is_none();
        if !background || hop.net.as_ref().is_some_and(|f| !whole_run(f)) {
            hop.net = None;
        }
        hop.replica_net
            .retain(|r| background && whole_run(&r.fault));
        hop.kill = None;
    }
    v.load.net = None;
    v.load.generator_net.clear();
    if let LoadMode::Open { steps, .. } = &mut v.load.mode {
        steps.clear();
    }
    v.load.stop = Stop::Duration(length);
    s.variants = vec![v];
    s.sweep = None;
    s.telemetry.sampling = 1.0;
    s.telemetry.keep.share = KeepShare::Fixed(1.0);
    s
}

/// Why a hop cannot take `kind`, or `None` when it can.
fn unfit(hop: &Hop, kind: Kind, launcher: Launcher) -> Option<&'static str> {
    if hop.service.as_ref().is_some_and(|s| s.direct) {
        return Some("a directly called service has no hop to inject at");
    }
    let busy = match kind {
        Kind::Slow => hop.slow.is_some(),
        Kind::ReplicaSlow => hop.replica_slow.is_some(),
        Kind::Error => hop.error.is_some(),
        Kind::Loss | Kind::Delay => hop.has_net_faults(),
        Kind::Kill => false,
    };
    if busy {
        return Some("its background fault of that kind is in the way");
    }
    if kind.is_network() && launcher == Launcher::Local {
        return Some("network faults need launcher = \"netns\" or \"auto\" (root)");
    }
    None
}

/// Draws `plan.count` faults on `variant` (already [`steady`]). Case `i`
/// draws from its own stream of the seed, so a case is the same whatever
/// the count.
pub fn draw(variant: &Variant, plan: &DrawPlan) -> Result<Vec<Fault>, DrawError> {
    if plan.kinds.is_empty() {
        return Err(DrawError::NoKinds);
    }
    if plan.length < Duration::from_secs(3) {
        return Err(DrawError::TooShort(tailmesh_units::duration(plan.length)));
    }
    let mut targets = Vec::new();
    for &kind in &plan.kinds {
        let fit: Vec<&Hop> = variant
            .hops
            .iter()
            .filter(|h| unfit(h, kind, variant.launcher).is_none())
            .collect();
        if fit.is_empty() {
            let why = variant
                .hops
                .first()
                .and_then(|h| unfit(h, kind, variant.launcher))
                .unwrap_or("it has no hops");
            return Err(DrawError::NoTarget {
                variant: variant.name.clone(),
                kind,
                why,
            });
        }
        targets.push(fit);
    }
    let length = plan.length.as_secs_f64();
    let mut faults = Vec::with_capacity(plan.count);
    for i in 0..plan.count {
        let mut rng =
            ChaCha8Rng::seed_from_u64(plan.seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let k = i % plan.kinds.len();
        let kind = plan.kinds[k];
        let hop = targets[k][rng.random_range(0..targets[k].len())];
        // The window: starting in the run's second third, lasting a
        // quarter to a third of it, on tenths of a second.
        let tenth = |s: f64| (s * 10.0).round() / 10.0;
        let start_s = tenth(rng.random_range(length / 3.0..=length / 2.0));
        let end_s = tenth(start_s + rng.random_range(length / 4.0..=length / 3.0)).min(length);
        let replica = match kind {
            Kind::ReplicaSlow | Kind::Kill => Some(rng.random_range(0..hop.replicas.max(1))),
            Kind::Loss | Kind::Delay if hop.replicas > 1 => Some(rng.random_range(0..hop.replicas)),
            _ => None,
        };
        let log_uniform = |rng: &mut ChaCha8Rng, lo: f64, hi: f64| {
            (lo.ln() + rng.random::<f64>() * (hi.ln() - lo.ln())).exp()
        };
        let threshold_us = plan.slow_threshold.as_secs_f64() * 1e6;
        let mut fault = Fault {
            kind,
            service: hop.name.clone(),
            replica,
            start_s,
            end_s,
            probability: None,
            extra_us: None,
            factor: None,
            code: None,
            loss: None,
            delay_us: None,
            jitter_us: None,
        };
        // Parameters from barely there to plain: some faults are meant
        // to stay invisible, and the run says which.
        match kind {
            Kind::Slow => {
                fault.probability = Some(round3(log_uniform(&mut rng, 0.002, 0.2)));
                fault.extra_us = Some((threshold_us * rng.random_range(0.5..=3.0)) as u64);
            }
            Kind::ReplicaSlow => {
                fault.factor = Some(round3(log_uniform(&mut rng, 2.0, 100.0)));
            }
            Kind::Error => {
                fault.probability = Some(round3(log_uniform(&mut rng, 0.001, 0.1)).max(0.001));
                fault.code = Some(14);
            }
            Kind::Loss => {
                fault.loss = Some(round3(rng.random_range(0.01..=0.3)));
            }
            Kind::Delay => {
                let delay = (threshold_us * rng.random_range(0.2..=1.5)) as u64;
                fault.delay_us = Some(delay);
                fault.jitter_us = Some(delay / 10);
            }
            Kind::Kill => {}
        }
        faults.push(fault);
    }
    Ok(faults)
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The case's scenario: `steady` (one variant) with `fault` added.
pub fn apply(steady: &Scenario, fault: &Fault) -> Scenario {
    let mut s = steady.clone();
    let scaled = Duration::from_micros;
    let window = Window {
        start: Duration::from_secs_f64(fault.start_s),
        duration: Some(Duration::from_secs_f64(
            (fault.end_s - fault.start_s).max(0.1),
        )),
    };
    let Some(v) = s.variants.first_mut() else {
        return s;
    };
    let Some(hop) = v.hops.iter_mut().find(|h| h.name == fault.service) else {
        return s;
    };
    match fault.kind {
        Kind::Slow => {
            hop.slow = Some(Slowness {
                probability: fault.probability.unwrap_or(0.0),
                extra: DurationDist::Fixed {
                    value: scaled(fault.extra_us.unwrap_or(0)),
                },
                follow: None,
            });
            hop.windows.slow = window;
        }
        Kind::ReplicaSlow => {
            hop.replica_slow = Some(ReplicaSlow {
                replica: fault.replica.unwrap_or(0),
                factor: fault.factor.unwrap_or(1.0),
            });
            hop.windows.replica_slow = window;
        }
        Kind::Error => {
            hop.error = Some(ErrorInjection {
                probability: fault.probability.unwrap_or(0.0),
                code: fault.code.unwrap_or(14),
            });
            hop.windows.error = window;
        }
        Kind::Loss | Kind::Delay => {
            let net = NetFault {
                loss: fault.loss.unwrap_or(0.0),
                delay: scaled(fault.delay_us.unwrap_or(0)),
                jitter: scaled(fault.jitter_us.unwrap_or(0)),
                start: window.start,
                duration: window.duration,
            };
            match fault.replica {
                Some(replica) => {
                    hop.replica_net = vec![ReplicaNet {
                        replica,
                        fault: net,
                    }]
                }
                None => hop.net = Some(net),
            }
        }
        Kind::Kill => {
            hop.kill = Some(Kill {
                replica: fault.replica.unwrap_or(0),
                at: window.start.max(Duration::from_millis(1)),
                back: window.duration,
            });
        }
    }
    s
}
