//! The summary printed at the end of a run: an end-to-end table, a per-hop
//! table, a per-phase table for each variant whose schedule changes during
//! the run, and one compounding line per variant.

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{CellAlignment, ColumnConstraint, ContentArrangement, Table};

use tailmesh_units::{micros, percent, signed_percent};

use super::phases;

use crate::{
    analysis::{Percentiles, Summary, VariantReport},
    traces::breakdown::{Dist, TraceReport},
};

/// Renders `summary` for a terminal. Never panics, also without variants or
/// requests (missing numbers print as `-`).
pub fn render_table(summary: &Summary) -> String {
    let mut out = end_to_end(&summary.variants).to_string();
    out.push('\n');
    if summary.variants.iter().any(|v| !v.hops.is_empty()) {
        out.push_str(&per_hop(&summary.variants).to_string());
        out.push('\n');
    }
    if let Some(causes) = super::causes::causes_table(&summary.variants) {
        out.push_str(&causes.to_string());
        out.push('\n');
    }
    if let Some(sweep) = &summary.sweep {
        out.push_str(&sweep_table(sweep).to_string());
        out.push('\n');
        if let Some(t) = side_by_side_table(sweep) {
            out.push_str(&t.to_string());
            out.push('\n');
        }
    }
    // A sweep has its own table; pairwise lines would only repeat it.
    if let (None, Some((first, rest))) = (&summary.sweep, summary.variants.split_first()) {
        for v in rest {
            out.push_str(&comparison_line(first, v));
        }
    }
    if summary.variants.iter().any(|v| v.traces.is_some()) {
        out.push_str(&trace_breakdown(&summary.variants).to_string());
        out.push('\n');
    }
    for v in summary.variants.iter().filter(|v| !v.phases.is_empty()) {
        out.push_str(&format!(
            "{}: phases (seconds from the end of warmup)\n",
            v.name
        ));
        out.push_str(&phase_table(v).to_string());
        out.push('\n');
        if let Some(k) = &v.knee {
            out.push_str(&format!("{}: {}\n", v.name, phases::knee_line(k)));
        }
    }
    for v in &summary.variants {
        if let Some(line) = v.traces.as_ref().and_then(trace_disagreement) {
            out.push_str(&format!("{}: traces: {line}\n", v.name));
        }
        if let Some(o) = &v.observer {
            out.push_str(&format!("{}: observer: {}\n", v.name, o.line()));
        }
        if !v.accounted {
            out.push_str(&format!(
                "{}: accounting mismatch: sent {} vs ok {} + errors {} + timeouts {} ({} duplicate ids)\n",
                v.name,
                v.sent,
                v.ok,
                v.errors.values().sum::<u64>(),
                v.timeouts,
                v.duplicate_ids
            ));
        }
        if let Some(streams) = &v.streams {
            out.push_str(&format!("{}: streams: {}\n", v.name, streams_line(streams)));
        }
        for k in &v.kills {
            out.push_str(&format!("{}: {}\n", v.name, kill_line(k)));
        }
        if let Some(line) = crate::analysis::endpoints::describe(&v.endpoints) {
            out.push_str(&format!("{}: endpoints: {line}\n", v.name));
        }
        if let Some(line) = compounding_line(v) {
            out.push_str(&format!("{}: {line}\n", v.name));
        }
        for line in composition_lines(v) {
            out.push_str(&format!("{}: {line}\n", v.name));
        }
    }
    if summary.check.compounding_requested || !summary.check.distribution.is_empty() {
        out.push_str(&format!("check: {}\n", summary.check.verdict.as_str()));
    }
    for line in summary.check.error_failures() {
        out.push_str(&format!("check: {line}\n"));
    }
    out
}

/// What became of a variant's streams, in one line: each message is one
/// of the requests of the tables above.
pub(crate) fn streams_line(s: &crate::record::StreamReport) -> String {
    let aborted: u64 = s.aborted.values().sum();
    let mut line = format!(
        "{} opened (warmup's included), {} held to their end, {aborted} broke",
        s.opened, s.completed
    );
    if aborted > 0 {
        let codes: Vec<String> = s.aborted.iter().map(|(c, n)| format!("{c} {n}")).collect();
        line.push_str(&format!(" ({})", codes.join(", ")));
    }
    line.push_str(&format!(
        "; {} messages refused by the in-flight cap; at most {} awaiting answers on one stream",
        s.refused_by_cap, s.peak_in_flight
    ));
    if s.first_message.count > 0 {
        let ms = |us: u64| micros(us as f64);
        line.push_str(&format!(
            "; first message p50 {} / p99 {}, stream p50 {} / p99 {}",
            ms(s.first_message.p50_us),
            ms(s.first_message.p99_us),
            ms(s.duration.p50_us),
            ms(s.duration.p99_us)
        ));
    }
    line
}

