//! Tail-based sampling: which traced requests' traces go into the Jaeger
//! file, decided when each request ends from what the load generator
//! measured ([`TailSampler`], fed each measured record): every slow, failed, and
//! retried or hedged request, plus a uniform share of the rest.
//!
//! The decision and the few facts the traces' cross-check needs (outcome,
//! head sampling, the reply path's hops, replicas and times) go to a facts
//! file in the run folder, one fixed-size slot per request id, so the pass
//! over the spool (`sift`) looks each trace's request up on disk; the
//! sampler itself holds counters only.

use std::{
    fs::File,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
    time::Duration,
};

use crate::record::HopRecord;
use hdrhistogram::Histogram;

use super::breakdown::{PathHop, PathTimes, RequestFacts, TailCounts, TraceAnalyzer};
use crate::{
    record::{Outcome, RequestRecord},
    scenario::{Keep, KeepShare, LoadMode, Stop, Variant},
};
use tailmesh_services::model::Transport;

/// The most a Jaeger file holds; more kept traces go into further files.
/// Jaeger's UI loads an uploaded file into the browser whole.
pub const JAEGER_FILE_LIMIT: u64 = 50_000_000;
/// What one span takes in the Jaeger file, about (measured on the shipped
/// scenarios: 600 to 790 bytes with its tags and its share of its
/// trace's process tags).
pub const JAEGER_BYTES_PER_SPAN: u64 = 800;
/// The request rate assumed for a closed loop's estimate: about what a
/// traced chain reaches on a small machine.
pub const CLOSED_LOOP_RATE: f64 = 5_000.0;
/// Request ids past this are not given a slot in the facts file (their
/// traces are dropped and counted); a run at 5,000/s reaches it after
/// 6 days.
const MAX_SLOTS: u64 = 1 << 32;

/// The rule resolved for one variant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TailPolicy {
    /// Requests slower than this are kept (`None`: not for being slow).
    pub slow_above: Option<Duration>,
    /// Ok requests slower than this percentile of the ok requests ended
    /// before them are kept too.
    pub slow_percentile: Option<f64>,
    /// Keep failed requests (errors and timeouts).
    pub failed: bool,
    /// Keep requests with an extra attempt at any hop.
    pub retried: bool,
    /// The share of the other traced requests kept, 0.0 to 1.0.
    pub share: f64,
}

impl TailPolicy {
    /// Whether the processes hold their spans for this policy's decisions
    /// (retroactive sampling): whenever it keeps less than every trace.
    pub fn holds(&self) -> bool {
        self.share < 1.0
    }

    /// `keep` for `variant`, whose slow requests are those above
    /// `slow_threshold`; `sampling`: the head-sampling share;
    /// `file_budget`: the Jaeger bytes this variant may fill by its share
    /// (the file's limit split between the variants).
    pub fn resolve(
        keep: &Keep,
        variant: &Variant,
        slow_threshold: Duration,
        sampling: f64,
        file_budget: u64,
    ) -> Self {
        TailPolicy {
            slow_above: keep.slow.then_some(slow_threshold),
            slow_percentile: keep.slow_percentile,
            failed: keep.failed,
            retried: keep.retried,
            share: match keep.share {
                KeepShare::Fixed(share) => share,
                KeepShare::Auto => auto_share(variant, sampling, file_budget),
            },
        }
    }
}

