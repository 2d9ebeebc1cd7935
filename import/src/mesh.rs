//! [`Mesh`]: what the call trees show about the system that made them. Per
//! service: how often it served, its own time as an empirical
//! distribution, its error share, its replicas. Per edge (caller, callee):
//! the share of the caller's invocations that call the callee and how many
//! times they do. Per caller: which callees run one after another and which
//! side by side, from their calls' overlap. And the entry services with
//! their mix.

use std::collections::{BTreeMap, BTreeSet};

use crate::Invocation;

/// A service as the traces show it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Service {
    /// Invocations of it.
    pub invocations: u64,
    pub errors: u64,
    /// Failed invocations whose calls all succeeded: errors of its own,
    /// not a callee's passed up.
    pub own_errors: u64,
    /// Own times in nanoseconds, sorted.
    pub own_times: Vec<i64>,
    /// The replicas seen serving it.
    pub instances: BTreeSet<String>,
    /// Invocations per operation.
    pub operations: BTreeMap<String, u64>,
}

impl Service {
    /// The `q` quantile (0..=1) of its own time, nearest rank.
    pub fn own_quantile(&self, q: f64) -> Option<i64> {
        quantile(&self.own_times, q)
    }

    pub fn error_share(&self) -> f64 {
        ratio(self.errors, self.invocations)
    }

    /// The share of its invocations that failed on their own (every call
    /// they made succeeded).
    pub fn own_error_share(&self) -> f64 {
        ratio(self.own_errors, self.invocations)
    }
}

/// Calls from one service to another.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Edge {
    /// The caller's invocations that called the callee at least once.
    pub calling: u64,
    /// Calls in all.
    pub calls: u64,
    /// How many of the calling invocations called it n times (n >= 1).
    pub per_invocation: BTreeMap<u64, u64>,
    /// Of the invocations that called it more than once: those where two
    /// of its calls overlapped in time, and those where each ended before
    /// the next began.
    pub repeats_overlapped: u64,
    pub repeats_apart: u64,
}

/// How two callees of one caller ran when both were called.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Order {
    /// Their calls overlapped in time.
    pub overlapped: u64,
    /// The first's calls all ended before the second's began.
    pub first_before: u64,
    pub second_before: u64,
}

/// The mesh the traces show.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Mesh {
    pub services: BTreeMap<String, Service>,
    /// (caller, callee) -> the calls between them.
    pub edges: BTreeMap<(String, String), Edge>,
    /// (caller, callee a, callee b) with a < b -> how their calls ran.
    pub orders: BTreeMap<(String, String, String), Order>,
    /// Root invocations per (service, operation): the entry mix.
    pub entries: BTreeMap<(String, String), u64>,
    /// Root invocations' durations (end to end, as the entry served them)
    /// in nanoseconds, sorted.
    pub end_to_end: Vec<i64>,
    /// When the first and the last root invocation started (ns).
    pub first_start: Option<i64>,
    pub last_start: Option<i64>,
}