/// One line per kind of number the table shows, for the kinds this run has:
/// what the columns mean, so the table can be read without the docs.
pub fn render_legend(summary: &Summary) -> String {
    let mut lines = vec![
        "how to read it (docs/measurement.md, \"Reading the results\"):",
        "  sent = ok + errors + timeouts: every request the load generator sent, by outcome",
        "  rate/requested: requests sent per second / the rate (a ramp's mean, or c=concurrency) asked for",
        "  p50 .. max: end-to-end latency of ok requests, measured from each request's intended send time",
    ];
    if summary.variants.iter().any(|v| !v.hops.is_empty()) {
        lines.extend([
            "  replica split: requests each replica of the hop served",
            "  p_slow: share of the hop's requests that got injected slowness (from the reply paths)",
            "  service: time the hop spent on a request itself; queue: time it waited for a slot or in the broker",
        ]);
    }
    if summary.variants.iter().any(|v| v.traces.is_some()) {
        lines.push(
            "  traces: self = the hop's own time; queue wait = in the broker or for a slot; network = the caller's client time minus the callee's server time",
        );
    }
    if summary
        .variants
        .iter()
        .any(|v| v.observer.as_ref().is_some_and(|o| o.traced))
    {
        lines.push(
            "  observer: CPU tracing took while the load ran (the hops recording and exporting spans, the orchestrator receiving, spooling and sampling them), per traced request and as a share of the run's CPU; parts in summary.json's observer",
        );
    }
    if summary.variants.iter().any(|v| v.compounding.is_some()) {
        lines.extend([
            "  compounding: measured = share of requests over the slow threshold, [95 % Wilson interval]",
            "    model = 1 - prod(1 - p_i) with each hop's p_slow as measured; declared = the same with the scenario's probabilities",
            "    pass: the model lies in the interval; fail: it does not, and the mesh made the difference (named);",
            "    inconclusive: too few requests, or the difference is mostly the instrument's (the load generator,",
            "    unexplained slowness, or a busy machine; named); --check exits 3 on fail, 4 on inconclusive",
        ]);
    }
    if summary.variants.iter().any(|v| v.composition.is_some()) {
        lines.extend([
            "  tail: end-to-end quantiles measured / composed / declared; composed = each hop's measured segments (reach, queue,",
            "    own time, rest) composed as independent; declared = the scenario's distributions with the measured overheads;",
            "    dependence = measured over composed at p99 and where it comes from; distribution ([check] distribution):",
            "    pass within the tolerance or the intervals; --check exits 3 on fail, 4 on inconclusive",
        ]);
    }
    if super::causes::causes_table(&summary.variants).is_some() {
        lines.push(super::causes::causes_legend());
    }
    let mut out = lines.join("\n");
    let mut phases = summary.variants.iter().flat_map(|v| &v.phases).peekable();
    if phases.peek().is_some() {
        out.push_str("\n  phases: the run cut at each fault window's start and end and at each load step (seconds from the end of warmup); a request counts in the phase of its intended send time");
    }
    if let Some(r) = phases.find_map(|p| p.recovery.as_ref()) {
        out.push_str(&format!(
            "\n  recovery: from a window's end to the first rolling stretch of {} ok requests whose p99 is within {} x the p99 of the last phase without a fault",
            r.min_requests, r.band
        ));
    }
    out
}

/// The files a run wrote, one per line, and where its report is.
pub fn render_files(dir: &std::path::Path, files: &[std::path::PathBuf]) -> String {
    let mut out = format!("\nfiles written to {}:\n", dir.display());
    for f in files {
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        out.push_str(&format!("  {name}\n"));
    }
    let (logs, what) = super::files::LOGS;
    out.push_str(&format!("  {logs} ({what})\n"));
    if let Some(report) = files.iter().find(|f| f.ends_with("report.html")) {
        out.push_str(&format!("report: {}", report.display()));
    }
    out
}

