//! What composition reads from each request: the call tree as it walks it,
//! an ok request cut into its segments (lateness, then per hop reach,
//! queue, own and rest, and the whole call with its attempts as the
//! caller timed them), a hop's segments and attempts over the run, and a
//! row's latency recomposed by the tree's rules (the check that the
//! segments add up).

use crate::record::{AttemptEnd as RecordEnd, AttemptTiming, HopRecord};
use hdrhistogram::Histogram;
use rand_chacha::ChaCha8Rng;
use tailmesh_model::calls::Calls;
use tailmesh_model::policy::ClientPolicy;
use tailmesh_units::nanos;

use crate::compose::resample;
use crate::record::RequestRecord;
use crate::stats::{new_histogram, record_us};
use tailmesh_model::scenario::Variant;

/// The segments of a hop, in a row's column order.
pub const HOP_SEGMENTS: [&str; 4] = ["reach", "queue", "own", "rest"];

/// A row's columns: lateness, then per hop reach, queue, own, rest and the
/// whole call as the caller timed it.
pub(super) const PER_HOP: usize = 5;

/// The call tree as composition walks it.
#[derive(Clone, Debug)]
pub(super) struct Tree {
    pub(super) names: Vec<String>,
    /// Each hop's place in `names`, for the path records of every request.
    pub(super) index: std::collections::HashMap<String, usize>,
    pub(super) children: Vec<Vec<usize>>,
    pub(super) policies: Vec<ClientPolicy>,
    /// Each hop's calls: stages, probabilities, counts.
    pub(super) calls: Vec<Calls>,
    /// Whether every request takes the same path (each hop once).
    pub(super) fixed: bool,
    /// The hops the load generator calls, with their declared shares.
    pub(super) entries: Vec<(usize, f64)>,
}

impl Tree {
    pub(super) fn of(variant: &Variant) -> Tree {
        let index = |name: &str| variant.hops.iter().position(|h| h.name == name);
        Tree {
            names: variant.hops.iter().map(|h| h.name.clone()).collect(),
            index: variant
                .hops
                .iter()
                .enumerate()
                .map(|(i, h)| (h.name.clone(), i))
                .collect(),
            children: variant
                .hops
                .iter()
                .map(|h| h.downstream.iter().filter_map(|d| index(d)).collect())
                .collect(),
            policies: variant.hops.iter().map(|h| h.client.clone()).collect(),
            calls: variant.hops.iter().map(|h| h.call_plan()).collect(),
            fixed: variant.fixed_paths(),
            entries: variant.entries(),
        }
    }

    pub(super) fn hops(&self) -> usize {
        self.names.len()
    }

    /// Whether calls into hop `i` go through a client policy.
    pub(super) fn policed(&self, i: usize) -> bool {
        !self.policies[i].is_plain()
    }
}

/// How an attempt of a call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptEnd {
    Ok,
    Failed,
    /// Still running when another attempt answered or the call ended.
    Cancelled,
}

/// One attempt of a call, as the caller timed it (ns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attempt {
    pub start_ns: u64,
    pub took_ns: u64,
    pub end: AttemptEnd,
}

/// One hop's part of one ok request (ns).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HopPart {
    pub reach: u64,
    pub queue: u64,
    pub own: u64,
    pub rest: u64,
    /// The whole call into this hop, policy included, as the caller timed
    /// it.
    pub call: u64,
    /// The call's attempts.
    pub attempts: Vec<Attempt>,
}

/// One ok request cut into segments: the row composition reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Row {
    pub lateness: u64,
    /// Per hop, in the scenario's order.
    pub hops: Vec<HopPart>,
    /// The request's measured latency.
    pub latency: u64,
}

/// A call's attempts over the run.
pub(super) struct AttemptAcc {
    pub(super) ok: Histogram<u64>,
    pub(super) failed: Histogram<u64>,
    pub(super) cancelled: Histogram<u64>,
    /// When the second attempt went, for calls that sent one.
    pub(super) second_at: Histogram<u64>,
}

impl AttemptAcc {
    pub(super) fn new() -> AttemptAcc {
        AttemptAcc {
            ok: new_histogram(),
            failed: new_histogram(),
            cancelled: new_histogram(),
            second_at: new_histogram(),
        }
    }