/// The share of traces that fills `budget` bytes of Jaeger JSON by the
/// estimate of `variant`'s traced requests (its request count, or its
/// duration times its rate, [`CLOSED_LOOP_RATE`] for a closed loop; warmup
/// included) and of its spans per trace (the load generator's, and per hop
/// a server span, a client span to the next hop and a broker queue wait
/// for pull hops). 1.0 when everything fits; rounded down to 3 significant
/// digits.
pub fn auto_share(variant: &Variant, sampling: f64, budget: u64) -> f64 {
    let load = &variant.load;
    let rate = match load.mode {
        LoadMode::Open { rate, .. } => rate,
        LoadMode::Closed { .. } => CLOSED_LOOP_RATE,
    };
    // Only a closed loop that stops by time has no plan: its duration at
    // the assumed rate.
    let measured = load.planned_requests().unwrap_or(match load.stop {
        Stop::Duration(d) => rate * d.as_secs_f64(),
        Stop::Requests(n) => n as f64,
    });
    let requests = measured + rate * load.warmup.as_secs_f64();
    let spans: u64 = 1 + variant
        .hops
        .iter()
        .map(|h| 2 + u64::from(h.transport == Transport::Pull))
        .sum::<u64>();
    let bytes = requests * sampling * (spans * JAEGER_BYTES_PER_SPAN) as f64;
    if bytes <= budget as f64 {
        return 1.0;
    }
    let share = budget as f64 / bytes;
    let scale = 10f64.powi(2 - share.log10().floor() as i32);
    (share * scale).floor() / scale
}

/// Why a trace was kept, or that it was not; the first reason that
/// applies, in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Failed,
    Slow,
    Retried,
    Sampled,
    Dropped,
}

/// Why the facts file could not be written or read.
#[derive(Debug, thiserror::Error)]
#[error("trace facts {}: {source}", path.display())]
pub struct FactsError {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

/// Flags of a slot.
const MEASURED: u8 = 1;
const OK: u8 = 2;
const SAMPLED: u8 = 4;
const KEEP: u8 = 8;
/// The path had more hop visits than the slot holds (or a hop not in
/// the variant): its trace cannot match it.
const OVERFLOW: u8 = 16;
/// A path hop: its index in the variant (u8), replica (u16), total (u64).
const HOP_BYTES: usize = 11;
const UNKNOWN_HOP: u8 = u8::MAX;

/// The most path records a slot holds (its length is one byte).
const MOST_IN_SLOT: usize = u8::MAX as usize;

/// One slot per request id: flags, path length, then room for `longest`
/// path hops.
fn slot_size(longest: usize) -> usize {
    2 + longest * HOP_BYTES
}

/// Writes one request's slot into `buf` (a slot's size for `longest`
/// path hops, zeroed): its `flags`, and its reply `path` by the hops'
/// indexes in `hops`, or the overflow flag when the path is longer or
/// names a hop not there.
fn encode_slot(buf: &mut [u8], hops: &[String], longest: usize, mut flags: u8, path: &[HopRecord]) {
    let index = |hop: &str| {
        hops.iter()
            .position(|h| h == hop)
            .and_then(|i| u8::try_from(i).ok())
            .filter(|i| *i != UNKNOWN_HOP)
    };
    // What the trace can hold: a directly called service's record has no
    // span to check.
    let traced = || path.iter().filter(|h| super::has_server_span(h));
    let n = traced().count();
    if n > longest || traced().any(|h| index(&h.hop).is_none()) {
        flags |= OVERFLOW;
    } else {
        buf[1] = n as u8;
        for (i, h) in traced().enumerate() {
            let at = 2 + i * HOP_BYTES;
            buf[at] = index(&h.hop).unwrap_or(UNKNOWN_HOP);
            let replica = u16::try_from(h.replica).unwrap_or(u16::MAX);
            buf[at + 1..at + 3].copy_from_slice(&replica.to_le_bytes());
            buf[at + 3..at + 11].copy_from_slice(&h.total_ns.to_le_bytes());
        }
    }
    buf[0] = flags;
}

/// The decisions and facts of one variant's requests, by id. Slots are
/// written behind: the two most recent windows of 4096 ids
/// wait in memory and go to the file in one write each, so a request
/// costs a copy, not a system call; a request that ends later than its
/// window stays is written on its own. [`FactsFile::flush`] before
/// reading.
pub struct FactsFile {
    path: PathBuf,
    file: File,
    hops: Vec<String>,
    /// The most path hops a slot holds.
    longest: usize,
    /// The window of the newest ids, and the one before it.
    current: Option<Window>,
    previous: Option<Window>,
    /// Requests whose slot could not be written, and the first reason.
    lost: u64,
    error: Option<FactsError>,
}

/// Ids per window written behind.
const WINDOW_SLOTS: u64 = 4096;

/// The slots of ids `index * WINDOW_SLOTS ..` waiting to be written, and
/// the range of them written so far (slots in between that no request
/// wrote stay zero, as in the file).
struct Window {
    index: u64,
    bytes: Vec<u8>,
    touched: std::ops::Range<usize>,
    /// Slots written in it.
    written: u64,
}

impl FactsFile {
    /// A new facts file at `path` for a variant with `hops` whose
    /// requests visit at most `most_visits` of them, a hop visited more
    /// than once counted each time (a path longer than 255 cannot be
    /// checked against its trace, which then counts as incomplete).
    pub fn create(path: &Path, hops: Vec<String>, most_visits: u64) -> Result<Self, FactsError> {
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|source| FactsError {
                path: path.to_owned(),
                source,
            })?;
        Ok(FactsFile {
            path: path.to_owned(),
            file,
            hops,
            longest: usize::try_from(most_visits).map_or(MOST_IN_SLOT, |n| n.min(MOST_IN_SLOT)),
            current: None,
            previous: None,
            lost: 0,
            error: None,
        })
    }

