//! A [`Mesh`] written as a tailmesh scenario, where the scenario format
//! can say what the traces show: one `[[hop]]` per service, callers
//! first, each with its callees, replicas, own errors and its own time as
//! `dist = "empirical"` percentiles, its callees in the stages they ran in
//! (a callee called by only some requests with that probability, one
//! called more than once with the counts seen, its repeats side by side
//! when they overlapped), and an open-loop load at
//! the rate the requests arrived, entering where they entered (each entry
//! service weighted by its requests). A mesh the format cannot say (a
//! cycle, a call made more than 64 times, more than 256 services) is
//! [`Unfit`], with every reason.
//!
//! tailmesh's own traces are read as what they are: a root service named
//! `loadgen` is the load generator, not a service (its callee is the entry
//! hop), and the `hop-` its hops' service names start with is dropped, so
//! a run's traces give back its own hop names.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use crate::mesh::{Mesh, Service, ns_text, quantile};

/// tailmesh's load generator's service name in its traces.
pub const LOAD_GENERATOR: &str = "loadgen";

/// The prefix of tailmesh's hops' service names (`hop-<name>`).
const HOP_PREFIX: &str = "hop-";

/// The most times a scenario's call may be made for one request
/// (tailmesh's `calls::MAX_COUNT`).
const MAX_COUNT: u32 = 64;

/// The most hops a scenario may have (tailmesh's `MAX_HOPS`).
const MAX_HOPS: usize = 256;

/// The most replicas a hop may have.
const MAX_REPLICAS: usize = 64;

/// The most a written own-time distribution's CDF may stray from the
/// traces' between its points (the points are as few as that allows)...
const CDF_TOLERANCE: f64 = 0.005;

/// ... unless its time strays by at most this share of the traces' time,
/// or [`TIME_FLOOR_NS`]: so times recorded to the microsecond or the
/// millisecond do not need a point at every step.
const TIME_TOLERANCE: f64 = 0.02;
const TIME_FLOOR_NS: f64 = 2_000.0;

/// The percentiles the written points are chosen from: every half
/// percent, and the far tail.
fn candidate_quantiles() -> Vec<f64> {
    let mut q: Vec<f64> = (0..=200).map(|i| f64::from(i) / 200.0).collect();
    q.extend([0.999, 0.9999]);
    q.sort_by(f64::total_cmp);
    q
}

/// Why a mesh cannot be written as a scenario (yet): one line per reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfit(pub Vec<String>);

impl std::fmt::Display for Unfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the mesh cannot be written as a scenario:")?;
        for reason in &self.0 {
            write!(f, "\n  {reason}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Unfit {}

/// What the written scenario says where the traces do not: its name and
/// where the traces came from (for its comments).
pub struct Options<'a> {
    pub name: &'a str,
    pub source: &'a str,
}

/// The scenario's text, or every reason it cannot be written.
pub fn scenario(mesh: &Mesh, options: &Options<'_>) -> Result<String, Unfit> {
    let mut unfit = Vec::new();
    let roots: BTreeSet<&str> = mesh.entries.keys().map(|(s, _)| s.as_str()).collect();
    // tailmesh's own traces: the load generator is the load.
    let generated = roots.len() == 1 && roots.contains(LOAD_GENERATOR);
    let services: Vec<String> = mesh
        .callers_first()
        .into_iter()
        .filter(|s| !(generated && s == LOAD_GENERATOR))
        .collect();
    // The entry services, each with the requests that entered there:
    // tailmesh's own traces enter where the load generator called.
    let entries: Vec<(String, u64)> = if generated {
        mesh.callees(LOAD_GENERATOR)
            .into_iter()
            .map(|(c, edge)| (c.to_string(), edge.calling))
            .collect()
    } else {
        let mut by_service: BTreeMap<&str, u64> = BTreeMap::new();
        for ((service, _), n) in &mesh.entries {
            *by_service.entry(service.as_str()).or_default() += n;
        }
        by_service
            .into_iter()
            .map(|(s, n)| (s.to_string(), n))
            .collect()
    };
    if entries.is_empty() {
        unfit.push("no entry service".to_string());
    }
    if generated {
        // The load generator calls the entry once per request.
        for (callee, edge) in mesh.callees(LOAD_GENERATOR) {
            if edge.per_invocation.keys().any(|&n| n != 1) {
                unfit.push(format!(
                    "the load generator called {callee} more than once in a request"
                ));
            }
        }
    }
    if services.len() > MAX_HOPS {
        unfit.push(format!(
            "{} services: a scenario has at most {MAX_HOPS} hops",
            services.len()
        ));
    }
    let names = hop_names(&services, generated);
    for name in &services {
        let service = &mesh.services[name];
        for (callee, edge) in mesh.callees(name) {
            let most = edge.per_invocation.keys().next_back().copied().unwrap_or(1);
            if most > u64::from(MAX_COUNT) {
                unfit.push(format!(
                    "{name} calls {callee} up to {most} times a request: a call is made at most {MAX_COUNT} times"
                ));
            }
            if reaches(mesh, callee, name) {
                unfit.push(format!(
                    "{name} calls {callee}, which calls it back (a cycle): a scenario's calls form no cycle"
                ));
            }
        }
        if service.instances.len() > MAX_REPLICAS {
            unfit.push(format!(
                "{name} has {} replicas: a hop has at most {MAX_REPLICAS}",
                service.instances.len()
            ));
        }
    }
    if !unfit.is_empty() {
        return Err(Unfit(unfit));
    }
    Ok(write(mesh, options, &services, &names, &entries))
}

/// Whether `to` is among `from`'s callees, theirs, and so on.
fn reaches(mesh: &Mesh, from: &str, to: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from];
    while let Some(s) = todo.pop() {
        if s == to {
            return true;
        }
        if seen.insert(s) {
            todo.extend(mesh.callees(s).into_iter().map(|(c, _)| c));
        }
    }
    false
}

