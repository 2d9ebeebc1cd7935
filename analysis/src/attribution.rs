//! Tail attribution: why each slow request was slow, from what every request
//! carries back (its reply path and the load generator's own times), not
//! from sampled traces.
//!
//! A request's latency (from its intended send time) is split along its
//! **critical path** (the entry hop, then at each hop the downstream call
//! that took longest) into components:
//!
//! - `generator`: `start - intended`, how late the load generator sent it;
//! - `network:<caller>-><hop>`: the caller's client time for the call minus
//!   the time the callee spent on it (its server time, plus its broker queue
//!   wait when pulled): transport, retransmissions, connection set-up, and
//!   on a busy machine the processes waiting for a CPU. The caller of the
//!   entry hop is `loadgen`; its client time is `end - start`. A hop's
//!   client time for its downstream call is its total time minus its own
//!   service time and slot wait;
//! - `queue:<hop>`: the hop's queue wait (for a slot at a push replica with
//!   `concurrency`, or in the broker for a pull hop);
//! - `injected:<hop>`: the hop's service time when slowness was injected
//!   there (the injected extra plus its work);
//! - `work:<hop>`: the hop's service time without injected slowness;
//! - `unexplained`: what is left (a request without a path, such as a
//!   timeout, has only `generator` and `unexplained`).
//!
//! The rule: a component is a **cause** of a slow request when it is at
//! least [`CAUSE_SHARE`] of the slow threshold; the **primary** cause is the
//! largest component. A slow request no component explains that much of
//! (many small delays) has the primary cause `unexplained`.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::record::HopRecord;
use serde::{Deserialize, Serialize};

use crate::record::{Outcome, RequestRecord};

/// A component is a cause of a slow request when it is at least this share
/// of the slow threshold.
pub const CAUSE_SHARE: f64 = 0.25;

/// What a component of a request's latency is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CauseKind {
    /// Injected slowness at a hop.
    Injected,
    /// Queue wait at a hop (a slot, the broker).
    Queue,
    /// Between two hops: the caller's client time minus the callee's time.
    Network,
    /// A hop's own work, without injected slowness.
    Work,
    /// The load generator sent late.
    Generator,
    /// What no measurement accounts for.
    Unexplained,
}

impl CauseKind {
    /// Every kind, in the order tables and charts show them.
    pub const ALL: [CauseKind; 6] = [
        CauseKind::Injected,
        CauseKind::Queue,
        CauseKind::Network,
        CauseKind::Work,
        CauseKind::Generator,
        CauseKind::Unexplained,
    ];

    /// "injected", "queue", "network", "work", "generator", "unexplained".
    pub fn as_str(self) -> &'static str {
        match self {
            CauseKind::Injected => "injected",
            CauseKind::Queue => "queue",
            CauseKind::Network => "network",
            CauseKind::Work => "work",
            CauseKind::Generator => "generator",
            CauseKind::Unexplained => "unexplained",
        }
    }

    /// The kind a label (`queue:b`, `generator`, ...) starts with.
    pub fn of_label(label: &str) -> Option<CauseKind> {
        let kind = label.split(':').next().unwrap_or(label);
        CauseKind::ALL.into_iter().find(|k| k.as_str() == kind)
    }

    /// Whether it is the measuring instrument rather than the mesh.
    pub fn is_instrument(self) -> bool {
        matches!(self, CauseKind::Generator | CauseKind::Unexplained)
    }

    /// Whether a busy machine shows as it: processes waiting for a CPU
    /// between hops (a hop's work longer than it can be is counted apart,
    /// see [`AttributionReport::work_overrun`]).
    pub fn is_machine(self) -> bool {
        matches!(self, CauseKind::Network)
    }
}

/// One component of a request's latency.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Component {
    /// What it is.
    pub kind: CauseKind,
    /// The hop it happened at (network: the callee), if any.
    pub hop: Option<String>,
    /// Network: the caller (`loadgen` for the entry hop).
    pub from: Option<String>,
    /// How long it took.
    pub duration: Duration,
}

