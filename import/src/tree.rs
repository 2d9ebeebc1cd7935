//! [`Invocation`]: one service serving one request, with the calls it made
//! while it did; the shape every format is read into. And [`Repairs`]: what
//! real traces get wrong, each counted, never a panic.

use std::collections::BTreeMap;

/// One service serving one request. Times are nanoseconds on the trace's
/// clock (their origin does not matter, only differences do).
#[derive(Debug, Clone, PartialEq)]
pub struct Invocation {
    pub service: String,
    /// The replica (container, pod, host) that served it, when the source
    /// says.
    pub instance: Option<String>,
    /// The operation (method, interface, span name) it served.
    pub operation: String,
    /// When the service started and ended serving it.
    pub start: i64,
    pub end: i64,
    /// When its caller started and stopped waiting for it (the caller's
    /// view includes the network and any queue); equal to `start`..`end`
    /// when only the callee's record is known.
    pub called_at: i64,
    pub returned_at: i64,
    pub error: bool,
    /// Its own time as its record states it (ns), when it does (tailmesh's
    /// hops: their work and injected slowness, without the waits and the
    /// serving around them); else it is worked out from the children.
    pub own: Option<i64>,
    /// The calls it made and waited for, in the order they started.
    pub children: Vec<Invocation>,
    /// Calls it started and did not wait for (FOLLOWS_FROM references,
    /// asynchronous messages): kept out of its own time and call groups.
    pub detached: Vec<Invocation>,
}

impl Invocation {
    /// How long the service served it.
    pub fn duration(&self) -> i64 {
        self.end - self.start
    }

    /// Its own time: how long it served minus the time it spent waiting
    /// for its children, as the union of the children's waits (so
    /// parallel children are not subtracted twice), clipped to its own
    /// interval. Never negative.
    pub fn own_time(&self) -> i64 {
        if let Some(own) = self.own {
            return own.clamp(0, self.duration().max(0));
        }
        let mut waits: Vec<(i64, i64)> = self
            .children
            .iter()
            .map(|c| (c.called_at.max(self.start), c.returned_at.min(self.end)))
            .filter(|(a, b)| b > a)
            .collect();
        waits.sort_unstable();
        let mut waited = 0;
        let mut covered_to = i64::MIN;
        for (a, b) in waits {
            let a = a.max(covered_to);
            if b > a {
                waited += b - a;
                covered_to = b;
            }
        }
        (self.duration() - waited).max(0)
    }

    /// Every invocation in this tree, this one first, depth first.
    pub fn walk(&self) -> Vec<&Invocation> {
        let mut out = vec![self];
        let mut i = 0;
        while i < out.len() {
            let node = out[i];
            out.extend(node.children.iter());
            i += 1;
        }
        out
    }

    /// Puts the children in start order and repairs their times against
    /// this invocation's, recursively: a child the caller saw start before
    /// the caller itself did (clocks of two machines disagree), or end
    /// after it, is shifted into the caller's interval with its whole
    /// subtree (clipped when longer than it), and counted.
    pub fn repair(&mut self, repairs: &mut Repairs) {
        if self.end < self.start {
            repairs.negative_durations += 1;
            self.end = self.start;
        }
        for child in &mut self.children {
            let (lo, hi) = (
                child.called_at.min(child.start),
                child.returned_at.max(child.end),
            );
            let shift = if lo < self.start {
                self.start - lo
            } else if hi > self.end {
                (self.end - hi).max(self.start - lo)
            } else {
                0
            };
            if shift != 0 {
                repairs.clock_skew += 1;
                child.shift(shift);
                if child.returned_at.max(child.end) > self.end {
                    child.returned_at = child.returned_at.min(self.end);
                    child.end = child.end.min(self.end);
                    child.start = child.start.min(child.end);
                    child.called_at = child.called_at.min(child.start);
                }
            }
            child.repair(repairs);
        }
        self.children.sort_by_key(|c| (c.called_at, c.start));
        for child in &mut self.detached {
            child.repair(repairs);
        }
    }

    fn shift(&mut self, by: i64) {
        self.start += by;
        self.end += by;
        self.called_at += by;
        self.returned_at += by;
        for c in self.children.iter_mut().chain(self.detached.iter_mut()) {
            c.shift(by);
        }
    }
}

/// What an import repaired or left out, and why; shown to the user with
/// the mesh, so nothing is dropped silently.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Repairs {
    /// Traces read (before any was dropped).
    pub traces_read: u64,
    /// Spans (or call-graph rows) read.
    pub records_read: u64,
    /// A child that started before its caller or ended after it (clock
    /// skew between machines): shifted into the caller's interval.
    pub clock_skew: u64,
    /// A span whose parent is not in its trace: its subtree is dropped
    /// when the trace has a root, since where it hangs is unknown.
    pub orphans: u64,
    /// A trace with no root at all (its first span lost): its orphaned
    /// subtrees are kept as roots of their own.
    pub rootless_traces: u64,
    /// Children linked by FOLLOWS_FROM (asynchronous): kept apart from
    /// their caller's own time and call groups.
    pub detached: u64,
    /// A span without a service name: counted with its parent's service
    /// (or `unknown` at a root).
    pub no_service: u64,
    /// A span or row seen twice: the first kept.
    pub duplicates: u64,
    /// A row or span that contradicts its trace (a callee that is not its
    /// caller's callee, an end before its start): counted, then repaired
    /// where the text says how, dropped otherwise.
    pub inconsistent: u64,
    /// An end before its start: the duration set to zero.
    pub negative_durations: u64,
    /// A client span with no server span of the callee beneath it (an
    /// uninstrumented callee, a database): its time stays in its caller's
    /// own time.
    pub uninstrumented_calls: u64,
    /// Why whole records were left out, with how many of each.
    pub dropped: BTreeMap<String, u64>,
}