    pub(super) fn record(&mut self, attempts: &[Attempt]) {
        for a in attempts {
            let h = match a.end {
                AttemptEnd::Ok => &mut self.ok,
                AttemptEnd::Failed => &mut self.failed,
                AttemptEnd::Cancelled => &mut self.cancelled,
            };
            record_us(h, a.took_ns / 1_000);
        }
        if let Some(second) = attempts.get(1) {
            record_us(&mut self.second_at, second.start_ns / 1_000);
        }
    }

    pub(super) fn resampled(&self, rng: &mut ChaCha8Rng) -> AttemptAcc {
        AttemptAcc {
            ok: resample(&self.ok, rng),
            failed: resample(&self.failed, rng),
            cancelled: resample(&self.cancelled, rng),
            second_at: self.second_at.clone(),
        }
    }
}

/// One hop's segments over the run, µs.
pub(super) struct HopAcc {
    pub(super) segments: [Histogram<u64>; 4],
    pub(super) attempts: AttemptAcc,
}

/// An ok request cut into the segments of the module doc; `None` when its
/// path lacks a hop of the tree or a caller's timing of a call.
pub(super) fn row_of(tree: &Tree, r: &RequestRecord) -> Option<Row> {
    let mut records: Vec<Option<&HopRecord>> = vec![None; tree.hops()];
    for h in &r.path {
        let &i = tree.index.get(h.hop.as_str())?;
        records[i] = Some(h);
    }
    let records: Vec<&HopRecord> = records.into_iter().collect::<Option<_>>()?;
    let mut hops = Vec::with_capacity(tree.hops());
    for (i, h) in records.iter().enumerate() {
        // The call into this hop: the generator's for the first hop, the
        // caller's own record's timing for the others.
        let (call, attempts): (u64, &[AttemptTiming]) = if i == 0 {
            (nanos(r.service_latency()), &r.attempts)
        } else {
            let &parent = tree.index.get(h.parent.as_str())?;
            let timing = records[parent].calls.iter().find(|c| c.hop == h.hop)?;
            (timing.call_ns, &timing.attempts)
        };
        let longest = h.calls.iter().map(|c| c.call_ns).max().unwrap_or(0);
        hops.push(part_of(h, call, attempts, longest));
    }
    Some(Row {
        lateness: nanos(r.start.saturating_sub(r.intended)),
        hops,
        latency: nanos(r.latency()),
    })
}

/// A hop's part of a request from its record, the call into it as its
/// caller timed it (`call`, `attempts`), and the time its own calls took
/// (`calls`): what is left of its total is its rest.
fn part_of(h: &HopRecord, call: u64, attempts: &[AttemptTiming], calls: u64) -> HopPart {
    let attempts: Vec<Attempt> = attempts.iter().map(attempt_of).collect();
    let answered = attempts
        .iter()
        .rev()
        .find(|a| a.end == AttemptEnd::Ok)
        .map_or(call, |a| a.took_ns);
    let slot = h.slot_wait_ns.min(h.queue_wait_ns);
    let broker = h.queue_wait_ns - slot;
    HopPart {
        reach: answered.saturating_sub(h.total_ns + broker),
        queue: h.queue_wait_ns,
        own: h.service_ns,
        rest: h.total_ns.saturating_sub(slot + h.service_ns + calls),
        call,
        attempts,
    }
}

/// One visit of a request to a hop, on a path that varies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Visit {
    pub(super) hop: usize,
    pub(super) part: HopPart,
    /// Per hop, how many times this visit called it.
    pub(super) called: Vec<(usize, u32)>,
}