impl Component {
    fn new(kind: CauseKind, duration: Duration) -> Component {
        Component {
            kind,
            hop: None,
            from: None,
            duration,
        }
    }

    fn at(kind: CauseKind, hop: &str, duration: Duration) -> Component {
        Component {
            hop: Some(hop.to_string()),
            ..Component::new(kind, duration)
        }
    }

    /// `queue:b`, `network:a->b`, `generator`, ...
    pub fn label(&self) -> String {
        match (&self.from, &self.hop) {
            (Some(from), Some(hop)) => format!("{}:{from}->{hop}", self.kind.as_str()),
            (None, Some(hop)) => format!("{}:{hop}", self.kind.as_str()),
            _ => self.kind.as_str().to_string(),
        }
    }
}

/// A cause label in words: `queue:b` -> "queue wait at hop b".
pub fn describe_label(label: &str) -> String {
    let (kind, place) = label.split_once(':').unwrap_or((label, ""));
    match kind {
        "injected" => format!("injected slowness at hop {place}"),
        "queue" => format!("queue wait at hop {place}"),
        "work" => format!("the work of hop {place} (not injected)"),
        "network" => match place.split_once("->") {
            Some(("loadgen", to)) => format!("network between the load generator and hop {to}"),
            Some((from, to)) => format!("network between hops {from} and {to}"),
            None => format!("network into hop {place}"),
        },
        "generator" => "the load generator's lateness".to_string(),
        _ => "unexplained slowness".to_string(),
    }
}

/// Why one slow request was slow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attribution {
    /// Every component along the critical path, largest first.
    pub components: Vec<Component>,
    /// Whether any hop on its path had injected slowness.
    pub injected: bool,
    /// How many of `components` (from the first) are causes: at least
    /// [`CAUSE_SHARE`] of the threshold.
    pub causes: usize,
}

impl Attribution {
    /// The primary cause: the largest component if it is a cause, else
    /// `unexplained` (many small delays).
    pub fn primary(&self) -> String {
        match self.components.first() {
            Some(c) if self.causes > 0 => c.label(),
            _ => CauseKind::Unexplained.as_str().to_string(),
        }
    }

    /// The primary cause's kind.
    pub fn primary_kind(&self) -> CauseKind {
        match self.components.first() {
            Some(c) if self.causes > 0 => c.kind,
            _ => CauseKind::Unexplained,
        }
    }

    /// The causes, largest first.
    pub fn causes(&self) -> &[Component] {
        &self.components[..self.causes]
    }
}

/// Why `r` was slow, or `None` when it was not slow (latency at most
/// `threshold`) or failed (an error has no latency to judge; a timeout
/// over the threshold is slow).
pub fn attribute(r: &RequestRecord, threshold: Duration) -> Option<Attribution> {
    if matches!(r.outcome, Outcome::Error { .. }) || r.latency() <= threshold {
        return None;
    }
    let mut components = components(r);
    components.sort_by(|a, b| b.duration.cmp(&a.duration).then(a.kind.cmp(&b.kind)));
    let bar = threshold.mul_f64(CAUSE_SHARE);
    let causes = components.iter().take_while(|c| c.duration >= bar).count();
    Some(Attribution {
        injected: r.path.iter().any(|h| h.slow),
        components,
        causes,
    })
}

/// The components of `r`'s latency along its critical path, in path order
/// (entry first), zero components left out; they add up to its latency.
pub fn components(r: &RequestRecord) -> Vec<Component> {
    let latency = r.latency();
    let mut out = vec![Component::new(
        CauseKind::Generator,
        r.start.saturating_sub(r.intended),
    )];
    if let Some(entry) = entry(&r.path) {
        walk(
            &r.path,
            entry,
            "loadgen",
            r.end.saturating_sub(r.start),
            &mut out,
        );
    }
    let explained: Duration = out.iter().map(|c| c.duration).sum();
    out.push(Component::new(
        CauseKind::Unexplained,
        latency.saturating_sub(explained),
    ));
    out.retain(|c| !c.duration.is_zero());
    out
}