impl Repairs {
    pub fn add(&mut self, o: &Repairs) {
        self.traces_read += o.traces_read;
        self.records_read += o.records_read;
        self.clock_skew += o.clock_skew;
        self.orphans += o.orphans;
        self.rootless_traces += o.rootless_traces;
        self.detached += o.detached;
        self.no_service += o.no_service;
        self.duplicates += o.duplicates;
        self.inconsistent += o.inconsistent;
        self.negative_durations += o.negative_durations;
        self.uninstrumented_calls += o.uninstrumented_calls;
        for (why, n) in &o.dropped {
            *self.dropped.entry(why.clone()).or_default() += n;
        }
    }

    /// Counts a record left out, and why.
    pub fn drop(&mut self, why: &str) {
        *self.dropped.entry(why.to_string()).or_default() += 1;
    }

    /// One line per non-zero count, for people.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "read {} traces, {} records",
            self.traces_read, self.records_read
        )];
        let counts = [
            (
                self.clock_skew,
                "children shifted into their caller's interval (clock skew)",
            ),
            (
                self.orphans,
                "spans whose parent is missing (subtree dropped where the trace has a root)",
            ),
            (
                self.rootless_traces,
                "traces without a root (orphaned subtrees kept as roots)",
            ),
            (
                self.detached,
                "asynchronous (FOLLOWS_FROM) children kept out of their caller's time",
            ),
            (
                self.no_service,
                "spans without a service name (given their parent's)",
            ),
            (self.duplicates, "duplicate spans or rows (first kept)"),
            (self.inconsistent, "records contradicting their trace"),
            (
                self.negative_durations,
                "ends before starts (duration set to 0)",
            ),
            (
                self.uninstrumented_calls,
                "calls to uninstrumented callees (time left in the caller's own)",
            ),
        ];
        for (n, what) in counts {
            if n > 0 {
                out.push(format!("{n} {what}"));
            }
        }
        for (why, n) in &self.dropped {
            out.push(format!("{n} dropped: {why}"));
        }
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An invocation of `service` from `start` to `end` (ns), seen the same
    /// by its caller.
    pub(crate) fn inv(
        service: &str,
        start: i64,
        end: i64,
        children: Vec<Invocation>,
    ) -> Invocation {
        Invocation {
            service: service.into(),
            instance: None,
            operation: "op".into(),
            start,
            end,
            called_at: start,
            returned_at: end,
            error: false,
            own: None,
            children,
            detached: Vec::new(),
        }
    }

    #[test]
    fn own_time_subtracts_the_union_of_the_children_waits() {
        // a: 0..100; b 10..40 and c 20..50 overlap (union 10..50 = 40);
        // d 60..70 after them: own = 100 - 40 - 10 = 50.
        let a = inv(
            "a",
            0,
            100,
            vec![
                inv("b", 10, 40, vec![]),
                inv("c", 20, 50, vec![]),
                inv("d", 60, 70, vec![]),
            ],
        );
        assert_eq!(a.own_time(), 50);
        // A child as long as its caller leaves nothing.
        assert_eq!(inv("a", 0, 10, vec![inv("b", 0, 10, vec![])]).own_time(), 0);
    }

    #[test]
    fn a_skewed_child_is_shifted_into_its_caller_with_its_subtree() {
        let mut a = inv(
            "a",
            100,
            200,
            vec![inv("b", 90, 120, vec![inv("c", 95, 100, vec![])])],
        );
        let mut repairs = Repairs::default();
        a.repair(&mut repairs);
        assert_eq!(repairs.clock_skew, 1);
        let b = &a.children[0];
        assert_eq!((b.start, b.end), (100, 130));
        assert_eq!((b.children[0].start, b.children[0].end), (105, 110));
        // A child longer than its caller is clipped to it.
        let mut a = inv("a", 0, 10, vec![inv("b", 5, 30, vec![])]);
        a.repair(&mut repairs);
        let b = &a.children[0];
        assert!(b.start >= 0 && b.end <= 10, "{b:?}");
    }

    #[test]
    fn repairs_add_up_and_read_as_lines() {
        let mut a = Repairs {
            clock_skew: 2,
            ..Repairs::default()
        };
        a.drop("no trace id");
        let mut b = Repairs {
            clock_skew: 1,
            traces_read: 4,
            ..Repairs::default()
        };
        b.drop("no trace id");
        b.add(&a);
        assert_eq!(b.clock_skew, 3);
        assert_eq!(b.dropped["no trace id"], 2);
        let lines = b.lines();
        assert!(
            lines.iter().any(|l| l.starts_with("3 children shifted")),
            "{lines:?}"
        );
        assert!(
            lines.iter().any(|l| l == "2 dropped: no trace id"),
            "{lines:?}"
        );
    }
}