/// How `caller` calls `callee` (hop `hop`): its name when every request
/// calls it once, else a call table with the share of requests that call
/// it and how many times they did (each count weighted by the requests
/// that made it), its repeats side by side when they mostly overlapped.
fn call_text(mesh: &Mesh, caller: &str, callee: &str, hop: &str) -> String {
    let share = mesh.call_share(caller, callee);
    let edge = mesh
        .edges
        .get(&(caller.to_string(), callee.to_string()))
        .cloned()
        .unwrap_or_default();
    let once = edge.per_invocation.keys().all(|&n| n == 1);
    if share >= 1.0 && once {
        return quoted(hop);
    }
    let mut text = format!("{{ hop = {}", quoted(hop));
    if share < 1.0 {
        let _ = write!(
            text,
            ", probability = {}",
            trim_float(round_to(share, 4).max(1e-4))
        );
    }
    if !once {
        let counts: Vec<String> = edge
            .per_invocation
            .iter()
            .map(|(n, k)| format!("{n} = {k}"))
            .collect();
        let _ = write!(text, ", count = {{ {} }}", counts.join(", "));
        // Repeats one after another unless they mostly overlapped.
        if edge.repeats_overlapped > edge.repeats_apart {
            text.push_str(", repeats = \"parallel\"");
        }
    }
    text.push_str(" }");
    text
}

/// `x` rounded to `digits` decimals.
fn round_to(x: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (x * m).round() / m
}

/// Each service's hop name: a DNS label (lowercase letters, digits and
/// '-', at most 63), unique; tailmesh's `hop-` dropped from its own.
fn hop_names(services: &[String], generated: bool) -> BTreeMap<String, String> {
    let mut taken = BTreeSet::new();
    let mut names = BTreeMap::new();
    for service in services {
        let bare = match service.strip_prefix(HOP_PREFIX) {
            Some(rest) if generated && !rest.is_empty() => rest,
            _ => service.as_str(),
        };
        // Room for a "-N" that makes it unique.
        let label = dns_label(bare, 56);
        let base = if label.is_empty() {
            "service".to_string()
        } else {
            label
        };
        let mut name = base.clone();
        let mut n = 2;
        while !taken.insert(name.clone()) {
            name = format!("{base}-{n}");
            n += 1;
        }
        names.insert(service.clone(), name);
    }
    names
}