    fn slot(&self) -> usize {
        slot_size(self.longest)
    }

    /// Counts `n` requests whose slots a failed write lost.
    fn lose(&mut self, n: u64, source: std::io::Error) {
        self.lost += n;
        if self.error.is_none() {
            self.error = Some(FactsError {
                path: self.path.clone(),
                source,
            });
        }
    }

    /// Requests whose slots could not be written, and the first reason.
    pub fn lost(&self) -> Option<(u64, &FactsError)> {
        self.error.as_ref().map(|e| (self.lost, e))
    }

    /// Notes request `id`'s `flags` and reply `path` (a failure is counted,
    /// see [`FactsFile::lost`]).
    fn write(&mut self, id: u64, flags: u8, path: &[HopRecord]) {
        let slot = self.slot();
        let index = id / WINDOW_SLOTS;
        let at = (id % WINDOW_SLOTS) as usize;
        if self.current.as_ref().is_none_or(|w| index > w.index) {
            // The newest window moves on: the one before it is written.
            if let Some(w) = self.previous.take() {
                self.write_window(&w);
            }
            self.previous = self.current.take();
            self.current = Some(Window {
                index,
                bytes: vec![0; WINDOW_SLOTS as usize * slot],
                touched: at..at,
                written: 0,
            });
        }
        let (hops, longest) = (&self.hops, self.longest);
        let window = [self.current.as_mut(), self.previous.as_mut()]
            .into_iter()
            .flatten()
            .find(|w| w.index == index);
        match window {
            Some(w) => {
                let bytes = &mut w.bytes[at * slot..(at + 1) * slot];
                encode_slot(bytes, hops, longest, flags, path);
                w.touched = w.touched.start.min(at)..w.touched.end.max(at + 1);
                w.written += 1;
            }
            None => {
                // Later than its window: on its own.
                let mut bytes = vec![0u8; slot];
                encode_slot(&mut bytes, hops, longest, flags, path);
                if let Err(e) = self.file.write_all_at(&bytes, id * slot as u64) {
                    self.lose(1, e);
                }
            }
        }
    }

    fn write_window(&mut self, w: &Window) {
        let slot = self.slot();
        if w.touched.is_empty() {
            return;
        }
        let first = w.index * WINDOW_SLOTS + w.touched.start as u64;
        let bytes = &w.bytes[w.touched.start * slot..w.touched.end * slot];
        if let Err(e) = self.file.write_all_at(bytes, first * slot as u64) {
            self.lose(w.written, e);
        }
    }

    /// Writes the slots still waiting in memory.
    pub fn flush(&mut self) {
        for w in [self.previous.take(), self.current.take()]
            .into_iter()
            .flatten()
        {
            self.write_window(&w);
        }
    }

