//! Picking a replica of a push hop, and which replicas may be picked.
//!
//! The policies (round robin, random, p2c by requests in flight, peak-EWMA)
//! choose among the *pickable* replicas: those not in TRANSIENT_FAILURE
//! (see the `client` module, which reports connection states here) and not
//! ejected as outliers. While every replica is pickable, picking is what it
//! was before endpoint health existed: no scan, no lock beyond the seeded
//! RNG's. Everything a call touches is an atomic; the ejection decisions
//! take a mutex, only when a rule fires or an interval ends.
//!
//! Outlier ejection (after Envoy's): a replica whose calls fail
//! `consecutive_errors` times in a row, or whose mean (or p99) latency over
//! the last `interval` is `latency_factor` times the median of its peers',
//! is ejected for `base_time` times the number of times it was ejected
//! (at most `max_time`). Re-admission happens at the first pick after the
//! ejection ends (nothing runs in the background). The errors that count
//! are those of a gateway or server in trouble, Envoy's 5xx: a transport
//! failure (no answer at all), UNAVAILABLE, INTERNAL, UNKNOWN, DATA_LOSS
//! and DEADLINE_EXCEEDED. An answer the caller asked for (INVALID_ARGUMENT,
//! NOT_FOUND...), load shedding (RESOURCE_EXHAUSTED, Envoy's 429) and
//! CANCELLED (the caller gave up: a hedge's loser) do not count, and do not
//! break a run of errors either.

use std::sync::{
    Mutex,
    atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
};

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use tailmesh_proto::pb::EndpointEventKind;
use tailmesh_units::nanos;
use tokio::time::{Duration, Instant};
use tonic::Code;

use super::events::EndpointLog;
use crate::model::{Balance, Ejection, EwmaParams, LatencyStat};

/// How a call to a replica ended, as balancing and ejection see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// An answer that says nothing bad of the replica (OK, or an error the
    /// caller's request caused).
    Fine,
    /// A server or transport error (see the module's docs).
    Error,
    /// Neither (CANCELLED, RESOURCE_EXHAUSTED): not counted either way.
    Neutral,
}

impl Outcome {
    /// The outcome of an answer with `code` (a transport failure comes
    /// here as the code the client maps it to: UNAVAILABLE, INTERNAL...).
    pub(crate) fn of(code: Code) -> Self {
        match code {
            Code::Unavailable
            | Code::Internal
            | Code::Unknown
            | Code::DataLoss
            | Code::DeadlineExceeded => Outcome::Error,
            Code::Cancelled | Code::ResourceExhausted => Outcome::Neutral,
            _ => Outcome::Fine,
        }
    }
}

/// Latency histogram buckets of the p99 rule: 4 per octave from 1 µs
/// (about 19% wide), the last one open-ended (past about an hour).
const BUCKETS: usize = 128;

/// One replica's balancing state.
#[derive(Debug)]
struct Endpoint {
    in_flight: AtomicUsize,
    /// In TRANSIENT_FAILURE.
    down: AtomicBool,
    /// When its probe next tries to connect (ns since the epoch), so that
    /// with every replica down the call goes where a connection is likely
    /// soonest.
    retry_at: AtomicU64,
    /// When its ejection ends (ns since the epoch); 0: not ejected.
    ejected_until: AtomicU64,
    /// Times ejected so far.
    ejections: AtomicU32,
    /// The peak-EWMA latency (ns, f64 bits) and when it was last updated
    /// (ns since the epoch); `observed` false until the first answer.
    ewma_ns: AtomicU64,
    ewma_at: AtomicU64,
    observed: AtomicBool,
    /// Errors in a row.
    consecutive: AtomicU32,
    /// This interval's answers, their summed time, and (p99 only) their
    /// histogram.
    window_count: AtomicU64,
    window_sum_ns: AtomicU64,
    window_hist: Box<[AtomicU32]>,
}

impl Endpoint {
    fn new(histogram: bool) -> Self {
        Endpoint {
            in_flight: AtomicUsize::new(0),
            down: AtomicBool::new(false),
            retry_at: AtomicU64::new(0),
            ejected_until: AtomicU64::new(0),
            ejections: AtomicU32::new(0),
            ewma_ns: AtomicU64::new(0),
            ewma_at: AtomicU64::new(0),
            observed: AtomicBool::new(false),
            consecutive: AtomicU32::new(0),
            window_count: AtomicU64::new(0),
            window_sum_ns: AtomicU64::new(0),
            window_hist: (0..if histogram { BUCKETS } else { 0 })
                .map(|_| AtomicU32::new(0))
                .collect(),
        }
    }