/// `pull vs push: p50 x1.30, p99 x0.72, p99.9 x0.86, throughput x0.84`:
/// a variant's latency and ok rate as multiples of the first variant's.
fn comparison_line(base: &VariantReport, v: &VariantReport) -> String {
    let ratio = |a: f64, b: f64| {
        if b > 0.0 && a.is_finite() {
            format!("x{:.2}", a / b)
        } else {
            "-".to_string()
        }
    };
    let (l, b) = (&v.latency, &base.latency);
    format!(
        "{} vs {}: p50 {}, p99 {}, p99.9 {}, throughput {}{}\n",
        v.name,
        base.name,
        ratio(l.p50_us as f64, b.p50_us as f64),
        ratio(l.p99_us as f64, b.p99_us as f64),
        ratio(l.p99_9_us as f64, b.p99_9_us as f64),
        ratio(v.ok_rate, base.ok_rate),
        if v.extra_load > 0.0 || base.extra_load > 0.0 {
            format!(
                ", extra requests {} (vs {})",
                percent(v.extra_load),
                percent(base.extra_load)
            )
        } else {
            String::new()
        },
    )
}

/// The sweep: one row per point, with the compounding curve's numbers
/// when the run checked compounding.
fn sweep_table(sweep: &crate::analysis::SweepSummary) -> Table {
    let key = format!("sweep {}", sweep.key);
    let checked = sweep.rows.iter().any(|r| r.compounding.is_some());
    let mut header = vec!["variant", &key, "sent", "p50", "p99", "p99.9"];
    if checked {
        header.extend([
            "slow measured",
            "95 % interval",
            "model",
            "declared",
            "verdict",
        ]);
    }
    let mut t = table(&header);
    for r in &sweep.rows {
        let mut row = vec![
            r.group.clone(),
            r.value.clone(),
            r.sent.to_string(),
            micros(r.p50_us as f64),
            micros(r.p99_us as f64),
            micros(r.p99_9_us as f64),
        ];
        match &r.compounding {
            Some(c) => row.extend([
                percent(c.measured),
                format!("[{}, {}]", percent(c.ci_lo), percent(c.ci_hi)),
                percent(c.model),
                percent(c.declared_model),
                c.verdict.as_str().to_string(),
            ]),
            None if checked => row.extend(std::iter::repeat_n("-".to_string(), 5)),
            None => {}
        }
        t.add_row(row);
    }
    t
}

