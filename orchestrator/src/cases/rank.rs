//! Rankings of suspected root causes, services first to last: tailmesh's
//! own, from its attribution of the window's slow and failed requests,
//! and two simple baselines, the service whose p99 rose most and the
//! service with the most own time in slow traces. Pure: no I/O.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tailmesh_analysis::attribution::{CauseKind, attribute};
use tailmesh_analysis::record::{Outcome, RequestRecord};
use tailmesh_import::tree::Invocation;

use super::series::Series;

/// A method's ranking for one case: every service, most suspect first,
/// with the score that put it there.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ranking {
    pub method: String,
    pub ranking: Vec<Suspect>,
}

/// One service in a ranking.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Suspect {
    pub service: String,
    pub score: f64,
}

/// The names of the built-in methods.
pub const TAILMESH: &str = "tailmesh";
pub const P99_RISE: &str = "p99-rise";
pub const SLOW_OWN_TIME: &str = "slow-own-time";

/// Orders `scores` (one per service) highest first, ties by name.
fn ranked(method: &str, scores: BTreeMap<String, f64>) -> Ranking {
    let mut ranking: Vec<Suspect> = scores
        .into_iter()
        .map(|(service, score)| Suspect { service, score })
        .collect();
    ranking.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.service.cmp(&b.service)));
    Ranking {
        method: method.to_owned(),
        ranking,
    }
}

/// tailmesh's blame, built one request at a time: each slow request's
/// causes (its critical path's components of at least a quarter of the
/// threshold) charged to where they happened, and each failed request
/// the threshold charged to the hop its error names; the score is the
/// charge per request in the window less the charge per request before
/// it: what the window added.
///
/// A hop's queue wait, work or injected delay is the hop's. Network time
/// is charged to its link, caller to callee: a fault on a service's link
/// (loss, delay) touches every link it has, in and out, while a neighbour
/// shares only one of them with it. So a service's network score is the
/// least its links gained (zero unless all of them did) plus what they
/// gained together: the faulty service has both, a neighbour only the one
/// link it shares. Every cause maps to a service whatever its kind, so
/// whether the hop flagged its slowness as injected plays no part.
pub struct Blame {
    hops: Vec<String>,
    threshold: Duration,
    window: (f64, f64),
    /// Requests and charges before the window and in it, by hop and by
    /// link (`(caller, callee)`, the caller `loadgen` for an entry hop).
    before: Charges,
    during: Charges,
    /// Every link ok requests crossed.
    links: std::collections::BTreeSet<(String, String)>,
}

#[derive(Default)]
struct Charges {
    requests: u64,
    hops: BTreeMap<String, f64>,
    links: BTreeMap<(String, String), f64>,
}

impl Charges {
    fn per_request<K: Ord>(map: &BTreeMap<K, f64>, key: &K, requests: u64) -> f64 {
        map.get(key).copied().unwrap_or(0.0) / requests.max(1) as f64
    }
}

impl Blame {
    pub fn new(hops: Vec<String>, threshold: Duration, window: (f64, f64)) -> Blame {
        Blame {
            hops,
            threshold,
            window,
            before: Charges::default(),
            during: Charges::default(),
            links: Default::default(),
        }
    }

    pub fn record(&mut self, r: &RequestRecord) {
        for h in &r.path {
            let caller = if h.parent.is_empty() {
                "loadgen"
            } else {
                &h.parent
            };
            let link = (caller, h.hop.as_str());
            if !self
                .links
                .iter()
                .any(|(f, t)| (f.as_str(), t.as_str()) == link)
            {
                self.links.insert((caller.to_owned(), h.hop.clone()));
            }
        }
        let at = r.intended.as_secs_f64();
        let charges = if at < self.window.0 {
            &mut self.before
        } else if at < self.window.1 {
            &mut self.during
        } else {
            return;
        };
        charges.requests += 1;
        let hops = &self.hops;
        let mut charge = |hop: &str, seconds: f64| {
            if hops.iter().any(|h| h == hop) {
                *charges.hops.entry(hop.to_owned()).or_default() += seconds;
            }
        };
        match &r.outcome {
            Outcome::Ok => {
                let Some(a) = attribute(r, self.threshold) else {
                    return;
                };
                for c in a.causes() {
                    let d = c.duration.as_secs_f64();
                    match (c.kind, c.from.as_deref(), c.hop.as_deref()) {
                        (CauseKind::Network, from, Some(to)) => {
                            let link = (from.unwrap_or("loadgen").to_owned(), to.to_owned());
                            *charges.links.entry(link).or_default() += d;
                        }
                        (_, _, Some(hop)) => charge(hop, d),
                        _ => {}
                    }
                }
            }
            Outcome::Error { message, .. } => {
                if let Some(hop) = tailmesh_analysis::variant::blamed_hop(message) {
                    charge(hop, self.threshold.as_secs_f64());
                }
            }
            Outcome::Timeout => {}
        }
    }