    fn ejected(&self, now_ns: u64) -> bool {
        let until = self.ejected_until.load(Ordering::Relaxed);
        until != 0 && until > now_ns
    }

    fn pickable(&self, now_ns: u64) -> bool {
        !self.down.load(Ordering::Relaxed) && !self.ejected(now_ns)
    }
}

/// The ejection rules' state beyond the replicas'.
#[derive(Debug)]
struct Ejector {
    rules: Ejection,
    /// max(1, floor(max_share * n)).
    max_ejected: usize,
    /// When the latency rule is next judged (ns since the epoch).
    next_judgement: AtomicU64,
    /// Taken to decide an ejection, so two decisions never both pass the
    /// limits.
    deciding: Mutex<()>,
}

/// The picking and ejection state of one pool.
#[derive(Debug)]
pub(crate) struct Balancer {
    policy: Balance,
    endpoints: Vec<Endpoint>,
    next: AtomicUsize,
    rng: Mutex<ChaCha8Rng>,
    epoch: Instant,
    ewma: EwmaParams,
    ejector: Option<Ejector>,
    /// Replicas down plus replicas ejected: while 0, all are pickable.
    unpickable: AtomicUsize,
}

impl Balancer {
    /// A balancer over `n` replicas (at least one).
    pub(crate) fn new(
        policy: Balance,
        n: usize,
        rng: ChaCha8Rng,
        ewma: EwmaParams,
        ejection: Option<Ejection>,
    ) -> Self {
        let histogram = ejection
            .is_some_and(|e| e.latency_factor.is_some() && e.latency_stat == LatencyStat::P99);
        let epoch = Instant::now();
        Balancer {
            policy,
            endpoints: (0..n).map(|_| Endpoint::new(histogram)).collect(),
            next: AtomicUsize::new(0),
            rng: Mutex::new(rng),
            epoch,
            ewma,
            ejector: ejection.map(|rules| Ejector {
                rules,
                max_ejected: ((rules.max_share * n as f64).floor() as usize).max(1),
                next_judgement: AtomicU64::new(nanos(rules.interval)),
                deciding: Mutex::new(()),
            }),
            unpickable: AtomicUsize::new(0),
        }
    }

    /// Whether answers must be fed to [`Balancer::observe`].
    pub(crate) fn observes(&self) -> bool {
        self.policy == Balance::Ewma || self.ejector.is_some()
    }

    fn now_ns(&self, now: Instant) -> u64 {
        nanos(now.saturating_duration_since(self.epoch))
    }

    /// The requests in flight to replica `i`.
    pub(crate) fn in_flight(&self, i: usize) -> &AtomicUsize {
        &self.endpoints[i].in_flight
    }

    /// Whether replica `i` is in TRANSIENT_FAILURE.
    pub(crate) fn is_down(&self, i: usize) -> bool {
        self.endpoints[i].down.load(Ordering::Relaxed)
    }

    /// Puts replica `i` in or out of TRANSIENT_FAILURE; true if that
    /// changed its state.
    pub(crate) fn set_down(&self, i: usize, down: bool) -> bool {
        let state = &self.endpoints[i].down;
        // Read first: a per-request connection reports every connect.
        let changed =
            state.load(Ordering::Acquire) != down && state.swap(down, Ordering::AcqRel) != down;
        if changed {
            if down {
                self.unpickable.fetch_add(1, Ordering::AcqRel);
            } else {
                self.unpickable.fetch_sub(1, Ordering::AcqRel);
            }
        }
        changed
    }

    /// When replica `i`'s probe tries next.
    pub(crate) fn set_retry_at(&self, i: usize, at: Instant) {
        self.endpoints[i]
            .retry_at
            .store(self.now_ns(at), Ordering::Relaxed);
    }

    /// A replica per the policy among the pickable ones; `None` if there
    /// is none.
    pub(crate) fn pick_pickable(&self, now: Instant, log: &EndpointLog) -> Option<usize> {
        self.pick_except(now, log, None)
    }

    /// A pickable replica other than `except` (where a call could not be
    /// sent), per the policy; `None` if there is none.
    pub(crate) fn pick_other(
        &self,
        now: Instant,
        log: &EndpointLog,
        except: usize,
    ) -> Option<usize> {
        self.pick_except(now, log, Some(except))
    }