/// An ok request's visits, read from its path: the records come in post
/// order (a hop's callees' records, in the order it called them, then its
/// own, the entry's last), and a hop's record times each call it made, so
/// each record takes the last subtrees as its callees. `None` when the path does not read
/// that way (a hop outside the tree, a callee that is not the one timed).
pub(super) fn visits_of(tree: &Tree, r: &RequestRecord) -> Option<Vec<Visit>> {
    let mut visits: Vec<Visit> = Vec::with_capacity(r.path.len());
    // Per visit in `visits`, its record; the roots of finished subtrees.
    let mut records: Vec<&HopRecord> = Vec::with_capacity(r.path.len());
    let mut roots: Vec<usize> = Vec::new();
    let mut call_of: Vec<Option<(u64, &[AttemptTiming])>> = Vec::with_capacity(r.path.len());
    // Per visit, the time its own calls took.
    let mut downstream: Vec<u64> = Vec::with_capacity(r.path.len());
    for h in &r.path {
        let &i = tree.index.get(h.hop.as_str())?;
        let k = h.calls.len();
        let first = roots.len().checked_sub(k)?;
        let mut called: Vec<(usize, u32)> = Vec::new();
        for (timing, &child) in h.calls.iter().zip(&roots[first..]) {
            if records[child].hop != timing.hop {
                return None;
            }
            call_of[child] = Some((timing.call_ns, &timing.attempts));
            let j = visits[child].hop;
            match called.iter_mut().find(|(c, _)| *c == j) {
                Some((_, n)) => *n += 1,
                None => called.push((j, 1)),
            }
        }
        roots.truncate(first);
        downstream.push(if h.downstream_ns > 0 {
            h.downstream_ns
        } else {
            h.calls.iter().map(|c| c.call_ns).max().unwrap_or(0)
        });
        roots.push(visits.len());
        records.push(h);
        call_of.push(None);
        visits.push(Visit {
            hop: i,
            part: HopPart::default(),
            called,
        });
    }
    // One entry hop, called by the load generator.
    if roots.len() != 1 || !tree.entries.iter().any(|(e, _)| *e == visits[roots[0]].hop) {
        return None;
    }
    call_of[roots[0]] = Some((nanos(r.service_latency()), &r.attempts));
    for ((v, h), (call, calls)) in visits
        .iter_mut()
        .zip(&records)
        .zip(call_of.into_iter().zip(downstream))
    {
        let (call, attempts) = call?;
        v.part = part_of(h, call, attempts, calls);
    }
    Some(visits)
}

pub(super) fn attempt_of(a: &AttemptTiming) -> Attempt {
    Attempt {
        start_ns: a.start_ns,
        took_ns: a.took_ns,
        end: match RecordEnd::try_from(a.end) {
            Ok(RecordEnd::Ok) => AttemptEnd::Ok,
            Ok(RecordEnd::Cancelled) => AttemptEnd::Cancelled,
            _ => AttemptEnd::Failed,
        },
    }
}

/// A hop part's four segments, in [`HOP_SEGMENTS`] order.
pub(super) fn segments(part: &HopPart) -> [u64; 4] {
    [part.reach, part.queue, part.own, part.rest]
}

/// A row's columns (ns): lateness, then per hop its segments and its call.
pub(super) fn columns(row: &Row) -> Vec<u64> {
    let mut out = Vec::with_capacity(1 + PER_HOP * row.hops.len());
    out.push(row.lateness);
    for part in &row.hops {
        out.extend(segments(part));
        out.push(part.call);
    }
    out
}

pub(super) fn column_names(tree: &Tree) -> Vec<String> {
    let mut out = vec!["lateness".to_string()];
    for name in &tree.names {
        for s in HOP_SEGMENTS {
            out.push(format!("{s}:{name}"));
        }
        out.push(format!("call:{name}"));
    }
    out
}

/// The columns the tree's rules read for a row: a policed hop's call
/// stands for its reach and everything under it.
pub(super) fn used_columns(tree: &Tree) -> Vec<usize> {
    let mut out = vec![0];
    fn walk(tree: &Tree, i: usize, out: &mut Vec<usize>) {
        let base = 1 + PER_HOP * i;
        if tree.policed(i) {
            out.push(base + 4);
            return;
        }
        out.extend([base, base + 1, base + 2, base + 3]);
        for &c in &tree.children[i] {
            walk(tree, c, out);
        }
    }
    if tree.hops() > 0 {
        walk(tree, 0, &mut out);
    }
    out
}

/// A row's latency by the tree's rules (ns).
pub(super) fn recompose(tree: &Tree, row: &[u64]) -> u64 {
    fn call(tree: &Tree, i: usize, row: &[u64]) -> u64 {
        let base = 1 + PER_HOP * i;
        if tree.policed(i) {
            return row[base + 4];
        }
        let below = tree.children[i]
            .iter()
            .map(|&c| call(tree, c, row))
            .max()
            .unwrap_or(0);
        row[base] + row[base + 1] + row[base + 2] + row[base + 3] + below
    }
    if tree.hops() == 0 {
        return row[0];
    }
    row[0] + call(tree, 0, row)
}
