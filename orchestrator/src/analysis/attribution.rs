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

use serde::{Deserialize, Serialize};
use tailmesh_proto::pb::HopRecord;

use super::compounding::{CompoundingReport, Verdict};
use super::stats::wilson95;
use crate::record::{Outcome, RequestRecord};

/// A component is a cause of a slow request when it is at least this share
/// of the slow threshold.
pub(crate) const CAUSE_SHARE: f64 = 0.25;

/// A failed compounding check whose excess is at least this share from the
/// instrument (the generator, unexplained slowness, or a busy machine's
/// network and work delays) is inconclusive.
pub(crate) const INSTRUMENT_SHARE: f64 = 0.5;

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
pub(crate) struct Component {
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
    pub(crate) fn label(&self) -> String {
        match (&self.from, &self.hop) {
            (Some(from), Some(hop)) => format!("{}:{from}->{hop}", self.kind.as_str()),
            (None, Some(hop)) => format!("{}:{hop}", self.kind.as_str()),
            _ => self.kind.as_str().to_string(),
        }
    }
}

/// A cause label in words: `queue:b` -> "queue wait at hop b".
pub(crate) fn describe_label(label: &str) -> String {
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
pub(crate) struct Attribution {
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
    pub(crate) fn primary(&self) -> String {
        match self.components.first() {
            Some(c) if self.causes > 0 => c.label(),
            _ => CauseKind::Unexplained.as_str().to_string(),
        }
    }

    /// The primary cause's kind.
    pub(crate) fn primary_kind(&self) -> CauseKind {
        match self.components.first() {
            Some(c) if self.causes > 0 => c.kind,
            _ => CauseKind::Unexplained,
        }
    }

    /// The causes, largest first.
    pub(crate) fn causes(&self) -> &[Component] {
        &self.components[..self.causes]
    }
}

/// Why `r` was slow, or `None` when it was not slow (latency at most
/// `threshold`) or failed (an error has no latency to judge; a timeout
/// over the threshold is slow).
pub(crate) fn attribute(r: &RequestRecord, threshold: Duration) -> Option<Attribution> {
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
pub(crate) fn components(r: &RequestRecord) -> Vec<Component> {
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
    // waits for all of them).
    let slot_wait = if pulled(h) { 0 } else { h.queue_wait_ns };
    let downstream = ns(h.total_ns)
        .saturating_sub(ns(h.service_ns))
        .saturating_sub(ns(slot_wait));
    if let Some(next) = children(path, i)
        .into_iter()
        .max_by_key(|&j| callee_time(&path[j]))
    {
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

/// Attributes every slow request of a variant. `work_bounds` holds, per
/// hop, the longest its work should take (absent: no bound known, such as
/// CPU-bound work).
pub(crate) fn summarize(
    records: &[RequestRecord],
    threshold: Duration,
    work_bounds: &BTreeMap<String, Duration>,
) -> AttributionReport {
    let mut report = AttributionReport {
        slow_threshold_us: super::stats::micros(threshold),
        cause_share: CAUSE_SHARE,
        ..AttributionReport::default()
    };
    let mut judged: Vec<&RequestRecord> = Vec::new();
    for r in records {
        let ok = r.outcome == Outcome::Ok;
        if ok || (r.outcome == Outcome::Timeout && r.latency() > threshold) {
            report.requests += 1;
            if ok {
                judged.push(r);
            }
        }
        let Some(a) = attribute(r, threshold) else {
            if ok && r.path.iter().any(|h| h.slow) {
                report.injected_fast += 1;
            }
            continue;
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
            let overrun = a.components.first().filter(|c| {
                a.causes > 0
                    && c.kind == CauseKind::Work
                    && c.hop
                        .as_ref()
                        .and_then(|h| work_bounds.get(h))
                        .is_some_and(|bound| c.duration > *bound)
            });
            report.work_overrun += u64::from(overrun.is_some());
            *report.excess.entry(primary).or_default() += 1;
        }
    }
    judged.sort_by_key(|r| r.latency());
    report.split = [("p99", 0.99), ("p99.9", 0.999)]
        .into_iter()
        .filter_map(|(name, q)| split_at(&judged, name, q))
        .collect();
    report
}

/// The mean components of the ok requests nearest quantile `q` of
/// `sorted` (by latency): the 0.2 % of requests around the rank, at least 5.
fn split_at(sorted: &[&RequestRecord], name: &str, q: f64) -> Option<PercentileSplit> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len();
    let rank = ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
    let half = (n / 1000).max(2);
    let (lo, hi) = (rank.saturating_sub(half), (rank + half + 1).min(n));
    let near = &sorted[lo..hi];
    let mut by_kind: BTreeMap<String, f64> = BTreeMap::new();
    for r in near {
        for c in components(r) {
            *by_kind.entry(c.kind.as_str().to_string()).or_default() +=
                c.duration.as_secs_f64() * 1e6;
        }
    }
    for v in by_kind.values_mut() {
        *v /= near.len() as f64;
    }
    Some(PercentileSplit {
        percentile: name.to_string(),
        latency_us: super::stats::micros(sorted[rank].latency()),
        requests: near.len() as u64,
        by_kind_us: by_kind,
    })
}

/// The verdict's decomposition: the model against the measured fraction,
/// and the excess split by cause.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Decomposition {
    /// Slow requests with injected slowness on their path (what the model
    /// predicts).
    pub slow_injected: u64,
    /// Ok requests with injected slowness that stayed under the threshold.
    pub injected_fast: u64,
    /// Slow requests without injected slowness, by primary cause label.
    pub excess: BTreeMap<String, u64>,
    /// Of the excess, slow from the instrument (the generator, unexplained).
    pub instrument: u64,
    /// Of the excess, slow from the network or from work longer than its
    /// declared distribution allows, while the machine was busy (0 when it
    /// was not).
    pub machine: u64,
}

/// What the verdict needs to know about the machine during the run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MachineState {
    /// Whether the self-watch found the machine busy.
    pub busy: bool,
    /// Its reasons, in words ("CPU pressure 87 %", ...).
    pub reasons: Vec<String>,
}

/// Refines a compounding verdict with the attribution: records the
/// decomposition; a "fail" whose excess is mostly the instrument's (the
/// generator, unexplained slowness, or network and work delays on a busy
/// machine) becomes "inconclusive" and names it; a remaining "fail" names
/// the cause of most of its excess.
///
/// The rule, for a measured fraction above the model: let `removed` be the
/// excess requests the instrument made slow. Inconclusive when they are at
/// least [`INSTRUMENT_SHARE`] of the excess (slow requests without injected
/// slowness), or when, left out of the trials, the interval of the rest
/// reaches down to the model. Below the model: fail, naming the share of
/// requests with injected slowness that stayed under the threshold.
pub(crate) fn refine(c: &mut CompoundingReport, a: &AttributionReport, machine: &MachineState) {
    let instrument = a.excess_where(CauseKind::is_instrument);
    let machine_count = if machine.busy {
        a.excess_where(CauseKind::is_machine) + a.work_overrun
    } else {
        0
    };
    c.decomposition = Some(Decomposition {
        slow_injected: a.slow_injected,
        injected_fast: a.injected_fast,
        excess: a.excess.clone(),
        instrument,
        machine: machine_count,
    });
    if c.verdict != Verdict::Fail || c.n == 0 {
        return;
    }
    let share = |k: u64| k as f64 / c.n as f64;
    if c.measured < c.model {
        c.reason = Some(format!(
            "{} of requests had injected slowness and stayed under the threshold \
             (the model counts every one as slow)",
            pct(share(a.injected_fast))
        ));
        return;
    }
    let excess: u64 = a.excess.values().sum();
    let removed = instrument + machine_count;
    let rest_lo = wilson95(c.slow.saturating_sub(removed), c.n.saturating_sub(removed)).0;
    let mostly = excess > 0 && removed as f64 >= INSTRUMENT_SHARE * excess as f64;
    // Without the instrument's requests, the rest reaches down to the model.
    if removed > 0 && (mostly || c.model >= rest_lo) {
        c.verdict = Verdict::Inconclusive;
        let who = if machine_count > instrument {
            format!(
                "the machine was busy ({}): {} of requests were slow between hops, or from hop work \
                 beyond its declared distribution, without injected slowness",
                machine.reasons.join(", "),
                pct(share(machine_count))
            )
        } else {
            let generator = a.excess_where(|k| k == CauseKind::Generator);
            let what = if generator * 2 >= instrument {
                "the load generator's lateness"
            } else {
                "unexplained slowness (no one hop, link or queue took a quarter of the threshold)"
            };
            let busy = if machine.busy {
                format!("; the machine was busy ({})", machine.reasons.join(", "))
            } else {
                String::new()
            };
            format!(
                "the instrument: {} of requests were slow from {what}{busy}",
                pct(share(instrument))
            )
        };
        c.reason = Some(format!(
            "{who}; that is {} of the {} slow requests the model does not predict",
            pct(if excess > 0 {
                removed as f64 / excess as f64
            } else {
                0.0
            }),
            excess
        ));
        return;
    }
    let top = a
        .excess
        .iter()
        .filter(|(label, _)| CauseKind::of_label(label).is_some_and(|k| !k.is_instrument()))
        .max_by_key(|(_, n)| **n);
    c.reason = Some(match top {
        Some((label, &n)) => {
            let behind = match CauseKind::of_label(label) {
                Some(CauseKind::Queue) => {
                    let hop = label.split_once(':').map_or("", |(_, h)| h);
                    if c.hops.iter().any(|h| h.hop == hop && h.slow > 0) {
                        " behind injected-slow requests"
                    } else {
                        " behind slow requests"
                    }
                }
                _ => "",
            };
            format!(
                "{} of requests were slow from {}{behind}, with no injected slowness of \
                 their own ({} of the {} slow requests the model does not predict)",
                pct(share(n)),
                describe_label(label),
                pct(n as f64 / excess.max(1) as f64),
                excess
            )
        }
        None => "slow requests without injected slowness".to_string(),
    });
}

/// A share as a percentage with one decimal: `4.1 %`.
pub(crate) fn pct(share: f64) -> String {
    format!("{:.1} %", share * 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::compounding::{HopSlowness, SlowCounts, judge};

    const MS: u64 = 1_000_000;

    /// A path record: hop, its caller, transport, service / total / queue
    /// wait in ms, injected.
    fn rec(hop: &str, parent: &str, transport: &str, times: [u64; 3], slow: bool) -> HopRecord {
        HopRecord {
            hop: hop.into(),
            parent: parent.into(),
            transport: transport.into(),
            service_ns: times[0] * MS / 10,
            total_ns: times[1] * MS / 10,
            queue_wait_ns: times[2] * MS / 10,
            slow,
            ..HopRecord::default()
        }
    }

    /// A request sent `late` tenths of a ms after its intended time, taking
    /// `client` tenths of a ms, with `path`.
    fn request(late: u64, client: u64, path: Vec<HopRecord>) -> RequestRecord {
        RequestRecord {
            id: 1,
            intended: Duration::ZERO,
            start: Duration::from_micros(late * 100),
            end: Duration::from_micros((late + client) * 100),
            outcome: Outcome::Ok,
            path,
            extra_attempts: 0,
        }
    }

    const T: Duration = Duration::from_millis(15);

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
            code: tonic::Code::Unavailable,
            message: String::new(),
        };
        assert_eq!(attribute(&failed, T), None);
    }

    /// 1000 requests through a -> b: `injected` slow from injection at a,
    /// `extra` slow from `cause` (a path built to make it primary), the rest
    /// fast.
    fn variant_records(injected: u64, extra: u64, cause: CauseKind) -> Vec<RequestRecord> {
        (0..1000u64)
            .map(|i| {
                let (late, a_total, b) = if i < injected {
                    (0, 210, rec("b", "a", "push", [2, 3, 0], false))
                } else if i < injected + extra {
                    match cause {
                        CauseKind::Queue => (0, 185, rec("b", "a", "push", [2, 182, 180], false)),
                        CauseKind::Generator => (180, 10, rec("b", "a", "push", [2, 3, 0], false)),
                        CauseKind::Network => (0, 185, rec("b", "a", "push", [2, 3, 0], false)),
                        _ => (0, 170, rec("b", "a", "push", [2, 3, 0], false)),
                    }
                } else {
                    (0, 10, rec("b", "a", "push", [2, 3, 0], false))
                };
                let a_service = if i < injected { 205 } else { 2 };
                let a = rec("a", "", "push", [a_service, a_total, 0], i < injected);
                let mut r = request(late, a_total + 1, vec![b, a]);
                r.id = i;
                r
            })
            .collect()
    }

    fn verdict(records: &[RequestRecord], machine: &MachineState) -> CompoundingReport {
        let a = summarize(records, T, &BTreeMap::new());
        let injected = records
            .iter()
            .filter(|r| r.path.iter().any(|h| h.slow))
            .count() as u64;
        let hops = vec![
            HopSlowness {
                hop: "a".into(),
                requests: 1000,
                slow: injected,
                p: injected as f64 / 1000.0,
                declared_p: 0.05,
            },
            HopSlowness {
                hop: "b".into(),
                requests: 1000,
                slow: 0,
                p: 0.0,
                declared_p: 0.0,
            },
        ];
        let counts = SlowCounts {
            n: a.requests,
            slow: a.slow,
            ..SlowCounts::default()
        };
        let mut c = judge(counts, hops, 15_000);
        refine(&mut c, &a, machine);
        c
    }

    #[test]
    fn queue_wait_beyond_the_model_fails_and_is_named() {
        let records = variant_records(50, 60, CauseKind::Queue);
        let a = summarize(&records, T, &BTreeMap::new());
        assert_eq!((a.slow, a.slow_injected), (110, 50));
        assert_eq!(a.excess.get("queue:b"), Some(&60));
        assert_eq!(a.per_hop["b"]["queue"], 60);
        let c = verdict(&records, &MachineState::default());
        assert_eq!(c.verdict, Verdict::Fail);
        let reason = c.reason.unwrap_or_default();
        assert!(
            reason.starts_with(
                "6.0 % of requests were slow from queue wait at hop b behind slow requests, \
                 with no injected slowness of their own (100.0 % of the 60"
            ),
            "{reason}"
        );
        // A busy machine does not excuse queueing, also when it made a few
        // requests slow between hops.
        let busy = MachineState {
            busy: true,
            reasons: vec!["CPU pressure 90 %".into()],
        };
        assert_eq!(verdict(&records, &busy).verdict, Verdict::Fail);
        let mut records = records;
        let network = variant_records(50, 65, CauseKind::Network);
        records[110..115].clone_from_slice(&network[110..115]);
        let c = verdict(&records, &busy);
        assert_eq!(c.verdict, Verdict::Fail, "{:?}", c.reason);
        assert_eq!(c.decomposition.map(|d| d.machine), Some(5));
    }

    #[test]
    fn a_late_generator_makes_a_failure_inconclusive_and_is_named() {
        let records = variant_records(50, 60, CauseKind::Generator);
        let c = verdict(&records, &MachineState::default());
        assert_eq!(c.verdict, Verdict::Inconclusive);
        let reason = c.reason.unwrap_or_default();
        assert!(reason.contains("the load generator's lateness"), "{reason}");
        assert_eq!(c.decomposition.map(|d| d.instrument), Some(60));
    }

    #[test]
    fn network_excess_fails_on_a_quiet_machine_and_is_the_machine_on_a_busy_one() {
        let records = variant_records(50, 60, CauseKind::Network);
        let quiet = verdict(&records, &MachineState::default());
        assert_eq!(quiet.verdict, Verdict::Fail);
        assert!(
            quiet
                .reason
                .as_deref()
                .is_some_and(|r| r.contains("network between hops a and b")),
            "{:?}",
            quiet.reason
        );
        let busy = MachineState {
            busy: true,
            reasons: vec!["load average 4.5 on 2 CPUs".into()],
        };
        let c = verdict(&records, &busy);
        assert_eq!(c.verdict, Verdict::Inconclusive);
        let reason = c.reason.unwrap_or_default();
        assert!(
            reason.starts_with("the machine was busy (load average 4.5 on 2 CPUs)"),
            "{reason}"
        );
    }

    #[test]
    fn work_beyond_its_declared_bound_is_the_machine_only_when_busy() {
        // 60 requests whose hop a worked 16.5 ms, uninjected.
        let mut records = variant_records(50, 0, CauseKind::Queue);
        for r in &mut records[50..110] {
            r.path[1] = rec("a", "", "push", [165, 170, 0], false);
            r.end = r.start + Duration::from_micros(17_100);
        }
        let bounds: BTreeMap<String, Duration> =
            [("a".to_string(), Duration::from_millis(2))].into();
        let a = summarize(&records, T, &bounds);
        assert_eq!((a.excess.get("work:a"), a.work_overrun), (Some(&60), 60));
        let busy = MachineState {
            busy: true,
            reasons: vec!["CPU pressure 90 %".into()],
        };
        let judged = |a: &AttributionReport, machine: &MachineState| {
            let hops = vec![HopSlowness {
                hop: "a".into(),
                requests: 1000,
                slow: 50,
                p: 0.05,
                declared_p: 0.05,
            }];
            let counts = SlowCounts {
                n: a.requests,
                slow: a.slow,
                ..SlowCounts::default()
            };
            let mut c = judge(counts, hops, 15_000);
            refine(&mut c, a, machine);
            (c.verdict, c.reason)
        };
        assert_eq!(judged(&a, &busy).0, Verdict::Inconclusive);
        assert_eq!(judged(&a, &MachineState::default()).0, Verdict::Fail);
        // Work its distribution allows is the mesh's, busy or not.
        let unbounded = summarize(&records, T, &BTreeMap::new());
        assert_eq!(unbounded.work_overrun, 0);
        let (verdict, reason) = judged(&unbounded, &busy);
        assert_eq!(verdict, Verdict::Fail, "{reason:?} {unbounded:?}");
    }

    #[test]
    fn agreement_passes_whatever_the_machine() {
        let records = variant_records(50, 0, CauseKind::Queue);
        let busy = MachineState {
            busy: true,
            reasons: vec!["x".into()],
        };
        let c = verdict(&records, &busy);
        assert_eq!(c.verdict, Verdict::Pass);
        assert_eq!(c.decomposition.map(|d| d.slow_injected), Some(50));
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