    fn pick_except(&self, now: Instant, log: &EndpointLog, except: Option<usize>) -> Option<usize> {
        let n = self.endpoints.len();
        if except.is_none() && self.unpickable.load(Ordering::Acquire) == 0 {
            return Some(self.choose(n, Some, now));
        }
        let now_ns = self.now_ns(now);
        self.readmit_expired(now_ns, log);
        let candidate = |i: usize, e: &Endpoint| Some(i) != except && e.pickable(now_ns);
        let m = self
            .endpoints
            .iter()
            .enumerate()
            .filter(|&(i, e)| candidate(i, e))
            .count();
        if m == 0 {
            return None;
        }
        let nth = |k: usize| {
            self.endpoints
                .iter()
                .enumerate()
                .filter(|&(i, e)| candidate(i, e))
                .nth(k)
                .map(|(i, _)| i)
        };
        // None if a replica changed state between the count and the pick.
        Some(self.choose(m, nth, now)).filter(|&i| i < n)
    }

    /// A replica per the policy; with none pickable, a healthy replica
    /// though ejected (the ejection rules never meant to leave none),
    /// else the one whose reconnect comes soonest: the call then tries to
    /// connect itself.
    pub(crate) fn pick(&self, now: Instant, log: &EndpointLog) -> usize {
        if let Some(i) = self.pick_pickable(now, log) {
            return i;
        }
        let healthy = (0..self.endpoints.len())
            .filter(|&i| !self.is_down(i))
            .min_by_key(|&i| self.endpoints[i].in_flight.load(Ordering::Relaxed));
        healthy.unwrap_or_else(|| {
            (0..self.endpoints.len())
                .min_by_key(|&i| self.endpoints[i].retry_at.load(Ordering::Relaxed))
                .unwrap_or(0)
        })
    }

    /// Applies the policy to `m` candidates, the k-th being replica
    /// `nth(k)` (`usize::MAX` if it vanished).
    fn choose(&self, m: usize, nth: impl Fn(usize) -> Option<usize>, now: Instant) -> usize {
        let at = |k: usize| nth(k).unwrap_or(usize::MAX);
        if m == 1 {
            return at(0);
        }
        match self.policy {
            Balance::RoundRobin => at(self.next.fetch_add(1, Ordering::Relaxed) % m),
            Balance::Random => at(self.with_rng(|rng| rng.random_range(0..m))),
            Balance::P2c | Balance::Ewma => {
                let (a, b) = self.with_rng(|rng| {
                    let a = rng.random_range(0..m);
                    (a, (a + rng.random_range(1..m)) % m)
                });
                let (a, b) = (at(a), at(b));
                if a == usize::MAX || b == usize::MAX {
                    return a.min(b);
                }
                if self.policy == Balance::P2c {
                    let load = |i: usize| self.endpoints[i].in_flight.load(Ordering::Relaxed);
                    if load(b) < load(a) { b } else { a }
                } else {
                    let now_ns = self.now_ns(now);
                    if self.cost(b, now_ns) < self.cost(a, now_ns) {
                        b
                    } else {
                        a
                    }
                }
            }
        }
    }