impl Mesh {
    /// Folds every trace's call trees in.
    pub fn from_traces<'a>(traces: impl IntoIterator<Item = &'a Vec<Invocation>>) -> Mesh {
        let mut mesh = Mesh::default();
        for roots in traces {
            for root in roots {
                *mesh
                    .entries
                    .entry((root.service.clone(), operation(&root.operation)))
                    .or_default() += 1;
                mesh.end_to_end.push(root.duration());
                mesh.first_start = Some(mesh.first_start.map_or(root.start, |t| t.min(root.start)));
                mesh.last_start = Some(mesh.last_start.map_or(root.start, |t| t.max(root.start)));
                for inv in root.walk() {
                    mesh.add(inv);
                }
            }
        }
        mesh.end_to_end.sort_unstable();
        for s in mesh.services.values_mut() {
            s.own_times.sort_unstable();
        }
        mesh
    }

    fn add(&mut self, inv: &Invocation) {
        let s = self.services.entry(inv.service.clone()).or_default();
        s.invocations += 1;
        s.errors += u64::from(inv.error);
        s.own_errors += u64::from(inv.error && !inv.children.iter().any(|c| c.error));
        s.own_times.push(inv.own_time());
        if let Some(i) = &inv.instance {
            s.instances.insert(i.clone());
        }
        *s.operations.entry(operation(&inv.operation)).or_default() += 1;

        // Per callee: how many calls, and the span of time they covered.
        let mut called: BTreeMap<&str, (u64, i64, i64)> = BTreeMap::new();
        for c in &inv.children {
            let e = called
                .entry(c.service.as_str())
                .or_insert((0, c.called_at, c.returned_at));
            e.0 += 1;
            e.1 = e.1.min(c.called_at);
            e.2 = e.2.max(c.returned_at);
        }
        for (&callee, &(n, _, _)) in &called {
            let edge = self
                .edges
                .entry((inv.service.clone(), callee.to_string()))
                .or_default();
            edge.calling += 1;
            edge.calls += n;
            *edge.per_invocation.entry(n).or_default() += 1;
            if n > 1 {
                let mut spans: Vec<(i64, i64)> = inv
                    .children
                    .iter()
                    .filter(|c| c.service == callee)
                    .map(|c| (c.called_at, c.returned_at))
                    .collect();
                spans.sort_unstable();
                if spans.windows(2).any(|w| w[1].0 < w[0].1) {
                    edge.repeats_overlapped += 1;
                } else {
                    edge.repeats_apart += 1;
                }
            }
        }
        let callees: Vec<(&str, (u64, i64, i64))> = called.into_iter().collect();
        for (i, &(a, (_, a0, a1))) in callees.iter().enumerate() {
            for &(b, (_, b0, b1)) in &callees[i + 1..] {
                let o = self
                    .orders
                    .entry((inv.service.clone(), a.to_string(), b.to_string()))
                    .or_default();
                if a1 <= b0 {
                    o.first_before += 1;
                } else if b1 <= a0 {
                    o.second_before += 1;
                } else {
                    o.overlapped += 1;
                }
            }
        }
    }

    /// The callees of `caller`, most called first.
    pub fn callees(&self, caller: &str) -> Vec<(&str, &Edge)> {
        let mut out: Vec<(&str, &Edge)> = self
            .edges
            .iter()
            .filter(|((from, _), _)| from == caller)
            .map(|((_, to), e)| (to.as_str(), e))
            .collect();
        out.sort_by(|a, b| b.1.calling.cmp(&a.1.calling).then(a.0.cmp(b.0)));
        out
    }

    /// The share of `caller`'s invocations that call `callee`.
    pub fn call_share(&self, caller: &str, callee: &str) -> f64 {
        let calling = self
            .edges
            .get(&(caller.to_string(), callee.to_string()))
            .map_or(0, |e| e.calling);
        ratio(
            calling,
            self.services.get(caller).map_or(0, |s| s.invocations),
        )
    }

    /// `caller`'s callees in stages: the callees of one stage run side by
    /// side (their calls overlapped in most invocations that made both),
    /// the stages one after another, in the order they most often ran.
    pub fn stages(&self, caller: &str) -> Vec<Vec<String>> {
        let callees: Vec<String> = {
            let mut c: Vec<String> = self
                .callees(caller)
                .into_iter()
                .map(|(n, _)| n.to_string())
                .collect();
            c.sort();
            c
        };
        let order = |a: &str, b: &str| -> Order {
            let (x, y, flip) = if a < b { (a, b, false) } else { (b, a, true) };
            let o = self
                .orders
                .get(&(caller.to_string(), x.to_string(), y.to_string()))
                .copied()
                .unwrap_or_default();
            if flip {
                Order {
                    overlapped: o.overlapped,
                    first_before: o.second_before,
                    second_before: o.first_before,
                }
            } else {
                o
            }
        };
        let parallel = |a: &str, b: &str| {
            let o = order(a, b);
            o.overlapped > 0 && o.overlapped >= o.first_before + o.second_before
        };
        // Stages: the connected groups of "ran side by side".
        let mut stage_of: Vec<usize> = (0..callees.len()).collect();
        for i in 0..callees.len() {
            for j in i + 1..callees.len() {
                if parallel(&callees[i], &callees[j]) {
                    let (from, to) = (stage_of[j], stage_of[i]);
                    for s in stage_of.iter_mut() {
                        if *s == from {
                            *s = to;
                        }
                    }
                }
            }
        }
        let mut stages: BTreeMap<usize, Vec<String>> = BTreeMap::new();
        for (i, c) in callees.iter().enumerate() {
            stages.entry(stage_of[i]).or_default().push(c.clone());
        }
        let mut stages: Vec<Vec<String>> = stages.into_values().collect();
        // A stage goes before another when its callees ran first more often.
        let before = |x: &[String], y: &[String]| -> i64 {
            let mut score = 0i64;
            for a in x {
                for b in y {
                    let o = order(a, b);
                    score += o.first_before as i64 - o.second_before as i64;
                }
            }
            score
        };
        stages.sort_by(|x, y| before(y, x).cmp(&before(x, y)).then(x.cmp(y)));
        stages
    }
}