/// `text` made a DNS label of at most `max` characters: lowercase letters
/// and digits kept, every run of anything else one '-', none at either
/// end; empty when nothing is left.
pub fn dns_label(text: &str, max: usize) -> String {
    let mut label = String::with_capacity(text.len());
    for c in text.chars() {
        match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9') => label.push(c),
            _ if !label.ends_with('-') => label.push('-'),
            _ => {}
        }
    }
    let mut label = label.trim_matches('-').to_string();
    label.truncate(max.min(63));
    label.trim_end_matches('-').to_string()
}

fn write(
    mesh: &Mesh,
    options: &Options<'_>,
    services: &[String],
    names: &BTreeMap<String, String>,
    entries: &[(String, u64)],
) -> String {
    let requests: u64 = mesh.entries.values().sum();
    let span = match (mesh.first_start, mesh.last_start) {
        (Some(a), Some(b)) if b > a => Some(b - a),
        _ => None,
    };
    // The rate the requests arrived at, when they arrived over a while.
    let rate = span
        .filter(|_| requests > 1)
        .map(|s| (requests - 1) as f64 / (s as f64 / 1e9));
    let seconds = span.map_or(10, |s| ((s as f64 / 1e9).ceil() as u64).max(5));
    let slowest = mesh.end_to_end.last().copied().unwrap_or(0);
    // A deadline no request of the traces would have met is not theirs.
    let timeout_s = ((2 * slowest) as f64 / 1e9).ceil().max(1.0);

    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Imported by `tailmesh import` from {}:",
        options.source
    );
    let _ = writeln!(
        out,
        "# {} services, {requests} requests{}; end to end p50 {}, p99 {}, as served.",
        services.len(),
        span.map_or(String::new(), |s| format!(" over {}", ns(s))),
        ns_text(quantile(&mesh.end_to_end, 0.5)),
        ns_text(quantile(&mesh.end_to_end, 0.99)),
    );
    let _ = writeln!(
        out,
        "# Each hop's work draws from its own time's percentiles in the traces\n\
         # (its time serving, less its waits for its calls)."
    );
    let _ = writeln!(out, "name = {}", quoted(options.name));
    let _ = writeln!(
        out,
        "description = {}",
        quoted(&format!("imported from {}", options.source))
    );
    let _ = writeln!(out, "seed = 1\n\n[load]");
    match rate {
        Some(r) => {
            let _ = writeln!(
                out,
                "# {requests} requests arrived over {}: {r:.1}/s",
                ns(span.unwrap_or(0))
            );
        }
        None => {
            let _ = writeln!(
                out,
                "# the traces do not say how fast requests arrived: 10/s"
            );
        }
    }
    let rate = rate.unwrap_or(10.0).clamp(0.1, 1_000_000.0);
    let _ = writeln!(
        out,
        "mode = \"open\"\nrate = {}\narrivals = \"poisson\"\nwarmup = \"1s\"\nduration = \"{seconds}s\"\ntimeout = \"{timeout_s}s\"",
        trim_float(rate)
    );
    // Requests that do not all enter at the first hop say where they do,
    // weighted by the requests that entered there.
    if entries.len() > 1
        || entries
            .first()
            .is_some_and(|(e, _)| Some(e) != services.first())
    {
        let entered: u64 = entries.iter().map(|(_, n)| n).sum();
        let shares: Vec<String> = entries
            .iter()
            .map(|(e, n)| {
                format!(
                    "{} {:.1} %",
                    names.get(e).unwrap_or(e),
                    100.0 * *n as f64 / entered.max(1) as f64
                )
            })
            .collect();
        let _ = writeln!(out, "# the requests entered at {}", shares.join(", "));
        let list: Vec<String> = entries
            .iter()
            .map(|(e, n)| {
                format!(
                    "{{ hop = {}, weight = {n} }}",
                    quoted(names.get(e).unwrap_or(e))
                )
            })
            .collect();
        let _ = writeln!(out, "entries = [{}]", list.join(", "));
    }
    for name in services {
        let service = &mesh.services[name];
        let stages: Vec<Vec<String>> = mesh
            .stages(name)
            .into_iter()
            .map(|stage| {
                stage
                    .iter()
                    .map(|c| call_text(mesh, name, c, &names[c]))
                    .collect()
            })
            .collect();
        let downstream = match stages.as_slice() {
            [] => String::new(),
            [one] => one.join(", "),
            many => many
                .iter()
                .map(|s| format!("[{}]", s.join(", ")))
                .collect::<Vec<_>>()
                .join(", "),
        };
        let replicas = service.instances.len().max(1);
        out.push('\n');
        let _ = writeln!(
            out,
            "# {name}: {} invocations, {replicas} replica(s), own time p50 {} p90 {} p99 {}, errors {} ({} its own)",
            service.invocations,
            ns_text(service.own_quantile(0.5)),
            ns_text(service.own_quantile(0.9)),
            ns_text(service.own_quantile(0.99)),
            tailmesh_units::percent(service.error_share()),
            tailmesh_units::percent(service.own_error_share()),
        );
        let _ = writeln!(out, "[[hop]]\nname = {}", quoted(&names[name]));
        if replicas > 1 {
            let _ = writeln!(out, "replicas = {replicas}");
        }
        let _ = writeln!(out, "downstream = [{downstream}]");
        if let Some(work) = work(service) {
            let _ = writeln!(out, "{work}");
        }
        if service.own_errors > 0 {
            let _ = writeln!(
                out,
                "# the traces do not give the errors' codes: INTERNAL\nerror = {{ probability = {}, code = 13 }}",
                trim_float(service.own_error_share())
            );
        }
    }
    out
}