fn ns(n: u64) -> Duration {
    Duration::from_nanos(n)
}

fn pulled(h: &HopRecord) -> bool {
    h.transport == "pull"
}

/// The time a call to `h` took on the callee's side: its server time plus,
/// pulled, its wait in the broker (outside the server time).
fn callee_time(h: &HopRecord) -> Duration {
    ns(h.total_ns)
        + if pulled(h) {
            ns(h.queue_wait_ns)
        } else {
            ns(0)
        }
}

/// The entry hop: the one without a caller (when parents are unknown, the
/// last to finish, which in a chain is the first hop).
fn entry(path: &[HopRecord]) -> Option<usize> {
    path.iter()
        .position(|h| h.parent.is_empty())
        .filter(|_| path.iter().filter(|h| h.parent.is_empty()).count() == 1)
        .or_else(|| path.len().checked_sub(1))
}

/// The hops `path[i]` called. Paths written without parents are chains in
/// finishing order: the hop before `i` is its child.
fn children(path: &[HopRecord], i: usize) -> Vec<usize> {
    let named = path.iter().filter(|h| !h.parent.is_empty()).count();
    if named == 0 {
        return i.checked_sub(1).into_iter().collect();
    }
    (0..path.len())
        .filter(|&j| j != i && path[j].parent == path[i].hop)
        .collect()
}

fn walk(path: &[HopRecord], i: usize, caller: &str, client: Duration, out: &mut Vec<Component>) {
    let h = &path[i];
    out.push(Component {
        from: Some(caller.to_string()),
        ..Component::at(
            CauseKind::Network,
            &h.hop,
            client.saturating_sub(callee_time(h)),
        )
    });
    out.push(Component::at(CauseKind::Queue, &h.hop, ns(h.queue_wait_ns)));
    let kind = if h.slow {
        CauseKind::Injected
    } else {
        CauseKind::Work
    };
    out.push(Component::at(kind, &h.hop, ns(h.service_ns)));
    // The critical child: the downstream call that took longest (a fan-out
    // waits for all of them), as the caller timed it where its record says
    // (the network to a callee included: a slow link makes its call the
    // critical one though the callee itself was quick), else by the
    // callee's own time.
    let slot_wait = if pulled(h) { 0 } else { h.queue_wait_ns };
    let downstream = ns(h.total_ns)
        .saturating_sub(ns(h.service_ns))
        .saturating_sub(ns(slot_wait));
    let call_time = |j: usize| {
        h.calls
            .iter()
            .filter(|c| c.hop == path[j].hop)
            .map(|c| ns(c.call_ns))
            .max()
            .unwrap_or_else(|| callee_time(&path[j]))
    };
    if let Some(next) = children(path, i).into_iter().max_by_key(|&j| call_time(j)) {
        walk(path, next, &h.hop, downstream, out);
    }
}

/// Counts of causes among a variant's slow requests.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AttributionReport {
    /// The slow threshold, µs.
    pub slow_threshold_us: u64,
    /// A component is a cause when it is at least this share of the
    /// threshold.
    pub cause_share: f64,
    /// Requests judged (ok requests plus timeouts over the threshold).
    pub requests: u64,
    /// Of those, slow (over the threshold).
    pub slow: u64,
    /// Slow requests with injected slowness on their path.
    pub slow_injected: u64,
    /// Ok requests with injected slowness that stayed under the threshold.
    pub injected_fast: u64,
    /// Slow requests by primary cause label (`queue:b`, `generator`, ...).
    pub primary: BTreeMap<String, u64>,
    /// Slow requests by cause label, each request counted under every one
    /// of its causes.
    pub causes: BTreeMap<String, u64>,
    /// Slow requests by primary cause kind.
    pub primary_kind: BTreeMap<String, u64>,
    /// Slow requests by primary cause, per hop (network: the callee).
    pub per_hop: BTreeMap<String, BTreeMap<String, u64>>,
    /// Slow requests WITHOUT injected slowness (what the model does not
    /// predict) by primary cause label.
    pub excess: BTreeMap<String, u64>,
    /// Of those with a hop's work as primary cause, the ones whose work
    /// took longer than its declared distribution allows (beyond its
    /// 99.99th percentile): sleeps that overran on a busy machine.
    #[serde(default)]
    pub work_overrun: u64,
    /// The p99 and p99.9 latencies split by cause kind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub split: Vec<PercentileSplit>,
}