impl Mesh {
    /// What the traces show, for people: the entries, then each service
    /// (callers before their callees) with its own time, errors, replicas
    /// and calls, its callees in the stages they ran in.
    pub fn describe(&self) -> Vec<String> {
        let roots: u64 = self.entries.values().sum();
        let mut out = vec![format!(
            "{} services, {} edges, {} requests; end to end p50 {} p99 {}",
            self.services.len(),
            self.edges.len(),
            roots,
            ns_text(quantile(&self.end_to_end, 0.5)),
            ns_text(quantile(&self.end_to_end, 0.99)),
        )];
        for ((service, operation), n) in &self.entries {
            out.push(format!(
                "entry {service} {operation}: {}",
                tailmesh_units::percent(ratio(*n, roots))
            ));
        }
        for name in self.callers_first() {
            let s = &self.services[&name];
            out.push(format!(
                "{name}: {} invocations, {} replica(s), own time p50 {} p90 {} p99 {}, errors {}",
                s.invocations,
                s.instances.len().max(1),
                ns_text(s.own_quantile(0.5)),
                ns_text(s.own_quantile(0.9)),
                ns_text(s.own_quantile(0.99)),
                tailmesh_units::percent(s.error_share()),
            ));
            for (i, stage) in self.stages(&name).iter().enumerate() {
                let calls: Vec<String> = stage
                    .iter()
                    .map(|callee| {
                        let e = &self.edges[&(name.clone(), callee.clone())];
                        let most = e.per_invocation.keys().next_back().copied().unwrap_or(1);
                        let times = if most > 1 {
                            format!(", {:.2} times (1 to {most})", ratio(e.calls, e.calling))
                        } else {
                            String::new()
                        };
                        format!(
                            "{callee} ({}{times})",
                            tailmesh_units::percent(self.call_share(&name, callee))
                        )
                    })
                    .collect();
                let how = if stage.len() > 1 { "side by side" } else { "" };
                out.push(format!(
                    "  then {}: {}{}",
                    i + 1,
                    calls.join(", "),
                    if how.is_empty() {
                        String::new()
                    } else {
                        format!(" ({how})")
                    }
                ));
            }
        }
        out
    }

    /// The services, each after every service that calls it where the
    /// calls form no cycle, in name order otherwise.
    pub fn callers_first(&self) -> Vec<String> {
        let mut placed: Vec<String> = Vec::new();
        let mut left: BTreeSet<&String> = self.services.keys().collect();
        while !left.is_empty() {
            let ready: Vec<&String> = left
                .iter()
                .copied()
                .filter(|s| {
                    !self
                        .edges
                        .keys()
                        .any(|(from, to)| to == *s && from != *s && left.contains(from))
                })
                .collect();
            // A cycle: break it at the first name.
            let next = if ready.is_empty() {
                vec![*left.iter().next().expect("left is not empty")]
            } else {
                ready
            };
            for s in next {
                left.remove(s);
                placed.push(s.clone());
            }
        }
        placed
    }
}

/// An operation's name with every run of digits as `#`: span names that
/// carry an id (`GET /users/17`, `request 1002`) are one operation.
pub fn operation(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_digits = false;
    for c in name.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push('#');
            }
            in_digits = true;
        } else {
            out.push(c);
            in_digits = false;
        }
    }
    out
}