/// `work = { ... }` drawing from `service`'s own times, or `None` when it
/// took no time at all.
fn work(service: &Service) -> Option<String> {
    let times = &service.own_times;
    if times.last().is_none_or(|&t| t <= 0) {
        return None;
    }
    let points = own_time_points(times);
    let quantiles: Vec<String> = points
        .iter()
        .map(|&(q, t)| format!("{} = \"{}\"", percentile_key(q), duration_text(t)))
        .collect();
    Some(format!(
        "work = {{ kind = \"sleep\", dist = \"empirical\", quantiles = {{ {} }} }}",
        quantiles.join(", ")
    ))
}

/// The fewest of the candidate percentiles of `sorted` (ns) through which
/// the quantile function, drawn straight between them, strays from the
/// times' own by at most [`CDF_TOLERANCE`] at every candidate: greedily,
/// each point as far from the last as that allows. Always the lowest and
/// the highest.
fn own_time_points(sorted: &[i64]) -> Vec<(f64, i64)> {
    let candidates: Vec<(f64, i64)> = candidate_quantiles()
        .into_iter()
        .filter_map(|q| {
            let t = if q == 0.0 {
                sorted.first().copied()
            } else {
                quantile(sorted, q)
            };
            Some((q, t?.max(0)))
        })
        .collect();
    let Some(&last) = candidates.last() else {
        return Vec::new();
    };
    let mut points = vec![candidates[0]];
    let mut from = 0;
    while from + 1 < candidates.len() {
        let mut to = from + 1;
        while to + 1 < candidates.len() && fits(&candidates, from, to + 1) {
            to += 1;
        }
        points.push(candidates[to]);
        from = to;
    }
    if points.last() != Some(&last) {
        points.push(last);
    }
    points
}

/// Whether the straight line from candidate `a` to `b` stays within the
/// tolerance of every candidate between them: in its share, or in its
/// time.
fn fits(c: &[(f64, i64)], a: usize, b: usize) -> bool {
    let ((qa, ta), (qb, tb)) = (c[a], c[b]);
    c[a + 1..b].iter().all(|&(q, t)| {
        let share_off = if tb == ta {
            // A jump: every value between is at the one time.
            if t == ta { 0.0 } else { f64::INFINITY }
        } else {
            (qa + (qb - qa) * (t - ta) as f64 / (tb - ta) as f64 - q).abs()
        };
        let drawn_t = ta as f64 + (tb - ta) as f64 * (q - qa) / (qb - qa);
        let time_off = (drawn_t - t as f64).abs();
        share_off <= CDF_TOLERANCE || time_off <= (TIME_TOLERANCE * t as f64).max(TIME_FLOOR_NS)
    })
}

/// `p50`, `"p99.9"`: a percentile as a key of `quantiles`.
fn percentile_key(q: f64) -> String {
    let percent = trim_float(q * 100.0);
    if percent.contains('.') {
        format!("\"p{percent}\"")
    } else {
        format!("p{percent}")
    }
}