/// A latency percentile split into cause kinds: the mean components of the
/// requests nearest that percentile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PercentileSplit {
    /// "p99" or "p99.9".
    pub percentile: String,
    /// The latency at that rank, µs.
    pub latency_us: u64,
    /// How many requests (nearest the rank) the split averages.
    pub requests: u64,
    /// Mean µs per cause kind.
    pub by_kind_us: BTreeMap<String, f64>,
}

impl AttributionReport {
    /// Slow requests without injected slowness whose primary cause is of a
    /// kind `pick` accepts.
    pub fn excess_where(&self, pick: impl Fn(CauseKind) -> bool) -> u64 {
        self.excess
            .iter()
            .filter(|(label, _)| CauseKind::of_label(label).is_some_and(&pick))
            .map(|(_, n)| n)
            .sum()
    }
}

/// Attributes a variant's slow requests one at a time; [`Self::finish`]
/// gives the counts. Holds counters and, for the percentile split, the
/// components summed per latency band (3 significant digits): bounded by
/// the number of bands, not by the number of requests.
pub struct AttributionAcc {
    report: AttributionReport,
    threshold: Duration,
    work_bounds: BTreeMap<String, Duration>,
    /// Ok requests by latency band.
    bands: BTreeMap<u64, Band>,
    /// Ok requests recorded (the split's population).
    ok: u64,
}

/// The ok requests whose latency falls in one band: how many, their summed
/// latency and their summed components per cause kind, µs.
#[derive(Clone, Debug, Default)]
struct Band {
    count: u64,
    latency_us: f64,
    by_kind_us: [f64; CauseKind::ALL.len()],
}

/// The band of a latency: `us` with 3 significant digits kept.
fn band_of(us: u64) -> u64 {
    let mut scale = 1;
    while us / scale >= 1000 {
        scale *= 10;
    }
    us / scale * scale
}

impl AttributionAcc {
    /// `work_bounds` holds, per hop, the longest its work should take
    /// (absent: no bound known, such as CPU-bound work).
    pub fn new(threshold: Duration, work_bounds: BTreeMap<String, Duration>) -> Self {
        AttributionAcc {
            report: AttributionReport {
                slow_threshold_us: super::stats::micros(threshold),
                cause_share: CAUSE_SHARE,
                ..AttributionReport::default()
            },
            threshold,
            work_bounds,
            bands: BTreeMap::new(),
            ok: 0,
        }
    }