pub(crate) fn quantile(sorted: &[i64], q: f64) -> Option<i64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// A time in nanoseconds as people read it (`-` for none).
pub(crate) fn ns_text(n: Option<i64>) -> String {
    n.map_or_else(
        || "-".to_string(),
        |n| tailmesh_units::duration(std::time::Duration::from_nanos(n.max(0) as u64)),
    )
}

pub(crate) fn ratio(n: u64, d: u64) -> f64 {
    if d == 0 { 0.0 } else { n as f64 / d as f64 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::tests::inv;

    #[test]
    fn shares_counts_and_order_come_back_from_the_trees() {
        // front calls auth first, then cart and stock side by side; stock
        // twice in one of them; cart only in half of them.
        let trace = |with_cart: bool, stock_twice: bool| {
            let mut children = vec![inv("auth", 0, 10, vec![])];
            if with_cart {
                children.push(inv("cart", 20, 40, vec![]));
            }
            children.push(inv("stock", 22, 30, vec![]));
            if stock_twice {
                children.push(inv("stock", 31, 38, vec![]));
            }
            vec![inv("front", 0, 50, children)]
        };
        let traces = vec![
            trace(true, true),
            trace(true, false),
            trace(false, false),
            trace(false, false),
        ];
        let mesh = Mesh::from_traces(&traces);
        assert_eq!(mesh.services["front"].invocations, 4);
        assert_eq!(mesh.call_share("front", "cart"), 0.5);
        assert_eq!(mesh.call_share("front", "auth"), 1.0);
        let stock = &mesh.edges[&("front".to_string(), "stock".to_string())];
        assert_eq!((stock.calling, stock.calls), (4, 5));
        assert_eq!(stock.per_invocation[&2], 1);
        assert_eq!(
            mesh.stages("front"),
            vec![
                vec!["auth".to_string()],
                vec!["cart".to_string(), "stock".to_string()]
            ]
        );
        assert_eq!(mesh.entries[&("front".to_string(), "op".to_string())], 4);
        // front's own time: 50 - 10 - (cart 20..40 with stock inside) = 20
        // where cart is called; 50 - 10 - 8 = 32 where not.
        assert_eq!(mesh.services["front"].own_quantile(0.0), Some(20));
        assert_eq!(mesh.services["front"].own_quantile(1.0), Some(32));
    }

    #[test]
    fn the_description_names_callers_before_callees_and_their_stages() {
        let trace = vec![inv(
            "front",
            0,
            50_000_000,
            vec![
                inv(
                    "auth",
                    0,
                    10_000_000,
                    vec![inv("db", 1_000_000, 2_000_000, vec![])],
                ),
                inv("cart", 20_000_000, 30_000_000, vec![]),
            ],
        )];
        let mesh = Mesh::from_traces(&[trace]);
        assert_eq!(mesh.callers_first(), ["front", "auth", "cart", "db"]);
        let lines = mesh.describe();
        assert!(
            lines[0].starts_with("4 services, 3 edges, 1 requests; end to end p50 50.0 ms"),
            "{lines:?}"
        );
        assert!(
            lines.contains(&"entry front op: 100 %".to_string()),
            "{lines:?}"
        );
        assert!(
            lines.contains(&"  then 1: auth (100 %)".to_string()),
            "{lines:?}"
        );
        assert!(
            lines.contains(&"  then 2: cart (100 %)".to_string()),
            "{lines:?}"
        );
    }

    #[test]
    fn ids_in_operation_names_are_folded() {
        assert_eq!(operation("request 1002"), "request #");
        assert_eq!(operation("GET /users/17/cart/3"), "GET /users/#/cart/#");
        assert_eq!(operation("login"), "login");
        let roots: Vec<Vec<Invocation>> = (0..3)
            .map(|i| {
                let mut root = inv("loadgen", 0, 10, vec![]);
                root.operation = format!("request {i}");
                vec![root]
            })
            .collect();
        let mesh = Mesh::from_traces(&roots);
        assert_eq!(mesh.entries.len(), 1);
        assert_eq!(
            mesh.entries[&("loadgen".to_string(), "request #".to_string())],
            3
        );
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<i64> = (1..=100).collect();
        assert_eq!(quantile(&v, 0.5), Some(50));
        assert_eq!(quantile(&v, 0.99), Some(99));
        assert_eq!(quantile(&v, 1.0), Some(100));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
