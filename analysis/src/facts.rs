//! What a scenario says, read the way every analysis reads it: the faults
//! with a window and their labels, a hop's declared slow probability, the
//! longest its work should take. Phases, the declared prediction, the
//! composition and the variant's report all take these facts from here, so
//! a fault has one name and a hop one bound; this module uses no other
//! analysis module.

use std::time::Duration;

use tailmesh_model::{DurationDist, Slowness, Work};

use tailmesh_model::scenario::{Hop, Load, Variant, Window};

/// Every fault of `variant` that has a window (set and cleared during the
/// run), labelled `slow b`, `replica_slow b/2`, `error b`, `net b`,
/// `net b/1`, each replica killed on schedule (`kill b/1`, down until it
/// is back), and the load generators' links (`net generators`,
/// `net generator 1`): the one place faults get the names phases, their
/// reports and the declared prediction use.
pub fn windowed_faults(variant: &Variant) -> Vec<(String, Window)> {
    let mut out = Vec::new();
    let mut push = |label: String, w: Window| {
        if w.is_scheduled() {
            out.push((label, w));
        }
    };
    let load = &variant.load;
    if let Some(net) = load.net.as_ref().filter(|n| n.is_active()) {
        push(GENERATORS_NET.to_owned(), net.window());
    }
    for g in load.generator_net.iter().filter(|g| g.fault.is_active()) {
        push(generator_net_label(load, g.generator), g.fault.window());
    }
    for hop in &variant.hops {
        let name = &hop.name;
        if hop.slow.is_some() {
            push(slow_label(name), hop.windows.slow);
        }
        if let Some(r) = &hop.replica_slow {
            push(
                format!("replica_slow {name}/{}", r.replica),
                hop.windows.replica_slow,
            );
        }
        if hop.error.is_some() {
            push(format!("error {name}"), hop.windows.error);
        }
        if let Some(net) = hop.net.as_ref().filter(|n| n.is_active()) {
            push(format!("net {name}"), net.window());
        }
        for r in hop.replica_net.iter().filter(|r| r.fault.is_active()) {
            push(format!("net {name}/{}", r.replica), r.fault.window());
        }
        // A replica killed on schedule is down from its kill to its restart.
        if let Some(kill) = &hop.kill {
            push(format!("kill {name}/{}", kill.replica), kill.window());
        }
    }
    out
}

/// The label of `[load] net`, the fault on every generator's link.
const GENERATORS_NET: &str = "net generators";

/// The label of the fault on generator `generator`'s link: its own
/// (`net generator 1`) or every generator's (`net generators`). Hop names
/// have no spaces, so no hop's label reads the same.
pub fn generator_net_label(load: &Load, generator: u32) -> String {
    if load.generator_net.iter().any(|g| g.generator == generator) {
        format!("net generator {generator}")
    } else {
        GENERATORS_NET.to_owned()
    }
}

/// The label of a hop's `slow` window.
pub fn slow_label(hop: &str) -> String {
    format!("slow {hop}")
}

/// The declared per-request slow probability of a hop (0 without `slow`):
/// its `slow.probability`, or, when its slowness follows its caller's
/// (`slow.follow`), the marginal `P(caller slow) follow + (1 - P(caller
/// slow)) probability`, the caller's own declared marginal taken in turn.
pub fn declared_p(variant: &Variant, hop: &Hop) -> f64 {
    let Some(slow) = &hop.slow else {
        return 0.0;
    };
    let Some(follow) = slow.follow else {
        return slow.probability;
    };
    let caller = variant
        .hops
        .iter()
        .find(|h| h.downstream.contains(&hop.name));
    let p_caller = caller.map_or(0.0, |c| declared_p(variant, c));
    p_caller * follow + (1.0 - p_caller) * slow.probability
}

/// The longest a hop's work should take: the 99.99th percentile of its
/// declared sleep (times a slow replica's factor); `None` for CPU-bound
/// work, whose time depends on the machine.
pub fn work_bound(hop: &Hop) -> Option<Duration> {
    let bound = match &hop.work {
        Work::None => Duration::ZERO,
        Work::Cpu { .. } => return None,
        Work::Sleep { dist } => match dist {
            DurationDist::Fixed { value } => *value,
            DurationDist::Uniform { max, .. } => *max,
            // -ln(1e-4) = 9.21 means.
            DurationDist::Exp { mean } => mean.mul_f64(9.21),
            // exp(mu + 3.72 sigma) with mu = ln(mean) - sigma^2 / 2.
            DurationDist::Lognormal { mean, sigma } => {
                mean.mul_f64((3.72 * sigma - sigma * sigma / 2.0).exp().min(1e6))
            }
            DurationDist::Empirical { .. } => dist.max().unwrap_or_default(),
        },
    };
    let factor = hop.replica_slow.as_ref().map_or(1.0, |r| r.factor.max(1.0));
    Some(bound.mul_f64(factor))
}

/// Whether a hop's slowness is tied to its caller's (`slow.follow`).
pub fn slow_follows(slow: &Slowness) -> bool {
    slow.follow.is_some_and(|f| f > 0.0)
}