    /// Counts one completed request.
    pub fn record(&mut self, r: &RequestRecord) {
        let threshold = self.threshold;
        let report = &mut self.report;
        let ok = r.outcome == Outcome::Ok;
        if ok || (r.outcome == Outcome::Timeout && r.latency() > threshold) {
            report.requests += 1;
        }
        if ok {
            self.ok += 1;
            let latency = super::stats::micros(r.latency());
            let band = self.bands.entry(band_of(latency)).or_default();
            band.count += 1;
            band.latency_us += r.latency().as_secs_f64() * 1e6;
            for c in components(r) {
                if let Some(k) = CauseKind::ALL.iter().position(|k| *k == c.kind) {
                    band.by_kind_us[k] += c.duration.as_secs_f64() * 1e6;
                }
            }
        }
        let Some(a) = attribute(r, threshold) else {
            if ok && r.path.iter().any(|h| h.slow) {
                report.injected_fast += 1;
            }
            return;
        };
        report.slow += 1;
        let primary = a.primary();
        *report.primary.entry(primary.clone()).or_default() += 1;
        *report
            .primary_kind
            .entry(a.primary_kind().as_str().to_string())
            .or_default() += 1;
        if let Some(hop) = a
            .components
            .first()
            .filter(|_| a.causes > 0)
            .and_then(|c| c.hop.clone())
        {
            *report
                .per_hop
                .entry(hop)
                .or_default()
                .entry(a.primary_kind().as_str().to_string())
                .or_default() += 1;
        }
        for c in a.causes() {
            *report.causes.entry(c.label()).or_default() += 1;
        }
        if a.injected {
            report.slow_injected += 1;
        } else {
            let bounds = &self.work_bounds;
            let overrun = a.components.first().filter(|c| {
                a.causes > 0
                    && c.kind == CauseKind::Work
                    && c.hop
                        .as_ref()
                        .and_then(|h| bounds.get(h))
                        .is_some_and(|bound| c.duration > *bound)
            });
            report.work_overrun += u64::from(overrun.is_some());
            *report.excess.entry(primary).or_default() += 1;
        }
    }

    /// The counts, with the p99 and p99.9 split.
    pub fn finish(self) -> AttributionReport {
        let mut report = self.report;
        report.split = [("p99", 0.99), ("p99.9", 0.999)]
            .into_iter()
            .filter_map(|(name, q)| split_at(&self.bands, self.ok, name, q))
            .collect();
        report
    }
}

/// Attributes every slow request among `records` (tests feed whole lists).
#[cfg(any(test, feature = "testing"))]
pub fn summarize<'a>(
    records: impl IntoIterator<Item = &'a RequestRecord>,
    threshold: Duration,
    work_bounds: &BTreeMap<String, Duration>,
) -> AttributionReport {
    let mut acc = AttributionAcc::new(threshold, work_bounds.clone());
    for r in records {
        acc.record(r);
    }
    acc.finish()
}