    /// What was decided for request `id`: whether its trace is kept, and
    /// its facts; `None` when it was not measured (warmup, or never
    /// recorded).
    pub fn read(&self, id: u64) -> Result<Option<(bool, RequestFacts)>, FactsError> {
        if id >= MAX_SLOTS {
            return Ok(None);
        }
        let mut buf = vec![0u8; self.slot()];
        match self.file.read_exact_at(&mut buf, id * self.slot() as u64) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(source) => {
                return Err(FactsError {
                    path: self.path.clone(),
                    source,
                });
            }
        }
        let flags = buf[0];
        if flags & MEASURED == 0 {
            return Ok(None);
        }
        let mut path = Vec::new();
        if flags & OVERFLOW != 0 {
            // A hop no trace can name: the check finds it incomplete.
            path.push(PathHop {
                hop: String::new(),
                ..PathHop::default()
            });
        }
        for i in 0..usize::from(buf[1]).min(self.longest) {
            let at = 2 + i * HOP_BYTES;
            let mut replica = [0u8; 2];
            replica.copy_from_slice(&buf[at + 1..at + 3]);
            let mut total = [0u8; 8];
            total.copy_from_slice(&buf[at + 3..at + 11]);
            path.push(PathHop {
                hop: self
                    .hops
                    .get(usize::from(buf[at]))
                    .cloned()
                    .unwrap_or_default(),
                replica: u32::from(u16::from_le_bytes(replica)),
                total_ns: u64::from_le_bytes(total),
            });
        }
        Ok(Some((
            flags & KEEP != 0,
            RequestFacts {
                ok: flags & OK != 0,
                sampled: flags & SAMPLED != 0,
                path,
            },
        )))
    }

    /// Removes the file (best effort: it is hidden in the run folder).
    pub fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Which request ids were traced (head sampling).
pub type HeadSampled = Box<dyn Fn(u64) -> bool + Send>;

/// What the sampler does with each traced request's decision, given the
/// request's record: whether its trace is kept (the processes holding
/// their spans are told of each, and the load generator makes the kept
/// ones' client spans from their records).
pub type OnDecision = Box<dyn Fn(&RequestRecord, bool) + Send>;

/// Decides, as each measured request ends, whether its trace is kept, and
/// writes the decision and the request's facts to the [`FactsFile`].
/// Holds counters only.
pub struct TailSampler {
    policy: TailPolicy,
    seed: u64,
    sampled: HeadSampled,
    on_keep: Option<OnDecision>,
    /// The ok requests' hop times, from their paths.
    paths: PathTimes,
    facts: FactsFile,
    counts: TailCounts,
    /// Expected traces (sampled ok requests) in all and per hop of the
    /// variant, for the cross-check's coverage.
    expected: u64,
    expected_per_hop: Vec<u64>,
    /// Requests past the facts file's last slot.
    beyond: u64,
    /// The ok requests' latencies (µs) so far, for `slow_percentile`.
    latencies: Option<Histogram<u64>>,
}

impl TailSampler {
    /// A sampler applying `policy` to the requests `sampled` says were
    /// traced, with its uniform share drawn from `seed`.
    pub fn new(policy: TailPolicy, seed: u64, sampled: HeadSampled, facts: FactsFile) -> Self {
        let hops = facts.hops.len();
        TailSampler {
            counts: TailCounts {
                keep_share: policy.share,
                ..TailCounts::default()
            },
            policy,
            seed,
            sampled,
            on_keep: None,
            paths: PathTimes::default(),
            facts,
            expected: 0,
            expected_per_hop: vec![0; hops],
            beyond: 0,
            latencies: policy.slow_percentile.and_then(|_| Histogram::new(3).ok()),
        }
    }

    /// Builds the hop times from every ok request's path into `paths`
    /// (made for the variant), which [`TailSampler::finish`] hands on.
    pub fn with_paths(mut self, paths: PathTimes) -> Self {
        self.paths = paths;
        self
    }