    fn with_rng<T>(&self, f: impl FnOnce(&mut ChaCha8Rng) -> T) -> T {
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut rng)
    }

    /// Replica `i`'s latency estimate at `now_ns`, in ns: `default_rtt`
    /// until its first answer; after, the peak-EWMA, decayed toward zero
    /// since its last answer (Finagle's and Linkerd's: a replica left
    /// alone is tried again, and a slow one that recovered is noticed).
    fn estimate(&self, i: usize, now_ns: u64) -> f64 {
        let e = &self.endpoints[i];
        if !e.observed.load(Ordering::Acquire) {
            return nanos(self.ewma.default_rtt) as f64;
        }
        let value = f64::from_bits(e.ewma_ns.load(Ordering::Relaxed));
        let elapsed = now_ns.saturating_sub(e.ewma_at.load(Ordering::Relaxed));
        value * self.weight(elapsed)
    }

    /// exp(-elapsed / decay).
    fn weight(&self, elapsed_ns: u64) -> f64 {
        let decay = nanos(self.ewma.decay).max(1) as f64;
        (-(elapsed_ns as f64) / decay).exp()
    }

    /// Peak-EWMA's cost: the estimate times (requests in flight + 1).
    fn cost(&self, i: usize, now_ns: u64) -> f64 {
        let pending = self.endpoints[i].in_flight.load(Ordering::Relaxed) as f64;
        self.estimate(i, now_ns) * (pending + 1.0)
    }

    /// Feeds a call's end to the EWMA and to the ejection rules: replica
    /// `i` took `rtt` to end with `outcome`.
    ///
    /// A failed call's time counts too, but it can only raise the EWMA,
    /// never lower it: a replica that fails fast must not look fast.
    pub(crate) fn observe(
        &self,
        i: usize,
        rtt: Duration,
        outcome: Outcome,
        now: Instant,
        log: &EndpointLog,
    ) {
        let now_ns = self.now_ns(now);
        let rtt_ns = nanos(rtt);
        if self.policy == Balance::Ewma {
            self.update_ewma(i, rtt_ns as f64, outcome == Outcome::Error, now_ns);
        }
        let Some(ejector) = &self.ejector else {
            return;
        };
        let e = &self.endpoints[i];
        if ejector.rules.latency_factor.is_some() {
            e.window_count.fetch_add(1, Ordering::Relaxed);
            e.window_sum_ns.fetch_add(rtt_ns, Ordering::Relaxed);
            if let Some(bucket) = e.window_hist.get(bucket_of(rtt_ns)) {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some(limit) = ejector.rules.consecutive_errors {
            match outcome {
                Outcome::Error => {
                    let run = e.consecutive.fetch_add(1, Ordering::AcqRel) + 1;
                    if run >= limit.max(1) {
                        e.consecutive.store(0, Ordering::Release);
                        self.eject(i, now_ns, || format!("{run} consecutive errors"), log);
                    }
                }
                Outcome::Fine => {
                    if e.consecutive.load(Ordering::Relaxed) != 0 {
                        e.consecutive.store(0, Ordering::Relaxed);
                    }
                }
                Outcome::Neutral => {}
            }
        }
        if ejector.rules.latency_factor.is_some()
            && now_ns >= ejector.next_judgement.load(Ordering::Relaxed)
        {
            self.judge(now_ns, log);
        }
    }

    fn update_ewma(&self, i: usize, rtt_ns: f64, failed: bool, now_ns: u64) {
        let e = &self.endpoints[i];
        // Racing updates may lose one another's sample: an estimate, not a
        // ledger, and no lock on the call path.
        let next = if e.observed.load(Ordering::Acquire) {
            let stored = f64::from_bits(e.ewma_ns.load(Ordering::Relaxed));
            let elapsed = now_ns.saturating_sub(e.ewma_at.load(Ordering::Relaxed));
            let w = self.weight(elapsed);
            let current = stored * w;
            let rtt = if failed { rtt_ns.max(current) } else { rtt_ns };
            if rtt > current {
                rtt
            } else {
                stored * w + rtt * (1.0 - w)
            }
        } else {
            rtt_ns
        };
        e.ewma_ns.store(next.to_bits(), Ordering::Relaxed);
        e.ewma_at.store(now_ns, Ordering::Relaxed);
        e.observed.store(true, Ordering::Release);
    }

    /// Ends the ejections that are over, each with a READMITTED event.
    fn readmit_expired(&self, now_ns: u64, log: &EndpointLog) {
        for (i, e) in self.endpoints.iter().enumerate() {
            let until = e.ejected_until.load(Ordering::Acquire);
            if until != 0
                && until <= now_ns
                && e.ejected_until
                    .compare_exchange(until, 0, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                self.unpickable.fetch_sub(1, Ordering::AcqRel);
                log.event(i, EndpointEventKind::Readmitted, "ejection time over");
            }
        }
    }

    /// Ejects replica `i` unless that would leave more than `max_ejected`
    /// ejected or no replica pickable; true if it did.
    fn eject(
        &self,
        i: usize,
        now_ns: u64,
        reason: impl FnOnce() -> String,
        log: &EndpointLog,
    ) -> bool {
        let Some(ejector) = &self.ejector else {
            return false;
        };
        let _deciding = ejector.deciding.lock().unwrap_or_else(|e| e.into_inner());
        self.readmit_expired(now_ns, log);
        let e = &self.endpoints[i];
        if e.ejected(now_ns) {
            return false;
        }
        let ejected = self.endpoints.iter().filter(|e| e.ejected(now_ns)).count();
        let others = self
            .endpoints
            .iter()
            .enumerate()
            .filter(|&(j, e)| j != i && e.pickable(now_ns))
            .count();
        if ejected >= ejector.max_ejected || others == 0 {
            return false;
        }
        let times = e.ejections.fetch_add(1, Ordering::AcqRel).saturating_add(1);
        let length = ejector
            .rules
            .base_time
            .saturating_mul(times)
            .min(ejector.rules.max_time);
        let until = now_ns.saturating_add(nanos(length)).max(now_ns + 1);
        e.ejected_until.store(until, Ordering::Release);
        self.unpickable.fetch_add(1, Ordering::AcqRel);
        log.event(
            i,
            EndpointEventKind::Ejected,
            format!("{} (for {length:?})", reason()),
        );
        true
    }

    /// The latency rule, once per interval: replicas with at least
    /// `min_requests` answers whose statistic is `latency_factor` times the
    /// median of their peers' (those with enough answers too) are ejected,
    /// the worst first, within the limits. The windows start again.
    fn judge(&self, now_ns: u64, log: &EndpointLog) {
        let Some(ejector) = &self.ejector else {
            return;
        };
        let Some(factor) = ejector.rules.latency_factor else {
            return;
        };
        let interval = nanos(ejector.rules.interval).max(1);
        let due = ejector.next_judgement.load(Ordering::Acquire);
        if now_ns < due
            || ejector
                .next_judgement
                .compare_exchange(due, now_ns + interval, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return;
        }
        let stats: Vec<(usize, f64)> = self
            .endpoints
            .iter()
            .enumerate()
            .filter(|(_, e)| !e.ejected(now_ns))
            .filter_map(|(i, e)| {
                let count = e.window_count.load(Ordering::Relaxed);
                (count >= u64::from(ejector.rules.min_requests.max(1)))
                    .then(|| (i, self.statistic(e, count, ejector.rules.latency_stat)))
            })
            .collect();
        for e in &self.endpoints {
            e.window_count.store(0, Ordering::Relaxed);
            e.window_sum_ns.store(0, Ordering::Relaxed);
            for b in e.window_hist.iter() {
                b.store(0, Ordering::Relaxed);
            }
        }
        let mut outliers: Vec<(usize, f64, f64)> = stats
            .iter()
            .filter_map(|&(i, stat)| {
                let mut peers: Vec<f64> = stats
                    .iter()
                    .filter(|&&(j, _)| j != i)
                    .map(|&(_, s)| s)
                    .collect();
                let median = median(&mut peers)?;
                (median > 0.0 && stat >= factor * median).then_some((i, stat, stat / median))
            })
            .collect();
        outliers.sort_by(|a, b| b.2.total_cmp(&a.2));
        let name = match ejector.rules.latency_stat {
            LatencyStat::Mean => "mean",
            LatencyStat::P99 => "p99",
        };
        for (i, stat, ratio) in outliers {
            self.eject(
                i,
                now_ns,
                || format!("{name} {:.1} ms = {ratio:.1}x peers'", stat / 1e6),
                log,
            );
        }
    }

    /// The window's mean or p99 (the upper edge of its bucket), in ns.
    fn statistic(&self, e: &Endpoint, count: u64, stat: LatencyStat) -> f64 {
        match stat {
            LatencyStat::Mean => e.window_sum_ns.load(Ordering::Relaxed) as f64 / count as f64,
            LatencyStat::P99 => {
                let total: u64 = e
                    .window_hist
                    .iter()
                    .map(|b| u64::from(b.load(Ordering::Relaxed)))
                    .sum();
                let rank = (total as f64 * 0.99).ceil() as u64;
                let mut seen = 0;
                for (k, b) in e.window_hist.iter().enumerate() {
                    seen += u64::from(b.load(Ordering::Relaxed));
                    if seen >= rank.max(1) {
                        return bucket_upper_ns(k);
                    }
                }
                bucket_upper_ns(BUCKETS - 1)
            }
        }
    }
}

/// The median of `values` (sorted in place); `None` if empty.
fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    })
}