/// The mean components of the `n` ok requests (in latency `bands`) nearest
/// quantile `q`: the 0.2 % of requests around its rank, at least 5. A band
/// the range only partly covers counts with the share it covers.
fn split_at(bands: &BTreeMap<u64, Band>, n: u64, name: &str, q: f64) -> Option<PercentileSplit> {
    if n == 0 {
        return None;
    }
    let rank = ((q * n as f64).ceil() as u64).clamp(1, n) - 1;
    let half = (n / 1000).max(2);
    let (lo, hi) = (rank.saturating_sub(half), (rank + half + 1).min(n));
    let mut by_kind = [0.0; CauseKind::ALL.len()];
    let mut latency_us = 0;
    // Requests below each band: its ranks are [below, below + count).
    let mut below = 0;
    for band in bands.values() {
        let (first, end) = (below, below + band.count);
        below = end;
        let taken = end.min(hi).saturating_sub(first.max(lo));
        if taken > 0 {
            let share = taken as f64 / band.count as f64;
            for (sum, part) in by_kind.iter_mut().zip(band.by_kind_us) {
                *sum += part * share;
            }
        }
        if (first..end).contains(&rank) {
            latency_us = (band.latency_us / band.count as f64).round() as u64;
        }
    }
    let near = hi - lo;
    Some(PercentileSplit {
        percentile: name.to_string(),
        latency_us,
        requests: near,
        by_kind_us: CauseKind::ALL
            .iter()
            .zip(by_kind)
            .filter(|(_, us)| *us > 0.0)
            .map(|(k, us)| (k.as_str().to_string(), us / near as f64))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{T, rec, request, variant_records};

    fn labels(a: &Attribution) -> Vec<String> {
        a.causes().iter().map(Component::label).collect()
    }

    #[test]
    fn components_add_up_to_the_latency_along_a_chain() {
        // a (push) -> b (pull, 3 ms in the broker) -> c (push); 0.5 ms late.
        let path = vec![
            rec("c", "b", "push", [10, 12, 0], false),
            rec("b", "a", "pull", [5, 40, 30], false),
            rec("a", "", "push", [5, 100, 0], false),
        ];
        let r = request(5, 110, path);
        let c = components(&r);
        let sum: Duration = c.iter().map(|c| c.duration).sum();
        assert_eq!(sum, r.latency());
        let find = |label: &str| {
            c.iter()
                .find(|c| c.label() == label)
                .map(|c| c.duration.as_micros())
        };
        assert_eq!(find("generator"), Some(500));
        assert_eq!(find("network:loadgen->a"), Some(1_000));
        // a waited 9.5 ms downstream; b took 4 ms plus 3 ms in the broker.
        assert_eq!(find("network:a->b"), Some(2_500));
        assert_eq!(find("queue:b"), Some(3_000));
        // b waited 3.5 ms for c, which took 1.2 ms.
        assert_eq!(find("network:b->c"), Some(2_300));
        assert_eq!(find("work:c"), Some(1_000));
        assert_eq!(find("unexplained"), Some(200));
        // Not slow: no attribution.
        assert_eq!(attribute(&r, T), None);
    }

    #[test]
    fn injected_slowness_is_the_primary_cause_where_it_was_injected() {
        let path = vec![
            rec("b", "a", "push", [203, 205, 0], true),
            rec("a", "", "push", [3, 210, 0], false),
        ];
        let a = attribute(&request(1, 212, path), T).expect("slow");
        assert_eq!(a.primary(), "injected:b");
        assert_eq!(a.primary_kind(), CauseKind::Injected);
        assert_eq!(labels(&a), ["injected:b"]);
        assert!(a.injected);
    }

    #[test]
    fn a_slot_wait_at_a_push_hop_is_queue_wait_there() {
        // b waited 16 ms for its one slot, then 1 ms of work.
        let path = vec![
            rec("b", "a", "push", [10, 171, 160], false),
            rec("a", "", "push", [3, 174, 0], false),
        ];
        let a = attribute(&request(0, 178, path), T).expect("slow");
        assert_eq!(a.primary(), "queue:b");
        assert!(!a.injected);
        // Its slot wait is not counted again as network: there is none.
        assert!(
            a.components.iter().all(|c| c.label() != "network:a->b"),
            "{:?}",
            a.components
        );
    }

    #[test]
    fn a_slow_link_is_network_between_the_two_hops() {
        // a's call to b took 22 ms; b spent 1.2 ms on it (a retransmission).
        let path = vec![
            rec("b", "a", "push", [10, 12, 0], false),
            rec("a", "", "push", [3, 223, 0], false),
        ];
        let a = attribute(&request(0, 225, path), T).expect("slow");
        assert_eq!(a.primary(), "network:a->b");
        assert_eq!(a.primary_kind(), CauseKind::Network);
        assert_eq!(describe_label(&a.primary()), "network between hops a and b");
    }

    #[test]
    fn a_late_generator_is_the_generator() {
        let path = vec![rec("a", "", "push", [3, 5, 0], false)];
        let a = attribute(&request(180, 6, path), T).expect("slow");
        assert_eq!(a.primary(), "generator");
        assert!(a.primary_kind().is_instrument());
    }

    #[test]
    fn many_small_delays_are_unexplained_and_several_causes_are_kept() {
        // Five hops each 3.4 ms of work: none reaches 3.75 ms.
        let path: Vec<HopRecord> = (0..5)
            .map(|i| {
                let parent = if i == 4 {
                    String::new()
                } else {
                    format!("h{}", i + 1)
                };
                rec(
                    &format!("h{i}"),
                    &parent,
                    "push",
                    [34, 34 * (i + 1), 0],
                    false,
                )
            })
            .collect();
        let a = attribute(&request(0, 171, path), T).expect("slow");
        assert_eq!(a.causes, 0);
        assert_eq!(a.primary(), "unexplained");
        // Injected at b and queue at c: both causes, the larger primary.
        let path = vec![
            rec("c", "b", "push", [5, 105, 100], false),
            rec("b", "a", "push", [200, 310, 0], true),
            rec("a", "", "push", [1, 312, 0], false),
        ];
        let a = attribute(&request(0, 313, path), T).expect("slow");
        assert_eq!(labels(&a), ["injected:b", "queue:c"]);
    }

    #[test]
    fn a_fan_out_follows_the_slowest_child() {
        // root calls l1 (2 ms) and l2 (18 ms, queued 17 ms) in parallel.
        let path = vec![
            rec("l1", "root", "push", [20, 20, 0], false),
            rec("l2", "root", "push", [10, 180, 170], false),
            rec("root", "", "push", [1, 185, 0], false),
        ];
        let r = request(0, 186, path);
        let a = attribute(&r, T).expect("slow");
        assert_eq!(a.primary(), "queue:l2");
        assert!(
            components(&r)
                .iter()
                .all(|c| c.hop.as_deref() != Some("l1"))
        );
        let sum: Duration = components(&r).iter().map(|c| c.duration).sum();
        assert_eq!(sum, r.latency());
    }

    #[test]
    fn a_fan_out_follows_the_call_its_caller_waited_longest_for() {
        // root calls l1 (its server 1 ms, behind a slow link: 18 ms as root
        // timed it) and l2 (3 ms, 3.2 ms as root timed it) in parallel.
        let mut root = rec("root", "", "push", [1, 185, 0], false);
        let call = |hop: &str, tenths: u64| crate::record::CallTiming {
            hop: hop.into(),
            call_ns: tenths * 100_000,
            attempts: Vec::new(),
        };
        root.calls = vec![call("l1", 180), call("l2", 32)];
        let path = vec![
            rec("l1", "root", "push", [10, 10, 0], false),
            rec("l2", "root", "push", [30, 30, 0], false),
            root,
        ];
        let r = request(0, 186, path);
        let a = attribute(&r, T).expect("slow");
        assert_eq!(a.primary(), "network:root->l1");
        assert!(
            components(&r)
                .iter()
                .all(|c| c.hop.as_deref() != Some("l2"))
        );
        // Without the caller's timings, the callee's own time decides.
        let mut untimed = r.clone();
        untimed.path[2].calls.clear();
        let a = attribute(&untimed, T).expect("slow");
        assert_eq!(a.primary(), "network:root->l2");
    }

    #[test]
    fn a_timeout_without_a_path_is_unexplained_unless_the_generator_was_late() {
        let mut r = request(0, 1000, vec![]);
        r.outcome = Outcome::Timeout;
        assert_eq!(
            attribute(&r, T).map(|a| a.primary()),
            Some("unexplained".into())
        );
        let mut late = request(900, 100, vec![]);
        late.outcome = Outcome::Timeout;
        assert_eq!(
            attribute(&late, T).map(|a| a.primary()),
            Some("generator".into())
        );
        let mut failed = request(0, 1000, vec![]);
        failed.outcome = Outcome::Error {
            code: crate::record::GrpcCode::Unavailable,
            message: String::new(),
        };
        assert_eq!(attribute(&failed, T), None);
    }

    #[test]
    fn the_p99_split_sums_to_about_the_p99() {
        let records = variant_records(50, 60, CauseKind::Queue);
        let a = summarize(&records, T, &BTreeMap::new());
        let p99 = a.split.iter().find(|s| s.percentile == "p99").expect("p99");
        let total: f64 = p99.by_kind_us.values().sum();
        assert!((total - p99.latency_us as f64).abs() < 1_000.0, "{p99:?}");
        assert!(p99.by_kind_us.contains_key("injected"), "{p99:?}");
    }
}