    /// Tells `on_keep` of every traced request's decision: the processes
    /// hold their spans until then, and send only the kept traces' (see
    /// `services::telemetry::held`), so the traces expected are the kept
    /// ones.
    pub fn holding(mut self, on_keep: OnDecision) -> Self {
        self.on_keep = Some(on_keep);
        self
    }

    /// Why `record`'s trace is kept, or [`Reason::Dropped`].
    pub fn reason(&self, record: &RequestRecord) -> Reason {
        let p = &self.policy;
        if p.failed && record.outcome != Outcome::Ok {
            return Reason::Failed;
        }
        if p.slow_above.is_some_and(|t| record.latency() > t) {
            return Reason::Slow;
        }
        if record.outcome == Outcome::Ok
            && self
                .percentile_so_far()
                .is_some_and(|t| record.latency() > t)
        {
            return Reason::Slow;
        }
        let retried = record.extra_attempts > 0 || record.path.iter().any(|h| h.extra_attempts > 0);
        if p.retried && retried {
            return Reason::Retried;
        }
        if in_share(self.seed, record.id, p.share) {
            return Reason::Sampled;
        }
        Reason::Dropped
    }

    /// The latency at `slow_percentile` of the ok requests so far, once
    /// there are enough of them for it to be more than their maximum
    /// (100 for p99, 1,000 for p99.9).
    fn percentile_so_far(&self) -> Option<Duration> {
        let (q, h) = (self.policy.slow_percentile?, self.latencies.as_ref()?);
        let needed = (100.0 / (100.0 - q)).ceil() as u64;
        (h.len() >= needed)
            .then(|| Duration::from_micros(h.highest_equivalent(h.value_at_quantile(q / 100.0))))
    }

    /// Hands the facts file, the counts and the expected traces over to the
    /// pass over the spool; a line when facts could not be written.
    pub fn finish(
        mut self,
        analyzer: &mut TraceAnalyzer,
    ) -> (FactsFile, TailCounts, Option<String>) {
        self.facts.flush();
        let per_hop: Vec<(String, u64)> = self
            .facts
            .hops
            .iter()
            .cloned()
            .zip(self.expected_per_hop)
            .filter(|(_, n)| *n > 0)
            .collect();
        analyzer.expect_counted(self.expected, per_hop);
        analyzer.path_times(std::mem::take(&mut self.paths));
        let warning = self.facts.lost().map(|(lost, e)| {
            format!(
                "{} request(s) could not be noted for the traces ({e}); their traces count as missing",
                lost + self.beyond
            )
        });
        (self.facts, self.counts, warning)
    }
}

/// Whether request `id` is in the uniform `share` (the same for the same
/// id and seed, and independent of head sampling's draw).
fn in_share(seed: u64, id: u64, share: f64) -> bool {
    if share >= 1.0 {
        return true;
    }
    let h = super::loadgen::mix(seed ^ 0x7461_696c_5f6b_6565 ^ super::loadgen::mix(id));
    ((h >> 11) as f64 / (1u64 << 53) as f64) < share
}

impl TailSampler {
    /// Decides whether `record`'s trace is kept, and notes its facts.
    pub fn record(&mut self, record: &RequestRecord) {
        self.paths.record(record);
        let sampled = (self.sampled)(record.id);
        let latency_us = u64::try_from(record.latency().as_micros()).unwrap_or(u64::MAX);
        let ok = record.outcome == Outcome::Ok;
        let mut flags = MEASURED;
        if ok {
            flags |= OK;
        }
        if sampled {
            self.counts.traced += 1;
            let reason = self.reason(record);
            let c = &mut self.counts;
            match reason {
                Reason::Failed => c.kept_failed += 1,
                Reason::Slow => c.kept_slow += 1,
                Reason::Retried => c.kept_retried += 1,
                Reason::Sampled => c.kept_sampled += 1,
                Reason::Dropped => c.dropped += 1,
            }
            let kept = reason != Reason::Dropped;
            // The trace is meant to exist: sampled, and kept when the
            // processes send only the kept ones.
            if kept || self.on_keep.is_none() {
                flags |= SAMPLED;
            }
            if kept {
                flags |= KEEP;
            }
            if let Some(tell) = &self.on_keep {
                tell(record, kept);
            }
            // Expected: a sampled ok request's trace (a kept one, when
            // the processes send only those), checked against its path.
            if ok && (kept || self.on_keep.is_none()) {
                self.expected += 1;
                for h in record.path.iter().filter(|h| super::has_server_span(h)) {
                    if let Some(i) = self.facts.hops.iter().position(|n| *n == h.hop) {
                        self.expected_per_hop[i] += 1;
                    }
                }
            }
        }
        if let Some(h) = &mut self.latencies
            && record.outcome == Outcome::Ok
        {
            // An auto-resizing histogram takes any value.
            let _ = h.record(latency_us);
        }
        if record.id >= MAX_SLOTS {
            self.beyond += 1;
            return;
        }
        self.facts.write(record.id, flags, &record.path);
    }
}