    pub fn finish(self) -> Ranking {
        let (b, d) = (&self.before, &self.during);
        let gained = |link: &(String, String)| {
            (Charges::per_request(&d.links, link, d.requests)
                - Charges::per_request(&b.links, link, b.requests))
            .max(0.0)
        };
        let scores = self
            .hops
            .iter()
            .map(|h| {
                let own = Charges::per_request(&d.hops, h, d.requests)
                    - Charges::per_request(&b.hops, h, b.requests);
                let links: Vec<f64> = self
                    .links
                    .iter()
                    .filter(|(from, to)| from == h || to == h)
                    .map(gained)
                    .collect();
                let least = links.iter().copied().reduce(f64::min).unwrap_or(0.0);
                (h.clone(), own + least + links.iter().sum::<f64>())
            })
            .collect();
        ranked(TAILMESH, scores)
    }
}

/// The service whose p99 rose most: its mean p99 over the window's
/// seconds over its mean p99 before the window (a service without
/// requests in either scores 0).
pub fn p99_rise(series: &Series, window: (f64, f64)) -> Ranking {
    let before = series.mean_p99(0.0, window.0);
    let during = series.mean_p99(window.0, window.1);
    let scores = series
        .hops
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let rise = match (before[i], during[i]) {
                (Some(b), Some(d)) if b > 0.0 => d / b,
                _ => 0.0,
            };
            (h.clone(), rise)
        })
        .collect();
    ranked(P99_RISE, scores)
}