fn bucket_of(ns: u64) -> usize {
    let us = ns as f64 / 1e3;
    if us <= 1.0 {
        return 0;
    }
    ((us.log2() * 4.0) as usize).min(BUCKETS - 1)
}

fn bucket_upper_ns(k: usize) -> f64 {
    ((k + 1) as f64 / 4.0).exp2() * 1e3
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn ejection() -> Ejection {
        Ejection {
            consecutive_errors: Some(3),
            latency_factor: None,
            latency_stat: LatencyStat::Mean,
            interval: Duration::from_secs(1),
            min_requests: 10,
            base_time: Duration::from_secs(30),
            max_time: Duration::from_secs(300),
            max_share: 0.5,
        }
    }

    fn balancer(policy: Balance, n: usize, ejection: Option<Ejection>) -> Balancer {
        Balancer::new(
            policy,
            n,
            ChaCha8Rng::seed_from_u64(7),
            EwmaParams::default(),
            ejection,
        )
    }

    fn events(log: &EndpointLog) -> Vec<(u32, EndpointEventKind)> {
        log.snapshot("h")
            .events
            .iter()
            .map(|e| {
                (
                    e.replica,
                    EndpointEventKind::try_from(e.kind).unwrap_or(EndpointEventKind::Unspecified),
                )
            })
            .collect()
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn outcomes_count_server_and_transport_errors_only() {
        for code in [
            Code::Unavailable,
            Code::Internal,
            Code::Unknown,
            Code::DataLoss,
            Code::DeadlineExceeded,
        ] {
            assert_eq!(Outcome::of(code), Outcome::Error, "{code:?}");
        }
        assert_eq!(Outcome::of(Code::Ok), Outcome::Fine);
        assert_eq!(Outcome::of(Code::InvalidArgument), Outcome::Fine);
        assert_eq!(Outcome::of(Code::Cancelled), Outcome::Neutral);
        assert_eq!(Outcome::of(Code::ResourceExhausted), Outcome::Neutral);
    }

    #[test]
    fn ewma_prefers_the_replica_observed_faster() {
        let b = balancer(Balance::Ewma, 2, None);
        let log = EndpointLog::new(2);
        let t = Instant::now();
        b.observe(0, 50 * MS, Outcome::Fine, t, &log);
        b.observe(1, 5 * MS, Outcome::Fine, t, &log);
        assert!((0..100).all(|_| b.pick(t, &log) == 1));
        // Twice as many in flight at the fast one do not outweigh 10x.
        b.in_flight(1).store(2, Ordering::Relaxed);
        assert!((0..100).all(|_| b.pick(t, &log) == 1));
        // Ten more in flight do.
        b.in_flight(1).store(12, Ordering::Relaxed);
        assert!((0..100).all(|_| b.pick(t, &log) == 0));
    }

    #[test]
    fn ewma_peaks_at_once_and_comes_down_with_decay() {
        let b = balancer(Balance::Ewma, 1, None);
        let log = EndpointLog::new(1);
        let t = Instant::now();
        assert_eq!(b.estimate(0, b.now_ns(t)), 30e6, "default_rtt unobserved");
        b.observe(0, 10 * MS, Outcome::Fine, t, &log);
        b.observe(0, 100 * MS, Outcome::Fine, t + MS, &log);
        let peak = b.estimate(0, b.now_ns(t + MS));
        assert!((peak - 100e6).abs() < 1.0, "{peak}");
        // One decay time later a 10 ms answer weighs 1 - 1/e.
        let later = t + MS + Duration::from_secs(10);
        b.observe(0, 10 * MS, Outcome::Fine, later, &log);
        let blended = b.estimate(0, b.now_ns(later));
        let expected = 100e6 / std::f64::consts::E + 10e6 * (1.0 - 1.0 / std::f64::consts::E);
        assert!((blended - expected).abs() < 1e3, "{blended} vs {expected}");
        // A fast failure does not lower it.
        b.observe(0, MS / 10, Outcome::Error, later, &log);
        assert!(b.estimate(0, b.now_ns(later)) >= blended - 1.0);
    }

    /// Calls arrive every 2 ms for 100 s, each answered after its
    /// replica's latency (1 ms or 10x that), both observed once first; the
    /// slow replica gets a small share, and is tried again now and then as
    /// its estimate decays.
    #[test]
    fn a_ten_times_slower_replica_gets_fewer_picks() {
        let b = balancer(Balance::Ewma, 2, None);
        let log = EndpointLog::new(2);
        let start = Instant::now();
        let latency = [MS, 10 * MS];
        for (i, rtt) in latency.iter().enumerate() {
            b.observe(i, *rtt, Outcome::Fine, start, &log);
        }
        // (answer time, replica) of the calls in flight.
        let mut pending: Vec<(Duration, usize)> = Vec::new();
        let mut picks = [0u32; 2];
        for k in 0..50_000u32 {
            let now = 2 * MS * k;
            pending.sort();
            while pending.first().is_some_and(|&(at, _)| at <= now) {
                let (_, i) = pending.remove(0);
                b.in_flight(i).fetch_sub(1, Ordering::Relaxed);
                b.observe(i, latency[i], Outcome::Fine, start + now, &log);
            }
            let i = b.pick(start + now, &log);
            picks[i] += 1;
            b.in_flight(i).fetch_add(1, Ordering::Relaxed);
            pending.push((now + latency[i], i));
        }
        assert!(
            picks[1] * 10 < picks[0],
            "slow replica got {} picks, fast {}",
            picks[1],
            picks[0]
        );
        assert!(picks[1] > 0, "the slow replica is never tried again");
    }

    #[test]
    fn consecutive_errors_eject_and_the_ejection_ends() {
        let b = balancer(Balance::RoundRobin, 3, Some(ejection()));
        let log = EndpointLog::new(3);
        let t = Instant::now();
        b.observe(2, MS, Outcome::Error, t, &log);
        b.observe(2, MS, Outcome::Error, t, &log);
        b.observe(2, MS, Outcome::Fine, t, &log);
        b.observe(2, MS, Outcome::Error, t, &log);
        b.observe(2, MS, Outcome::Neutral, t, &log);
        b.observe(2, MS, Outcome::Error, t, &log);
        assert!(events(&log).is_empty(), "a success breaks the run");
        b.observe(2, MS, Outcome::Error, t, &log);
        assert_eq!(events(&log), vec![(2, EndpointEventKind::Ejected)]);
        assert!((0..30).all(|_| b.pick(t, &log) != 2));
        // 30 s later it is back, once.
        let back = t + Duration::from_secs(30);
        let picks: Vec<usize> = (0..30).map(|_| b.pick(back, &log)).collect();
        assert!(picks.contains(&2), "{picks:?}");
        assert_eq!(
            events(&log),
            vec![
                (2, EndpointEventKind::Ejected),
                (2, EndpointEventKind::Readmitted)
            ]
        );
        // Ejected again: twice as long.
        for _ in 0..3 {
            b.observe(2, MS, Outcome::Error, back, &log);
        }
        assert!((0..30).all(|_| b.pick(back + Duration::from_secs(59), &log) != 2));
        assert!((0..30).any(|_| b.pick(back + Duration::from_secs(60), &log) == 2));
        assert_eq!(log.snapshot("h").replicas[2].ejections, 2);
        assert_eq!(log.snapshot("h").replicas[2].readmissions, 2);
    }

    #[test]
    fn the_latency_rule_ejects_the_replica_far_above_its_peers() {
        for stat in [LatencyStat::Mean, LatencyStat::P99] {
            let rules = Ejection {
                consecutive_errors: None,
                latency_factor: Some(3.0),
                latency_stat: stat,
                ..ejection()
            };
            let b = balancer(Balance::RoundRobin, 4, Some(rules));
            let log = EndpointLog::new(4);
            let t = Instant::now();
            for k in 0..20u32 {
                let at = t + MS * k;
                for i in 0..4 {
                    let rtt = if i == 1 {
                        40 * MS
                    } else {
                        10 * MS + MS * i as u32
                    };
                    b.observe(i, rtt, Outcome::Fine, at, &log);
                }
            }
            assert!(
                events(&log).is_empty(),
                "{stat:?}: judged before the interval"
            );
            // The interval ends at the next answer after it.
            b.observe(0, 10 * MS, Outcome::Fine, t + Duration::from_secs(1), &log);
            assert_eq!(
                events(&log),
                vec![(1, EndpointEventKind::Ejected)],
                "{stat:?}"
            );
            let reason = &log.snapshot("h").events[0].reason;
            assert!(reason.contains("x peers'"), "{reason}");
        }
    }

    #[test]
    fn too_few_answers_are_not_judged() {
        let rules = Ejection {
            consecutive_errors: None,
            latency_factor: Some(3.0),
            ..ejection()
        };
        let b = balancer(Balance::RoundRobin, 2, Some(rules));
        let log = EndpointLog::new(2);
        let t = Instant::now();
        for i in 0..2 {
            for _ in 0..9 {
                b.observe(
                    i,
                    if i == 1 { 100 * MS } else { MS },
                    Outcome::Fine,
                    t,
                    &log,
                );
            }
        }
        b.observe(0, MS, Outcome::Fine, t + Duration::from_secs(1), &log);
        assert!(events(&log).is_empty());
    }

    #[test]
    fn max_share_and_the_last_replica_hold() {
        // 4 replicas, max_share 0.5: at most 2 ejected.
        let b = balancer(Balance::RoundRobin, 4, Some(ejection()));
        let log = EndpointLog::new(4);
        let t = Instant::now();
        for i in 0..4 {
            for _ in 0..3 {
                b.observe(i, MS, Outcome::Error, t, &log);
            }
        }
        assert_eq!(
            log.snapshot("h")
                .replicas
                .iter()
                .map(|r| r.ejections)
                .sum::<u64>(),
            2
        );
        // 2 replicas, max_share 1: never both.
        let b = balancer(
            Balance::RoundRobin,
            2,
            Some(Ejection {
                max_share: 1.0,
                ..ejection()
            }),
        );
        let log = EndpointLog::new(2);
        for i in 0..2 {
            for _ in 0..3 {
                b.observe(i, MS, Outcome::Error, t, &log);
            }
        }
        assert_eq!(events(&log), vec![(0, EndpointEventKind::Ejected)]);
        // Nor the last one left when the other is down.
        let b = balancer(
            Balance::RoundRobin,
            2,
            Some(Ejection {
                max_share: 1.0,
                ..ejection()
            }),
        );
        let log = EndpointLog::new(2);
        b.set_down(0, true);
        for _ in 0..3 {
            b.observe(1, MS, Outcome::Error, t, &log);
        }
        assert!(events(&log).is_empty());
        assert!((0..10).all(|_| b.pick(t, &log) == 1));
    }

    #[test]
    fn replicas_down_are_not_picked_until_back() {
        for policy in [
            Balance::RoundRobin,
            Balance::Random,
            Balance::P2c,
            Balance::Ewma,
        ] {
            let b = balancer(policy, 3, None);
            let log = EndpointLog::new(3);
            let t = Instant::now();
            assert!(b.set_down(1, true));
            assert!(!b.set_down(1, true));
            assert!((0..60).all(|_| b.pick(t, &log) != 1), "{policy:?}");
            let picks: Vec<usize> = (0..60).map(|_| b.pick(t, &log)).collect();
            assert!(picks.contains(&0) && picks.contains(&2), "{policy:?}");
            assert!(b.set_down(1, false));
            assert!((0..60).any(|_| b.pick(t, &log) == 1), "{policy:?}");
        }
    }

    #[test]
    fn a_redirected_call_goes_to_another_pickable_replica() {
        let b = balancer(Balance::RoundRobin, 3, None);
        let log = EndpointLog::new(3);
        let t = Instant::now();
        assert!((0..30).all(|_| b.pick_other(t, &log, 1) != Some(1)));
        b.set_down(2, true);
        assert!((0..30).all(|_| b.pick_other(t, &log, 1) == Some(0)));
        b.set_down(0, true);
        assert_eq!(b.pick_other(t, &log, 1), None);
    }

    #[test]
    fn with_all_down_the_soonest_retry_is_picked() {
        let b = balancer(Balance::P2c, 3, None);
        let log = EndpointLog::new(3);
        let t = Instant::now();
        for i in 0..3 {
            b.set_down(i, true);
        }
        b.set_retry_at(0, t + Duration::from_secs(3));
        b.set_retry_at(1, t + Duration::from_secs(1));
        b.set_retry_at(2, t + Duration::from_secs(2));
        assert_eq!(b.pick_pickable(t, &log), None);
        assert_eq!(b.pick(t, &log), 1);
    }

    #[test]
    fn buckets_are_ordered_and_bound_their_values() {
        for ns in [500u64, 1_500, 1_000_000, 123_456_789, 10_000_000_000] {
            let k = bucket_of(ns);
            assert!(bucket_upper_ns(k) >= ns as f64, "{ns}");
            assert!(
                k == 0 || bucket_upper_ns(k - 1) <= ns as f64 * 1.2 + 1e3,
                "{ns}"
            );
        }
    }
}