#[cfg(test)]
mod tests {
    use crate::record::HopRecord;

    use super::*;

    fn record(id: u64, latency_ms: u64, outcome: Outcome, path: &[(&str, u32)]) -> RequestRecord {
        RequestRecord {
            id,
            intended: Duration::ZERO,
            start: Duration::ZERO,
            end: Duration::from_millis(latency_ms),
            outcome,
            path: path
                .iter()
                .map(|(hop, extra)| HopRecord {
                    hop: (*hop).into(),
                    replica: 1,
                    total_ns: 1_234,
                    extra_attempts: *extra,
                    ..HopRecord::default()
                })
                .collect(),
            extra_attempts: 0,
            attempts: Vec::new(),
            stream: None,
        }
    }

    fn policy(share: f64) -> TailPolicy {
        TailPolicy {
            slow_above: Some(Duration::from_millis(10)),
            slow_percentile: None,
            failed: true,
            retried: true,
            share,
        }
    }

    #[test]
    fn facts_written_behind_come_back_whatever_order_the_requests_end_in() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut facts = FactsFile::create(&dir.path().join("f"), vec!["a".into(), "b".into()], 2)
            .expect("facts");
        let w = WINDOW_SLOTS;
        // In window order, then one in the window before the newest (held
        // in memory), one two windows back (written on its own), ids far
        // ahead, and the last one before the first window moves on.
        let ids = [
            3,
            1,
            w + 2,
            w - 1,
            2 * w + 5,
            w + 7,
            0,
            9 * w,
            5 * w + 1,
            w + 9,
            9 * w + 3,
        ];
        let path = |id: u64| {
            vec![HopRecord {
                hop: if id.is_multiple_of(2) { "a" } else { "b" }.into(),
                replica: (id % 7) as u32,
                total_ns: id * 10,
                ..HopRecord::default()
            }]
        };
        for id in ids {
            facts.write(
                id,
                MEASURED | if id.is_multiple_of(3) { OK } else { 0 },
                &path(id),
            );
        }
        facts.flush();
        assert!(facts.lost().is_none());
        for id in ids {
            let (_, f) = facts
                .read(id)
                .expect("read")
                .unwrap_or_else(|| panic!("request {id} was noted"));
            assert_eq!(f.ok, id.is_multiple_of(3), "request {id}");
            let want: Vec<PathHop> = path(id)
                .into_iter()
                .map(|h| PathHop {
                    hop: h.hop,
                    replica: h.replica,
                    total_ns: h.total_ns,
                })
                .collect();
            assert_eq!(f.path, want, "request {id}");
        }
        // Slots between those written stay unmeasured.
        for id in [2, w, w + 8, 2 * w + 4, 9 * w + 1] {
            assert_eq!(facts.read(id).expect("read"), None, "request {id}");
        }
    }

    #[test]
    fn a_path_that_visits_a_hop_more_than_once_comes_back_whole_up_to_the_most_visits() {
        let dir = tempfile::tempdir().expect("temp dir");
        // Two hops, a request visiting up to five times (b called four).
        let mut facts = FactsFile::create(&dir.path().join("f"), vec!["a".into(), "b".into()], 5)
            .expect("facts");
        let visits = |n: usize| -> Vec<HopRecord> {
            (0..n)
                .map(|i| HopRecord {
                    hop: if i == 0 { "a" } else { "b" }.into(),
                    replica: i as u32,
                    total_ns: 100 + i as u64,
                    ..HopRecord::default()
                })
                .collect()
        };
        facts.write(1, MEASURED | OK, &visits(5));
        facts.write(2, MEASURED | OK, &visits(6));
        facts.flush();
        let (_, whole) = facts.read(1).expect("read").expect("noted");
        let hops: Vec<(&str, u32, u64)> = whole
            .path
            .iter()
            .map(|h| (h.hop.as_str(), h.replica, h.total_ns))
            .collect();
        assert_eq!(
            hops,
            [
                ("a", 0, 100),
                ("b", 1, 101),
                ("b", 2, 102),
                ("b", 3, 103),
                ("b", 4, 104)
            ]
        );
        // Longer than the most visits: marked so that no trace matches it.
        let (_, over) = facts.read(2).expect("read").expect("noted");
        assert_eq!(over.path.len(), 1);
        assert_eq!(over.path[0].hop, "");
    }

    #[test]
    fn each_request_is_kept_for_its_first_reason_and_its_facts_come_back() {
        let dir = tempfile::tempdir().expect("temp dir");
        let facts = FactsFile::create(&dir.path().join("f"), vec!["a".into(), "b".into()], 2)
            .expect("facts");
        let mut s = TailSampler::new(policy(0.0), 1, Box::new(|id| id != 5), facts);
        let timeout = Outcome::Timeout;
        s.record(&record(0, 1, Outcome::Ok, &[("a", 0), ("b", 0)]));
        s.record(&record(1, 20, Outcome::Ok, &[("a", 0), ("b", 0)]));
        s.record(&record(2, 20, timeout, &[]));
        s.record(&record(3, 1, Outcome::Ok, &[("a", 0), ("b", 2)]));
        s.record(&record(4, 1, Outcome::Ok, &[("a", 0), ("zz", 0)]));
        s.record(&record(5, 50, Outcome::Ok, &[("a", 0), ("b", 0)]));
        let reasons: Vec<Reason> = [
            record(2, 20, Outcome::Timeout, &[]),
            record(1, 20, Outcome::Ok, &[]),
        ]
        .iter()
        .map(|r| s.reason(r))
        .collect();
        assert_eq!(reasons, [Reason::Failed, Reason::Slow]);
        let mut analyzer = TraceAnalyzer::new();
        let (facts, counts, warning) = s.finish(&mut analyzer);
        assert_eq!(warning, None);
        assert_eq!(
            (counts.traced, counts.kept_slow, counts.kept_failed),
            (5, 1, 1)
        );
        assert_eq!(
            (counts.kept_retried, counts.kept_sampled, counts.dropped),
            (1, 0, 2)
        );
        // Request 5 was not traced: measured, not kept, not expected.
        let (keep, f) = facts.read(5).expect("read").expect("measured");
        assert!(!keep && !f.sampled && f.ok);
        let (keep, f) = facts.read(3).expect("read").expect("measured");
        assert!(keep && f.expected());
        assert_eq!(
            f.path,
            [
                PathHop {
                    hop: "a".into(),
                    replica: 1,
                    total_ns: 1_234
                },
                PathHop {
                    hop: "b".into(),
                    replica: 1,
                    total_ns: 1_234
                }
            ]
        );
        let (keep, f) = facts.read(2).expect("read").expect("measured");
        assert!(keep && !f.ok && f.path.is_empty());
        // A hop not in the variant: a path no trace can match.
        let (_, f) = facts.read(4).expect("read").expect("measured");
        assert_eq!(f.path.len(), 1);
        assert_eq!(f.path[0].hop, "");
        // Never recorded, inside and past the end of the file.
        assert_eq!(facts.read(9).expect("read"), None);
        assert_eq!(facts.read(1_000_000).expect("read"), None);
        let report = analyzer.finish();
        // Traced and ok: 0, 1, 3 and 4; through a: all four, b: three.
        assert_eq!(report.expected, 4);
        let per_hop: Vec<(&str, u64)> = report
            .coverage
            .iter()
            .map(|c| (c.hop.as_str(), c.expected))
            .collect();
        assert_eq!(per_hop, [("a", 4), ("b", 3)]);
    }

    #[test]
    fn above_the_percentile_so_far_is_slow_once_there_are_enough_requests() {
        let dir = tempfile::tempdir().expect("temp dir");
        let facts = FactsFile::create(&dir.path().join("f"), vec!["a".into()], 1).expect("facts");
        let p90 = TailPolicy {
            slow_above: None,
            slow_percentile: Some(90.0),
            ..policy(0.0)
        };
        let mut s = TailSampler::new(p90, 1, Box::new(|_| true), facts);
        // 1 ms each: the first 10 requests are too few for a p90.
        for id in 0..10 {
            assert_eq!(s.reason(&record(id, 5, Outcome::Ok, &[])), Reason::Dropped);
            s.record(&record(id, 1, Outcome::Ok, &[]));
        }
        assert_eq!(s.reason(&record(10, 5, Outcome::Ok, &[])), Reason::Slow);
        assert_eq!(s.reason(&record(10, 1, Outcome::Ok, &[])), Reason::Dropped);
        // Failures are not latencies: they do not move the percentile.
        for id in 10..100 {
            s.record(&record(id, 1_000, Outcome::Timeout, &[]));
        }
        assert_eq!(s.reason(&record(100, 5, Outcome::Ok, &[])), Reason::Slow);
        let (_, counts, _) = s.finish(&mut TraceAnalyzer::new());
        assert_eq!((counts.kept_slow, counts.dropped), (0, 10));
    }

    #[test]
    fn the_uniform_share_is_the_share_asked_for() {
        let kept = (0..100_000u64).filter(|id| in_share(7, *id, 0.1)).count();
        assert!((9_000..11_000).contains(&kept), "{kept}");
        assert!((0..1000).all(|id| in_share(7, id, 1.0)));
        assert!(!(0..1000).any(|id| in_share(7, id, 0.0)));
    }

    #[test]
    fn the_automatic_share_keeps_short_runs_whole_and_long_ones_under_the_limit() {
        let src = "name = \"t\"\n[load]\nmode = \"open\"\nrate = 100\nrequests = 2000\n\
                   [[hop]]\nname = \"a\"\n[[hop]]\nname = \"b\"\ntransport = \"pull\"\n";
        let scenario = crate::scenario::parse(src, "t.toml").expect("valid");
        let v = &scenario.variants[0];
        assert_eq!(auto_share(v, 1.0, JAEGER_FILE_LIMIT), 1.0);
        // 1 + 2 + 3 spans a trace; a million traces.
        let mut long = v.clone();
        long.load.stop = Stop::Requests(1_000_000);
        let share = auto_share(&long, 1.0, JAEGER_FILE_LIMIT);
        let bytes = 1_000_000.0 * 6.0 * JAEGER_BYTES_PER_SPAN as f64 * share;
        assert!(bytes <= JAEGER_FILE_LIMIT as f64, "{share}");
        assert!(bytes > 0.99 * JAEGER_FILE_LIMIT as f64, "{share}");
        assert_eq!(share, 0.0104);
        // Half the requests traced: twice the share.
        assert_eq!(auto_share(&long, 0.5, JAEGER_FILE_LIMIT), 0.0208);
    }

    #[test]
    fn the_shipped_default_scenario_keeps_every_trace() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/default.toml");
        let (scenario, _) = crate::scenario::load(std::path::Path::new(path)).expect("valid");
        let n = scenario.variants.len() as u64;
        for v in &scenario.variants {
            let share = auto_share(v, scenario.telemetry.sampling, JAEGER_FILE_LIMIT / n);
            assert_eq!(share, 1.0, "variant {}", v.name);
        }
    }
}