/// The service with the most own time in slow traces: over the traces
/// whose root started in the window (Unix seconds) and lasted longer than
/// the threshold, each service's own time summed (a service named
/// `hop-<hop>` is the hop).
pub fn slow_own_time(
    hops: &[String],
    traces: &[Vec<Invocation>],
    window_unix_s: (f64, f64),
    threshold: Duration,
) -> Ranking {
    let mut scores: BTreeMap<String, f64> = hops.iter().map(|h| (h.clone(), 0.0)).collect();
    for roots in traces {
        for root in roots {
            let start_s = root.start as f64 / 1e9;
            if start_s < window_unix_s.0
                || start_s >= window_unix_s.1
                || (root.duration() as f64) / 1e9 <= threshold.as_secs_f64()
            {
                continue;
            }
            for inv in root.walk() {
                let name = inv.service.strip_prefix("hop-").unwrap_or(&inv.service);
                if let Some(score) = scores.get_mut(name) {
                    *score += inv.own_time() as f64 / 1e9;
                }
            }
        }
    }
    ranked(SLOW_OWN_TIME, scores)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cases::series::SeriesAcc;
    use tailmesh_analysis::record::{GrpcCode, HopRecord};

    fn hop(name: &str, parent: &str, total_ms: u64, service_ms: u64) -> HopRecord {
        HopRecord {
            hop: name.to_owned(),
            parent: parent.to_owned(),
            total_ns: total_ms * 1_000_000,
            service_ns: service_ms * 1_000_000,
            ..HopRecord::default()
        }
    }

    fn chain(intended_ms: u64, b_ms: u64) -> RequestRecord {
        let path = vec![
            hop("a", "", b_ms + 2, 1),
            hop("b", "a", b_ms + 1, b_ms),
            hop("c", "b", 1, 1),
        ];
        let mut r = crate::cases::series::tests::record(intended_ms, Outcome::Ok, path);
        r.end = r.intended + Duration::from_millis(b_ms + 2);
        r
    }

    #[test]
    fn tailmesh_blames_the_hop_whose_time_the_window_added() {
        let hops = ["a", "b", "c"].map(String::from).to_vec();
        let mut blame = Blame::new(hops.clone(), Duration::from_millis(15), (1.0, 2.0));
        for i in 0..100 {
            blame.record(&chain(i * 10, 1));
            // In the window a fifth of b's requests take 30 ms.
            blame.record(&chain(1_000 + i * 10, if i % 5 == 0 { 30 } else { 1 }));
        }
        let r = blame.finish();
        assert_eq!(r.ranking[0].service, "b", "{r:?}");
        assert!(r.ranking[0].score > 0.0);
        assert_eq!(r.ranking.len(), 3);

        let mut blame = Blame::new(hops, Duration::from_millis(15), (1.0, 2.0));
        for i in 0..10 {
            blame.record(&chain(i * 100, 1));
            blame.record(&crate::cases::series::tests::record(
                1_000 + i * 10,
                Outcome::Error {
                    code: GrpcCode::Unavailable,
                    message: "hop \"a\" replica 0: injected error at hop \"c\" replica 0".into(),
                },
                Vec::new(),
            ));
        }
        assert_eq!(blame.finish().ranking[0].service, "c");
    }

    /// A chain a -> b -> c whose network time into and out of `slow`
    /// grows by `ms` in the window.
    fn links(intended_ms: u64, slow: &str, ms: u64) -> RequestRecord {
        let extra = |to: &str, from: &str| if to == slow || from == slow { ms } else { 0 };
        let (ab, bc) = (extra("b", "a"), extra("c", "b"));
        let la = extra("a", "loadgen");
        // Each hop's time to answer covers its callee's and the link to it.
        let c = hop("c", "b", 1, 1);
        let b = hop("b", "a", 2 + bc, 1);
        let a = hop("a", "", 3 + bc + ab, 1);
        let mut r = crate::cases::series::tests::record(intended_ms, Outcome::Ok, vec![a, b, c]);
        r.start = r.intended;
        r.end = r.intended + Duration::from_millis(3 + bc + ab + la);
        r
    }

    #[test]
    fn a_link_fault_is_blamed_on_the_service_all_of_whose_links_gained() {
        let hops = ["a", "b", "c"].map(String::from).to_vec();
        for slow in ["a", "b", "c"] {
            let mut blame = Blame::new(hops.clone(), Duration::from_millis(15), (1.0, 2.0));
            for i in 0..100 {
                blame.record(&links(i * 10, slow, 0));
                blame.record(&links(
                    1_000 + i * 10,
                    slow,
                    if i % 4 == 0 { 20 } else { 0 },
                ));
            }
            let r = blame.finish();
            assert_eq!(r.ranking[0].service, slow, "{r:?}");
            assert!(r.ranking[0].score > r.ranking[1].score, "{r:?}");
        }
    }

    #[test]
    fn the_p99_baseline_ranks_by_rise_and_the_trace_baseline_by_own_time() {
        let hops = ["a", "b", "c"].map(String::from).to_vec();
        let mut acc = SeriesAcc::new(hops.clone());
        for i in 0..200 {
            acc.record(&chain(i * 10, if i >= 100 { 10 } else { 1 }));
        }
        let rise = p99_rise(&acc.finish(2, &[], &[]), (1.0, 2.0));
        assert_eq!(rise.ranking[0].service, "b");
        assert_eq!(rise.ranking[2].service, "c");
        assert!((rise.ranking[2].score - 1.0).abs() < 0.01, "{rise:?}");

        let inv = |service: &str, start_ms: i64, end_ms: i64, own_ms: i64, children| Invocation {
            service: service.to_owned(),
            instance: None,
            operation: "x".into(),
            start: start_ms * 1_000_000,
            end: end_ms * 1_000_000,
            called_at: start_ms * 1_000_000,
            returned_at: end_ms * 1_000_000,
            error: false,
            own: Some(own_ms * 1_000_000),
            children,
            detached: Vec::new(),
        };
        let trace = |at_ms: i64, c_ms: i64| {
            vec![inv(
                "loadgen",
                at_ms,
                at_ms + c_ms + 3,
                0,
                vec![inv(
                    "hop-a",
                    at_ms,
                    at_ms + c_ms + 2,
                    1,
                    vec![inv("hop-c", at_ms, at_ms + c_ms, c_ms, vec![])],
                )],
            )]
        };
        // A slow trace in the window, a slow one before it, a fast one in it.
        let traces = vec![trace(1_500, 40), trace(500, 40), trace(1_600, 1)];
        let own = slow_own_time(&hops, &traces, (1.0, 2.0), Duration::from_millis(15));
        assert_eq!(own.ranking[0].service, "c");
        assert!((own.ranking[0].score - 0.040).abs() < 1e-9, "{own:?}");
        assert_eq!(own.ranking[1].service, "a");
        assert_eq!(own.ranking[2].score, 0.0);
    }
}