/// With two or more declared variants in the sweep: p50 / p99 with a row
/// per swept value and a column per variant, to compare them at each value.
fn side_by_side_table(sweep: &crate::analysis::SweepSummary) -> Option<Table> {
    let groups = sweep.groups();
    if groups.len() < 2 {
        return None;
    }
    let mut header = vec![sweep.key.clone()];
    header.extend(groups.iter().map(|g| format!("{g} p50 / p99")));
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut t = table(&header);
    if let Some(first) = t.column_mut(1) {
        first.set_cell_alignment(CellAlignment::Right);
    }
    for value in &sweep.values {
        let mut row = vec![value.clone()];
        row.extend(groups.iter().map(|g| match sweep.row(g, value) {
            Some(r) if r.ok > 0 => {
                format!("{} / {}", micros(r.p50_us as f64), micros(r.p99_us as f64))
            }
            _ => "-".to_string(),
        }));
        t.add_row(row);
    }
    Some(t)
}

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_header(header.to_vec());
    for (i, column) in t.column_iter_mut().enumerate() {
        if i > 1 {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    t
}

fn end_to_end(variants: &[VariantReport]) -> Table {
    let mut t = table(&[
        "variant",
        "sent",
        "ok",
        "errors",
        "timeouts",
        "rate/requested",
        "p50",
        "p90",
        "p99",
        "p99.9",
        "p99.99",
        "max",
    ]);
    for v in variants {
        let p = &v.latency;
        let steps = &v.load.steps;
        let stepped_s: f64 = steps.iter().map(|s| s.duration_s).sum();
        let requested = match (v.load.rate, v.load.concurrency) {
            // A ramp asks for its steps' mean rate.
            _ if stepped_s > 0.0 => {
                let mean = steps.iter().map(|s| s.rate * s.duration_s).sum::<f64>() / stepped_s;
                format!("{mean:.0}/s mean")
            }
            (Some(rate), _) => format!("{rate:.0}/s"),
            (None, Some(c)) => format!("c={c}"),
            (None, None) => "-".to_string(),
        };
        t.add_row(vec![
            v.name.clone(),
            v.sent.to_string(),
            v.ok.to_string(),
            v.errors.values().sum::<u64>().to_string(),
            v.timeouts.to_string(),
            format!("{:.1}/s / {requested}", v.achieved_rate),
            human(p, p.p50_us),
            human(p, p.p90_us),
            human(p, p.p99_us),
            human(p, p.p99_9_us),
            human(p, p.p99_99_us),
            human(p, p.max_us),
        ]);
    }
    t
}

fn per_hop(variants: &[VariantReport]) -> Table {
    let mut t = table(&[
        "variant",
        "hop",
        "transport",
        "requests",
        "replica split",
        "p_slow",
        "service p50",
        "service p99",
        "queue p99",
    ]);
    for v in variants {
        for h in &v.hops {
            let split: Vec<String> = h.replica_requests.iter().map(u64::to_string).collect();
            t.add_row(vec![
                v.name.clone(),
                h.hop.clone(),
                h.transport.to_string(),
                h.requests.to_string(),
                split.join("/"),
                h.p_slow.map_or("-".to_string(), percent),
                human(&h.service, h.service.p50_us),
                human(&h.service, h.service.p99_us),
                human(&h.queue_wait, h.queue_wait.p99_us),
            ]);
        }
    }
    t
}

/// `v`'s phases, a row each, within 100 columns: the numbers keep their
/// width; the phase, its faults and the recovery share the rest, each
/// wrapping only when it does not fit.
fn phase_table(v: &VariantReport) -> Table {
    const TEXT: [usize; 3] = [0, 2, 9];
    let mut t = table(&phases::COLUMNS);
    t.set_content_arrangement(ContentArrangement::Dynamic)
        .set_width(100);
    for p in &v.phases {
        t.add_row(phases::cells(p).to_vec());
    }
    for (i, column) in t.column_iter_mut().enumerate() {
        if TEXT.contains(&i) {
            column.set_cell_alignment(CellAlignment::Left);
        } else {
            column.set_constraint(ColumnConstraint::ContentWidth);
        }
    }
    t
}

/// The per-hop breakdown from the traces: medians and p99s in µs.
fn trace_breakdown(variants: &[VariantReport]) -> Table {
    let mut t = table(&[
        "variant",
        "hop (traces)",
        "spans",
        "self p50/p99",
        "downstream p50/p99",
        "network p50/p99",
        "queue wait p50/p99",
    ]);
    let pair = |d: &Dist| format!("{} / {}", micros(d.p50_us), micros(d.p99_us));
    for v in variants {
        let Some(traces) = &v.traces else { continue };
        for h in &traces.hops {
            t.add_row(vec![
                v.name.clone(),
                h.hop.clone(),
                h.spans.to_string(),
                pair(&h.self_time),
                pair(&h.downstream),
                pair(&h.network),
                pair(&h.queue_wait),
            ]);
        }
    }
    t
}

/// What the traces and the reply paths disagree on, if anything.
fn trace_disagreement(t: &TraceReport) -> Option<String> {
    if t.missing == 0 && t.incomplete == 0 && t.orphan_spans == 0 && t.timing_disagreements == 0 {
        return None;
    }
    Some(format!(
        "{} of {} sampled ok requests have a complete trace; {} missing, {} disagree with their reply path, {} orphan span(s), {} hop time(s) off the path's by more than 1ms",
        t.complete, t.expected, t.missing, t.incomplete, t.orphan_spans, t.timing_disagreements
    ))
}

/// `compounding: measured 27.3 % [26.1 %, 28.6 %] vs model 27.1 % (declared
/// 27.1 %): pass`, or `None` when the check was not requested.
/// `kill: b/1 at 3.00 s (killed 3.00 s), back 6.00 s (ready 6.04 s)`.
fn kill_line(k: &crate::analysis::KillRecord) -> String {
    let at = |t: Option<f64>| t.map_or_else(|| "not done".to_owned(), |t| format!("{t:.2} s"));
    let mut line = format!(
        "kill: {}/{} at {:.2} s (killed {})",
        k.hop,
        k.replica,
        k.at_s,
        at(k.killed_at_s)
    );
    if let Some(back) = k.back_s {
        line.push_str(&format!(
            ", back {back:.2} s (serving {})",
            at(k.restarted_at_s)
        ));
    }
    if !k.picks_while_down.is_empty() {
        let sent: u64 = k.picks_while_down.iter().map(|c| c.picks).sum();
        line.push_str(&format!("; {sent} call(s) sent to it while down"));
    }
    line
}

fn compounding_line(v: &VariantReport) -> Option<String> {
    let c = v.compounding.as_ref()?;
    let measured = if c.n == 0 {
        "measured - (no trials)".to_string()
    } else {
        format!(
            "measured {} [{}, {}]",
            percent(c.measured),
            percent(c.ci_lo),
            percent(c.ci_hi)
        )
    };
    let mut line = format!(
        "compounding: {measured} vs model {} (declared {}): {}",
        percent(c.model),
        percent(c.declared_model),
        c.verdict.as_str()
    );
    if let Some(reason) = &c.reason {
        line.push_str(&format!(" ({reason})"));
    }
    Some(line)
}

/// `tail: p50 1.02ms / 1.01ms / 1.10ms, p90 ..., p99 ..., p99.9 ...
/// (measured / composed / declared); dependence +31 % at p99: ...`, and
/// the distribution verdict when the check was requested.
fn composition_lines(v: &VariantReport) -> Vec<String> {
    let Some(c) = &v.composition else {
        return Vec::new();
    };
    let cell = |x: Option<f64>| x.map_or("-".to_string(), micros);
    let quantiles: Vec<String> = ["p50", "p90", "p99", "p99.9"]
        .iter()
        .enumerate()
        .map(|(k, label)| {
            let declared = c.declared.as_ref().and_then(|d| d.get(k));
            let mut cellv = format!(
                "{label} {} / {}",
                cell(c.measured.point.get(k)),
                cell(c.composed.point.get(k))
            );
            if c.declared.is_some() {
                cellv.push_str(&format!(" / {}", cell(declared)));
            }
            cellv
        })
        .collect();
    let what = if c.declared.is_some() {
        "measured / composed / declared"
    } else {
        "measured / composed"
    };
    let mut line = format!("tail: {} ({what})", quantiles.join(", "));
    if let Some(share) = c.dependence.excess_share.p99_us {
        line.push_str(&format!("; dependence {} at p99", signed_percent(share)));
        if let Some(source) = &c.dependence.source {
            line.push_str(&format!(": {source}"));
        }
    }
    let mut lines = vec![line];
    if let Some(check) = &c.check {
        lines.push(format!(
            "distribution: {} ({})",
            check.verdict.as_str(),
            check.reason
        ));
    }
    lines
}

/// `us` from `p` for people (`456 us`, `1.23 ms`, `2.50 s`); `-` when `p`
/// is empty.
fn human(p: &Percentiles, us: u64) -> String {
    if p.count == 0 {
        "-".to_string()
    } else {
        micros(us as f64)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::analysis::testing::{chain3, check, summary};
    use crate::analysis::{summary::CheckSummary, testing::analyze_variant};

    #[test]
    fn a_sweep_of_variants_gets_a_side_by_side_table() {
        let s = crate::analysis::testing::swept_summary(&["python", "cpp"], &["1", "8"]);
        let table = side_by_side_table(s.sweep.as_ref().expect("a sweep"))
            .expect("two variants")
            .to_string();
        let lines: Vec<&str> = table.lines().collect();
        let cells = |line: &str| -> Vec<String> {
            line.split(['│', '┆'])
                .map(|c| c.trim().to_owned())
                .filter(|c| !c.is_empty())
                .collect()
        };
        assert_eq!(
            cells(lines[1]),
            ["load.concurrency", "python p50 / p99", "cpp p50 / p99"],
            "{table}"
        );
        let rows: Vec<Vec<String>> = lines
            .iter()
            .map(|l| cells(l))
            .filter(|c| c.len() == 3 && (c[0] == "1" || c[0] == "8"))
            .collect();
        assert_eq!(
            rows,
            [
                ["1", "100 us / 200 us", "1.00 ms / 2.00 ms"],
                ["8", "1.00 ms / 2.00 ms", "10.0 ms / 20.0 ms"]
            ],
            "{table}"
        );
        assert!(render_table(&s).contains(&table));
        // Unchecked: the sweep table has no compounding columns.
        let sweep = sweep_table(s.sweep.as_ref().expect("a sweep")).to_string();
        assert!(
            sweep.contains("p99.9") && !sweep.contains("slow measured"),
            "{sweep}"
        );
        // One declared variant: nothing to put side by side.
        let one = crate::analysis::testing::swept_summary(&["tailmesh"], &["1", "2"]);
        assert!(side_by_side_table(one.sweep.as_ref().expect("a sweep")).is_none());
    }

    #[test]
    fn shows_percentiles_hops_and_the_verdict() {
        let text = render_table(&summary());
        assert!(text.contains("1.00 ms"), "{text}");
        assert!(text.contains("21.0 ms"), "{text}");
        assert!(text.contains("500/500"), "{text}");
        assert!(text.contains("10.0 %"), "{text}");
        assert!(text.contains("400/s"), "{text}");
        // 276 of 1005 slow: 27.5 % [24.8, 30.3]; model 0.1 at three hops.
        assert!(
            text.contains(
                "base: compounding: measured 27.5 % [24.8 %, 30.3 %] vs model 27.1 % (declared 27.1 %): pass"
            ),
            "{text}"
        );
        assert!(text.ends_with("check: pass\n"), "{text}");
        assert!(
            !text.contains("hop (traces)"),
            "no traces, no table: {text}"
        );
    }

    #[test]
    fn shows_the_trace_breakdown_and_names_disagreements() {
        use crate::traces::breakdown::HopBreakdown;
        let mut s = summary();
        let hop = HopBreakdown {
            hop: "frontend".into(),
            spans: 9,
            self_time: Dist::of(vec![1_500_000; 9]),
            ..HopBreakdown::default()
        };
        s.variants[0].traces = Some(TraceReport {
            expected: 10,
            complete: 7,
            missing: 2,
            incomplete: 1,
            hops: vec![hop],
            ..TraceReport::default()
        });
        let text = render_table(&s);
        assert!(text.contains("hop (traces)"), "{text}");
        assert!(text.contains("1.50 ms / 1.50 ms"), "{text}");
        assert!(
            text.contains(
                "base: traces: 7 of 10 sampled ok requests have a complete trace; 2 missing, 1 disagree with their reply path, 0 orphan span(s), 0 hop time(s) off the path's by more than 1ms"
            ),
            "{text}"
        );
    }

    #[test]
    fn states_the_observer_cost_of_each_variant_that_has_one() {
        use crate::analysis::ObserverReport;
        let mut s = summary();
        assert!(!render_table(&s).contains("observer"), "none measured");
        s.variants[0].observer = Some(ObserverReport::off());
        let text = render_table(&s);
        assert!(
            text.contains("base: observer: traces off: no observer cost\n"),
            "{text}"
        );
        assert!(
            !render_legend(&s).contains("observer"),
            "nothing to explain"
        );
        let measured = crate::analysis::observer::ObserverInputs {
            traced_requests: 10,
            spans: 70,
            spool_ns: 20_000,
            ..Default::default()
        };
        s.variants[0].observer = Some(ObserverReport::assess(&measured, &s.variants[0]));
        let text = render_table(&s);
        assert!(
            text.contains(
                "base: observer: 7.0 spans/request, 2.0 us CPU per request; hops' own cost not reported\n"
            ),
            "{text}"
        );
        assert!(render_legend(&s).contains("  observer: CPU tracing took"));
    }

    #[test]
    fn later_variants_are_compared_with_the_first() {
        let mut s = summary();
        let mut other = s.variants[0].clone();
        other.name = "pull".into();
        other.latency.p50_us = s.variants[0].latency.p50_us * 2;
        other.latency.p99_us = s.variants[0].latency.p99_us / 2;
        other.ok_rate = s.variants[0].ok_rate * 0.5;
        s.variants.push(other);
        let text = render_table(&s);
        assert!(
            text.contains("pull vs base: p50 x2.00, p99 x0.50"),
            "{text}"
        );
        assert!(text.contains("throughput x0.50"), "{text}");
        assert_eq!(text.matches(" vs base:").count(), 1, "{text}");
    }

    #[test]
    fn empty_inputs_do_not_panic() {
        let mut s = summary();
        let empty = analyze_variant(&chain3(), &check(), &[], Duration::ZERO);
        s.variants = vec![empty];
        s.check = CheckSummary::of(&s.variants, 1.0);
        let text = render_table(&s);
        assert!(text.contains("measured - (no trials)"), "{text}");
        assert!(text.contains("inconclusive"), "{text}");
        s.variants.clear();
        s.check = CheckSummary::of(&s.variants, 1.0);
        assert!(render_table(&s).contains("variant"));
    }

    /// The summary's variant with a slow window on b from 5 s to 10 s of
    /// 20 s: before, during and after, the tail not back by the end.
    fn windowed() -> crate::analysis::Summary {
        use crate::analysis::{Recovery, RecoveryOutcome};
        use crate::output::phases::tests::phase;
        let mut s = summary();
        let v = &mut s.variants[0];
        let mut during = phase("during", (5.0, 10.0), 2000, 90);
        during.faults = vec!["slow b".into()];
        during.errors = 30;
        during.timeouts = 10;
        during.error_share = 0.02;
        let mut after = phase("after", (10.0, 20.0), 4000, 60);
        after.recovery = Some(Recovery {
            after: vec!["slow b".into()],
            baseline: Some("before".into()),
            baseline_p99_us: Some(12_000),
            band: 1.25,
            min_requests: 200,
            outcome: RecoveryOutcome::NotRecovered {
                last_p99_us: 140_000,
            },
        });
        v.phases = vec![phase("before", (0.0, 5.0), 2000, 12), during, after];
        s
    }

    /// The rows of the phase table under the line `{title}`, cells
    /// trimmed, a wrapped cell joined back with a space (a line with no
    /// `sent` goes on the row before: numbers never wrap).
    fn rows_under(text: &str, title: &str) -> Vec<Vec<String>> {
        let start = text
            .find(&format!("{title}\n"))
            .unwrap_or_else(|| panic!("no {title}: {text}"));
        let mut rows: Vec<Vec<String>> = Vec::new();
        for line in text[start..].lines().skip(1) {
            if !['│', '┌', '╞'].iter().any(|c| line.starts_with(*c)) {
                break;
            }
            if !line.starts_with('│') {
                continue;
            }
            let cells: Vec<String> = line
                .trim_matches('│')
                .split('┆')
                .map(|c| c.trim().to_owned())
                .collect();
            match rows.last_mut() {
                Some(row) if cells[3].is_empty() => {
                    for (cell, more) in row.iter_mut().zip(cells) {
                        if !more.is_empty() {
                            cell.push(' ');
                            cell.push_str(&more);
                        }
                    }
                }
                _ => rows.push(cells),
            }
        }
        rows
    }

    #[test]
    fn a_ramp_asks_for_its_steps_mean_rate() {
        use crate::analysis::variant::StepSummary;
        let mut s = summary();
        s.variants[0].load.steps = [(100.0, 10.0), (400.0, 5.0)]
            .map(|(rate, duration_s)| StepSummary { rate, duration_s })
            .to_vec();
        let text = render_table(&s);
        assert!(text.contains("/ 200/s mean"), "{text}");
    }

    /// Every line from the phase table's title to its end, and the knee's
    /// line after it, is at most 100 columns.
    fn assert_phase_lines_fit(text: &str) {
        let at = text.find("base: phases").expect("a phase table");
        let lines: Vec<&str> = text[at..].lines().collect();
        let end = lines
            .iter()
            .position(|l| l.starts_with('└'))
            .expect("the table ends");
        let knee = lines.get(end + 1).filter(|l| l.contains("knee"));
        for line in lines[..=end].iter().chain(knee) {
            assert!(line.chars().count() <= 100, "too wide: {line}\n{text}");
        }
    }

    #[test]
    fn phases_get_a_table_each_row_with_its_numbers() {
        let s = windowed();
        let text = render_table(&s);
        let rows = rows_under(&text, "base: phases (seconds from the end of warmup)");
        assert_eq!(rows.len(), 4, "a header and three phases: {text}");
        assert_eq!(rows[0][0], "phase");
        assert_eq!(rows[0][9], "recovery");
        assert_eq!(
            rows[2],
            [
                "during", "5-10", "slow b", "2000", "400", "2.00 ms", "90.0 ms", "180 ms",
                "2.00 %", "-"
            ],
            "{text}"
        );
        assert_eq!(rows[3][0], "after");
        assert_eq!(rows[3][9], "not recovered (p99 140 ms)", "{text}");
        assert_phase_lines_fit(&text);
        // After the hop table, before the per-variant lines.
        let at = text.find("base: phases").expect("the title");
        assert!(text.find("replica split") < Some(at));
        assert!(text.find("base: compounding") > Some(at));
        assert!(!text.contains("knee"), "no steps, no knee: {text}");
        assert!(render_legend(&s).contains("  recovery: from a window's end"));
    }

    #[test]
    fn a_ramp_states_its_knee_and_long_cells_wrap() {
        use crate::analysis::{Knee, Recovery, RecoveryOutcome};
        use crate::output::phases::tests::phase;
        let mut s = summary();
        let v = &mut s.variants[0];
        v.phases = [(200.0, 10), (400.0, 11), (800.0, 45)]
            .iter()
            .enumerate()
            .map(|(i, &(rate, p99))| {
                let from = i as f64 * 10.0;
                let mut p = phase(&format!("step {}", i + 1), (from, from + 10.0), 100, p99);
                p.offered_rate = Some(rate);
                p
            })
            .collect();
        v.phases[2].faults = vec!["slow b".into(), "net c/1".into()];
        v.phases[2].recovery = Some(Recovery {
            after: vec!["slow b".into()],
            baseline: None,
            baseline_p99_us: None,
            band: 1.25,
            min_requests: 200,
            outcome: RecoveryOutcome::NotEnoughData {
                reason: "fewer than 200 ok requests in the phase's whole intervals".into(),
            },
        });
        v.knee = Some(Knee {
            step: "step 3".into(),
            rate: 800.0,
            reason: "p99 45ms is 4.1 times step 2's 11ms".into(),
        });
        let text = render_table(&s);
        let rows = rows_under(&text, "base: phases (seconds from the end of warmup)");
        let faults: Vec<&str> = rows.iter().skip(1).map(|r| r[2].as_str()).collect();
        assert_eq!(
            faults,
            ["200/s", "400/s", "800/s, slow b, net c/1"],
            "{text}"
        );
        assert_eq!(
            rows[3][9],
            "not enough data: fewer than 200 ok requests in the phase's whole intervals",
            "{text}"
        );
        assert!(
            text.contains("\nbase: knee: step 3 (800/s): p99 45ms is 4.1 times step 2's 11ms\n"),
            "{text}"
        );
        assert_phase_lines_fit(&text);
    }

    #[test]
    fn phases_as_the_analysis_finds_them_print_with_their_recovery() {
        use crate::analysis::testing::{at, hop, hop_record, variant};
        use crate::record::Outcome;
        // a -> b at 100/s for 20 s, b slow from 5 s to 10 s: 1 ms, then
        // 50 ms, 20 ms for 2 s after the window, then 1 ms again.
        let mut b = hop("b", Some(0.5));
        b.windows.slow = crate::scenario::Window {
            start: Duration::from_secs(5),
            duration: Some(Duration::from_secs(5)),
        };
        let v = variant("base", vec![hop("a", None), b]);
        let latency = |t: u64| match t {
            5_000..10_000 => 50,
            10_000..12_000 => 20,
            _ => 1,
        };
        let mut records: Vec<_> = (0..2000u64)
            .map(|i| {
                let t = i * 10;
                let mut r = at(i, t, latency(t), Outcome::Ok);
                r.path = vec![
                    hop_record("b", 0, 500, latency(t) > 10),
                    hop_record("a", 0, 300, false),
                ];
                r
            })
            .collect();
        records.sort_by_key(|r| r.end);
        let mut s = summary();
        s.variants = vec![analyze_variant(
            &v,
            &check(),
            &records,
            Duration::from_secs(20),
        )];
        let text = render_table(&s);
        let rows = rows_under(&text, "base: phases (seconds from the end of warmup)");
        let got: Vec<[&str; 4]> = rows
            .iter()
            .skip(1)
            .map(|r| [&r[0][..], &r[1][..], &r[2][..], &r[3][..]])
            .collect();
        assert_eq!(
            got,
            [
                ["before", "0-5", "-", "500"],
                ["during", "5-10", "slow b", "500"],
                ["after", "10-20", "-", "1000"]
            ],
            "{text}"
        );
        assert!(rows[2][6].starts_with("50."), "during's p99: {text}");
        assert_eq!(rows[3][9], "2.00 s", "{text}");
        assert_phase_lines_fit(&text);
    }

    #[test]
    fn without_phases_nothing_about_them_is_printed() {
        let s = summary();
        assert!(s.variants[0].phases.is_empty());
        let text = render_table(&s);
        assert!(!text.contains("phase") && !text.contains("knee"), "{text}");
        // The same text as with phases, less their table.
        let with = render_table(&windowed());
        let at = with.find("base: phases (").expect("a table");
        let end = at + with[at..].find("┘\n").expect("its end") + "┘\n".len();
        assert_eq!(format!("{}{}", &with[..at], &with[end..]), text);
        assert!(!render_legend(&s).contains("phases"));
    }

    #[test]
    fn kills_and_endpoint_changes_get_a_line_each() {
        use crate::analysis::{CallerEndpoints, EndpointEvent};
        let mut s = windowed();
        assert!(!render_table(&s).contains("kill:"));
        let v = &mut s.variants[0];
        v.kills = vec![crate::analysis::testing::kill_of_b1(&[
            ("a/0", 2),
            ("a/1", 1),
        ])];
        v.endpoints = vec![CallerEndpoints {
            caller: "a/0".into(),
            hop: "b".into(),
            replicas: Vec::new(),
            events: vec![EndpointEvent {
                at_s: 1.002,
                replica: 1,
                kind: "transient_failure".into(),
                reason: String::new(),
            }],
            dropped: 0,
        }];
        let text = render_table(&s);
        assert!(
            text.contains(
                "base: kill: b/1 at 1.00 s (killed 1.00 s), back 2.00 s (serving 2.02 s); 3 \
                 call(s) sent to it while down\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("base: endpoints: b r1 transient_failure (1.00 s)\n"),
            "{text}"
        );
    }

    #[test]
    fn human_units() {
        let mut p = Percentiles::default();
        assert_eq!(human(&p, 456), "-", "no request, no latency");
        p.count = 1;
        assert_eq!(human(&p, 456), "456 us");
        assert_eq!(human(&p, 1_234), "1.23 ms");
        assert_eq!(human(&p, 2_500_000), "2.50 s");
    }
}