/// A number without trailing zeros, to at most 4 decimals.
fn trim_float(x: f64) -> String {
    let s = format!("{x:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() || s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

/// A duration as a scenario reads it, to the microsecond.
fn duration_text(ns: i64) -> String {
    let us = (ns.max(0) + 500) / 1000;
    format!("{us}us")
}

fn ns(n: i64) -> String {
    ns_text(Some(n))
}

/// A TOML basic string.
fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Invocation;
    use crate::tree::tests::inv;

    fn ms(n: i64) -> i64 {
        n * 1_000_000
    }

    fn mesh(traces: Vec<Vec<Invocation>>) -> Mesh {
        Mesh::from_traces(&traces)
    }

    const OPTIONS: Options<'static> = Options {
        name: "imported",
        source: "t.json",
    };

    #[test]
    fn a_chain_and_a_fan_out_are_written_callers_first() {
        let traces: Vec<Vec<Invocation>> = (0..50)
            .map(|i| {
                let t0 = i * ms(100);
                let mut front = inv(
                    "Front End",
                    t0,
                    t0 + ms(30),
                    vec![
                        inv("auth", t0 + ms(1), t0 + ms(11 + i % 5), vec![]),
                        inv("cart", t0 + ms(2), t0 + ms(9), vec![]),
                    ],
                );
                front.error = i == 7;
                vec![front]
            })
            .collect();
        let text = scenario(&mesh(traces), &OPTIONS).expect("fits");
        assert!(text.contains("name = \"imported\""), "{text}");
        // 50 requests, 100 ms apart: 49 gaps over 4.9 s.
        assert!(text.contains("rate = 10\n"), "{text}");
        assert!(text.contains("duration = \"5s\""), "{text}");
        let front = text.find("name = \"front-end\"").expect("front first");
        let auth = text.find("name = \"auth\"").expect("auth");
        assert!(front < auth, "{text}");
        assert!(
            text.contains("downstream = [\"auth\", \"cart\"]")
                || text.contains("downstream = [\"cart\", \"auth\"]"),
            "{text}"
        );
        // Leaves say so: no hop falls back to calling the next in the file.
        assert_eq!(text.matches("downstream = []").count(), 2, "{text}");
        // auth's own times are 10 to 14 ms.
        assert!(text.contains("quantiles = { p0 = \"10000us\""), "{text}");
        assert!(text.contains("p100 = \"14000us\""), "{text}");
        // One failure of front's own in 50.
        assert!(
            text.contains("error = { probability = 0.02, code = 13 }"),
            "{text}"
        );
    }

    #[test]
    fn calls_made_by_some_requests_more_than_once_and_in_stages_are_written_as_such() {
        let traces: Vec<Vec<Invocation>> = (0..4)
            .map(|i| {
                let mut calls = vec![inv("auth", 0, 10, vec![])];
                if i % 2 == 0 {
                    calls.push(inv("cart", 20, 30, vec![]));
                    calls.push(inv("cart", 31, 40, vec![]));
                }
                vec![inv("front", 0, 50, calls)]
            })
            .collect();
        let text = scenario(&mesh(traces), &OPTIONS).expect("fits");
        assert!(
            text.contains(
                "downstream = [[\"auth\"], [{ hop = \"cart\", probability = 0.5, count = { 2 = 2 } }]]"
            ),
            "{text}"
        );
        // Repeats that overlapped run side by side.
        let together: Vec<Vec<Invocation>> = (0..2)
            .map(|_| {
                let calls = vec![inv("cart", 0, 10, vec![]), inv("cart", 2, 12, vec![])];
                vec![inv("front", 0, 20, calls)]
            })
            .collect();
        let text = scenario(&mesh(together), &OPTIONS).expect("fits");
        assert!(
            text.contains(
                "downstream = [{ hop = \"cart\", count = { 2 = 2 }, repeats = \"parallel\" }]"
            ),
            "{text}"
        );
        // Requests entering at two services: each weighted by its requests.
        let two_entries = vec![
            vec![inv("a", 0, 1, vec![])],
            vec![inv("b", 0, 1, vec![])],
            vec![inv("b", 0, 1, vec![])],
        ];
        let text = scenario(&mesh(two_entries), &OPTIONS).expect("fits");
        assert!(
            text.contains("entries = [{ hop = \"a\", weight = 1 }, { hop = \"b\", weight = 2 }]"),
            "{text}"
        );
        assert!(
            text.contains("# the requests entered at a 33.3 %, b 66.7 %"),
            "{text}"
        );
    }

    #[test]
    fn tailmesh_traces_give_back_their_hop_names_without_the_load_generator() {
        let traces: Vec<Vec<Invocation>> = (0..3)
            .map(|i| {
                let t0 = i * ms(10);
                vec![inv(
                    LOAD_GENERATOR,
                    t0,
                    t0 + ms(5),
                    vec![inv(
                        "hop-frontend",
                        t0,
                        t0 + ms(4),
                        vec![inv("hop-backend", t0 + ms(1), t0 + ms(3), vec![])],
                    )],
                )]
            })
            .collect();
        let text = scenario(&mesh(traces), &OPTIONS).expect("fits");
        assert!(!text.contains("loadgen"), "{text}");
        assert!(
            text.contains("name = \"frontend\"\ndownstream = [\"backend\"]"),
            "{text}"
        );
        assert!(
            text.contains("name = \"backend\"\ndownstream = []"),
            "{text}"
        );
    }

    #[test]
    fn own_time_points_are_few_and_follow_the_times() {
        // 90 % at 1 ms, 10 % at 20 ms: a jump between two flat stretches.
        let mut times: Vec<i64> = (0..900).map(|_| ms(1)).collect();
        times.extend((0..100).map(|_| ms(20)));
        let points = own_time_points(&times);
        assert_eq!(points.first(), Some(&(0.0, ms(1))));
        assert_eq!(points.last(), Some(&(1.0, ms(20))));
        assert!(points.len() <= 5, "{points:?}");
        // Uniform times: a straight line, two points.
        let uniform: Vec<i64> = (1..=1000).map(|i| i * 1000).collect();
        let points = own_time_points(&uniform);
        assert!(points.len() <= 3, "{points:?}");
        // A heavy tail keeps its far percentiles.
        let heavy: Vec<i64> = (1..=10_000i64)
            .map(|i| ms(1) * 10_000 / (10_001 - i))
            .collect();
        let points = own_time_points(&heavy);
        assert!(points.iter().any(|&(q, _)| q >= 0.999), "{points:?}");
        // Every candidate within the tolerance of the line through the
        // points, in its share or its time.
        let candidates: Vec<(f64, i64)> = candidate_quantiles()
            .into_iter()
            .filter_map(|q| Some((q, quantile(&heavy, q)?)))
            .filter(|&(q, _)| q > 0.0)
            .collect();
        for &(q, t) in &candidates {
            let i = points
                .partition_point(|&(pq, _)| pq < q)
                .clamp(1, points.len() - 1);
            let ((qa, ta), (qb, tb)) = (points[i - 1], points[i]);
            let drawn_t = ta as f64 + (tb - ta) as f64 * (q - qa) / (qb - qa);
            let drawn_q = qa + (qb - qa) * (t - ta) as f64 / (tb - ta).max(1) as f64;
            assert!(
                (drawn_q - q).abs() <= CDF_TOLERANCE + 1e-9
                    || (drawn_t - t as f64).abs() <= (TIME_TOLERANCE * t as f64).max(TIME_FLOOR_NS),
                "q {q}: t {t}, drawn {drawn_t} ({drawn_q})"
            );
        }
    }

    #[test]
    fn keys_and_numbers_read_as_written() {
        assert_eq!(percentile_key(0.5), "p50");
        assert_eq!(percentile_key(0.999), "\"p99.9\"");
        assert_eq!(percentile_key(0.0), "p0");
        assert_eq!(trim_float(10.0), "10");
        assert_eq!(trim_float(0.02), "0.02");
        assert_eq!(duration_text(1_499), "1us");
        assert_eq!(quoted("a\"b\\c"), "\"a\\\"b\\\\c\"");
        let names = hop_names(
            &[
                "Front End".into(),
                "front_end".into(),
                "hop-x".into(),
                "???".into(),
            ],
            false,
        );
        assert_eq!(names["Front End"], "front-end");
        assert_eq!(names["front_end"], "front-end-2");
        assert_eq!(names["hop-x"], "hop-x");
        assert_eq!(names["???"], "service");
    }
}
