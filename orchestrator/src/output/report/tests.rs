//! report.html, section by section, from hand-made and analysed summaries.

use super::distribution::log_buckets;
use super::over_time::{bands_of, endpoint_marks, latency_over_time_chart, shared_bands};
use super::schedule::step_charts;
use super::throughput::{bucket_edges, throughput, throughput_chart, throughputs};
use super::*;
use crate::analysis::intervals::{IntervalRecorder, Window, sending_end};
use crate::analysis::testing::summary;
use crate::analysis::{IntervalSeries, SweepSummary, VariantReport};
use crate::output::svg::tests::panel_points;
use crate::output::svg::{BandKind, LineChart};
use crate::record::{Outcome, RequestRecord};

#[test]
fn the_page_is_self_contained_and_has_every_section() {
    let s = summary();
    let html = render_report(&s);
    assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
    for id in [
        "histogram",
        "spectrum",
        "hops",
        "throughput",
        "latency",
        "compounding",
        "errors",
    ] {
        assert!(html.contains(&format!("id=\"{id}\"")), "missing {id}");
    }
    for external in ["<script", "http://", "https://", "<link"] {
        let allowed = html.matches("http://www.w3.org/2000/svg").count();
        let found = html.matches(external).count();
        let found = if external == "http://" {
            found - allowed
        } else {
            found
        };
        assert_eq!(found, 0, "external reference {external}");
    }
    assert!(
        html.contains("class=\"pass\" id=\"verdict\""),
        "verdict shown"
    );
}

#[test]
fn latency_over_time_has_a_chart_per_variant() {
    let mut s = summary();
    let mut other = s.variants[0].clone();
    other.name = "pull".into();
    s.variants.push(other);
    let base = &s.variants[0].latency_over_time;
    // mixed_records: 2.5 s of requests in 1 s intervals, one slow in
    // ten at each hop.
    assert_eq!(
        base.iter()
            .map(|p| (p.start_s, p.ok))
            .take(3)
            .collect::<Vec<_>>(),
        [(0.0, 400), (1.0, 400), (2.0, 200)]
    );
    let html = render_report(&s);
    for id in ["latency-over-time-base", "latency-over-time-pull"] {
        let at = html
            .find(&format!("id=\"{id}\""))
            .unwrap_or_else(|| panic!("no {id}"));
        let chart = &html[at..at + html[at..].find("</svg>").expect("closed")];
        for q in ["p50", "p99", "p99.9"] {
            assert!(
                chart.contains(&format!("data-series=\"{q}\"")),
                "{id} has no {q} line"
            );
        }
    }
    // The p99 line goes through each interval's p99, at its middle.
    let chart = latency_over_time_chart(&s.variants[0], "c", Vec::new());
    let p99 = series(&chart, "p99");
    assert_eq!(p99[0].0, 0.5);
    assert_eq!(p99[0].1, base[0].p99_us as f64);
    assert!(
        base[0].p99_us > 20_000 && base[0].p50_us < 2_000,
        "{base:?}"
    );
    // The latency histograms came with the report.
    assert_eq!(s.variants[0].intervals_written, 20);
}

#[test]
fn the_observer_cost_has_a_section_when_measured() {
    let mut s = summary();
    assert!(!render_report(&s).contains("id=\"observer\""));
    s.variants[0].observer = Some(crate::analysis::ObserverReport::off());
    let html = render_report(&s);
    assert!(html.contains("id=\"observer\""), "{html}");
    assert!(
        html.contains("<td>traces off: no observer cost</td>"),
        "{html}"
    );
}

#[test]
fn streams_have_a_section_when_the_load_had_them() {
    let mut s = summary();
    assert!(!render_report(&s).contains("id=\"streams\""));
    s.variants[0].streams = Some(crate::record::StreamReport {
        opened: 5,
        completed: 4,
        aborted: [("unavailable".to_owned(), 1)].into_iter().collect(),
        ..Default::default()
    });
    let html = render_report(&s);
    assert!(
        html.contains(
            "<td>5 opened (warmup&#39;s included), 4 held to their end, 1 broke (unavailable 1)"
        ),
        "{html}"
    );
}

#[test]
fn an_offered_load_sweep_draws_the_hockey_stick_per_variant() {
    use crate::analysis::sweep::SweepRow;
    let row = |group: &str, value: &str, ok_rate: f64, error_share: f64| SweepRow {
        group: group.into(),
        value: value.into(),
        variant: format!("{group}-load.rate-{value}"),
        sent: 1000,
        ok: 900,
        ok_rate,
        error_share,
        p50_us: 5_000,
        p99_us: 250_000,
        p99_9_us: 400_000,
        compounding: None,
    };
    let mut sweep = SweepSummary {
        key: "load.rate".into(),
        values: vec!["100".into(), "300".into()],
        rows: vec![
            row("fifo", "100", 99.5, 0.0),
            row("fifo", "300", 120.25, 0.6),
            row("adaptive", "100", 99.5, 0.0),
            row("adaptive", "300", 195.0, 0.35),
        ],
    };
    let html = hockey_stick_section(&sweep);
    for id in ["hockey-goodput", "hockey-errors", "hockey"] {
        assert!(html.contains(&format!("id=\"{id}\"")), "missing {id}");
    }
    for text in [
        ">fifo<",
        ">adaptive<",
        ">offered<",
        "<td>120</td>",
        "<td>60.0 %</td>",
    ] {
        assert!(html.contains(text), "missing {text}: {html}");
    }
    let mut s = summary();
    s.sweep = Some(sweep.clone());
    let page = render_report(&s);
    assert!(page.contains("id=\"hockey-goodput\""));
    sweep.key = "hops".into();
    s.sweep = Some(sweep);
    let page = render_report(&s);
    assert!(
        !page.contains("id=\"hockey-goodput\""),
        "only for load.rate"
    );
}

/// The `<svg>` element with `id` in `html`.
fn svg_with_id<'a>(html: &'a str, id: &str) -> &'a str {
    let at = html
        .find(&format!("<svg id=\"{id}\""))
        .unwrap_or_else(|| panic!("no {id}"));
    &html[at..at + html[at..].find("</svg>").expect("closed")]
}

/// The x pixel of the highest point (the mode) of series `name` in
/// `panel`.
fn mode_x(panel: &str, name: &str) -> f64 {
    panel_points(panel, name)
        .into_iter()
        .fold((f64::NAN, f64::INFINITY), |best, p| {
            if p.1 < best.1 { p } else { best }
        })
        .0
}

#[test]
fn a_sweep_of_variants_shows_them_side_by_side_at_each_value() {
    let s = crate::analysis::testing::swept_summary(&["python", "cpp"], &["1", "8"]);
    let html = render_report(&s);
    assert!(html.contains("<h2>Side by side at each load.concurrency</h2>"));
    let chart = svg_with_id(&html, "sweep-distributions");
    let panels: Vec<&str> = chart.split("<g class=\"panel\"").skip(1).collect();
    assert_eq!(panels.len(), 2, "{chart}");
    for (panel, value) in panels.iter().zip(["1", "8"]) {
        assert!(
            panel.starts_with(&format!(" data-panel=\"load.concurrency = {value}\"")),
            "{panel}"
        );
        // One histogram per variant, each in its own colour in every
        // panel; cpp (ten times slower) peaks to the right of python.
        assert_eq!(stroke_of(panel, "python"), svg::PALETTE[0], "{panel}");
        assert_eq!(stroke_of(panel, "cpp"), svg::PALETTE[1], "{panel}");
        assert!(
            mode_x(panel, "cpp") > mode_x(panel, "python") + 20.0,
            "{panel}"
        );
    }
    // The spectra: one panel per value too, cpp above python.
    let spectra = svg_with_id(&html, "sweep-spectra");
    let panels_of_spectra: Vec<&str> = spectra.split("<g class=\"panel\"").skip(1).collect();
    assert_eq!(panels_of_spectra.len(), 2, "{spectra}");
    for panel in &panels_of_spectra {
        let top = |name: &str| {
            panel_points(panel, name)
                .iter()
                .map(|p| p.1)
                .fold(f64::INFINITY, f64::min)
        };
        assert!(top("cpp") < top("python"), "{panel}");
    }
    // Shared axes: python at 8 (1 ms) peaks where cpp at 1 (1 ms) does,
    // one panel's width to the right.
    let width = mode_x(panels[1], "python") - mode_x(panels[0], "cpp");
    assert!(width > 300.0 && width < 400.0, "{width}");
    let table = &html[html
        .find("<table id=\"sweep-side-by-side\">")
        .expect("the table")..];
    assert!(
        table.starts_with(
            "<table id=\"sweep-side-by-side\"><tr><th>load.concurrency</th>\
                 <th>python p50 / p99</th><th>cpp p50 / p99</th></tr>\
                 <tr><td>1</td><td>100 us / 200 us</td><td>1.00 ms / 2.00 ms</td></tr>\
                 <tr><td>8</td><td>1.00 ms / 2.00 ms</td><td>10.0 ms / 20.0 ms</td></tr></table>"
        ),
        "{table}"
    );
    // Unchecked: the sweep table has no compounding columns.
    let sweep = &html[html.find("<table id=\"sweep\">").expect("the sweep table")..];
    let sweep = &sweep[..sweep.find("</table>").expect("closed")];
    assert!(sweep.contains("<th>p99.9</th></tr>") && !sweep.contains("slow measured"));
    // p50 beside p99 across the sweep, per variant.
    let percentiles = svg_with_id(&html, "sweep-p99");
    for name in ["python p50", "python p99", "cpp p50", "cpp p99"] {
        assert!(
            percentiles.contains(&format!("data-series=\"{name}\"")),
            "{name}"
        );
    }
}

#[test]
fn a_sweep_of_one_variant_has_nothing_to_put_side_by_side() {
    let s = crate::analysis::testing::swept_summary(&["tailmesh"], &["1", "2", "4"]);
    let html = render_report(&s);
    assert!(html.contains("id=\"sweep-p99\""));
    for id in ["sweep-distributions", "sweep-spectra", "sweep-side-by-side"] {
        assert!(!html.contains(id), "{id}");
    }
    // Checked: the compounding columns, "-" where a point has none.
    let mut sweep = s.sweep.clone().expect("a sweep");
    sweep.rows[0].compounding = Some(crate::analysis::sweep::SweepCompounding {
        measured: 0.1,
        ci_lo: 0.08,
        ci_hi: 0.12,
        model: 0.1,
        declared_model: 0.1,
        verdict: crate::analysis::Verdict::Pass,
    });
    let html = sweep_section(&sweep);
    assert!(
        html.contains("<th>p99.9</th><th>slow measured</th>"),
        "{html}"
    );
    assert!(html.contains("<td class=\"pass\">pass</td></tr>"), "{html}");
    assert!(html.contains("<td>-</td><td>-</td><td>-</td><td>-</td><td>-</td></tr>"));
}

/// The stroke colour of series `name`'s line in `panel`.
fn stroke_of<'a>(panel: &'a str, name: &str) -> &'a str {
    let tag = &panel[panel
        .find(&format!("data-series=\"{name}\""))
        .expect("the series")..];
    let from = tag.find("stroke=\"").expect("a stroke") + "stroke=\"".len();
    &tag[from..from + tag[from..].find('"').expect("closed")]
}

#[test]
fn log_buckets_cover_the_data_and_sum_to_all() {
    let mut h = crate::analysis::stats::new_histogram();
    for us in [100, 120, 1_000, 20_000] {
        crate::analysis::stats::record_us(&mut h, us);
    }
    let buckets = log_buckets(&h);
    let total: f64 = buckets.iter().map(|b| b.1).sum();
    assert!((total - 100.0).abs() < 1e-9, "{buckets:?}");
    assert!(buckets.first().is_some_and(|b| b.0 < 100.0 && b.1 == 0.0));
    assert!(buckets.last().is_some_and(|b| b.0 > 20_000.0 && b.1 == 0.0));
    assert!(log_buckets(&crate::analysis::stats::new_histogram()).is_empty());
}

/// Open loop at 100/s: request `i` is meant for `i * 10 ms` and ends
/// as `answer(i)` says, that long after.
fn every_10ms(n: u64, answer: impl Fn(u64) -> (u64, Outcome)) -> Vec<RequestRecord> {
    (0..n)
        .map(|i| {
            let (after_ms, outcome) = answer(i);
            crate::analysis::testing::at(i, i * 10, after_ms, outcome)
        })
        .collect()
}

/// `v` with its intervals rebuilt from `records`.
fn with(records: &[RequestRecord], mut v: VariantReport) -> VariantReport {
    let mut rebuild = crate::analysis::Rebuild::new(&v);
    for r in records {
        rebuild.record(r);
    }
    rebuild.finish(&mut v);
    v
}

/// The series of `records` with sending ended at `end` seconds.
fn series_of(records: &[RequestRecord], end: f64) -> IntervalSeries {
    let mut recorder = IntervalRecorder::default();
    for r in records {
        recorder.record(r);
    }
    recorder.finish(end)
}

/// The summary's variant, planned for `duration_s` (count-stopped when
/// `None`).
fn planned(duration_s: Option<f64>) -> VariantReport {
    let mut v = summary().variants.remove(0);
    v.load.duration_s = duration_s;
    v
}

fn series<'a>(chart: &'a LineChart<'_>, name: &str) -> &'a [(f64, f64)] {
    chart
        .series
        .iter()
        .find(|s| s.name == name)
        .map_or(&[], |s| s.points.as_slice())
}

#[test]
fn a_late_answer_after_the_phase_neither_widens_the_axis_nor_plots_a_collapse() {
    // 10 s at 100/s answered in 5 ms, but the last one comes at 10.3 s.
    let records = every_10ms(1000, |i| (if i == 999 { 310 } else { 5 }, Outcome::Ok));
    let variants = [with(&records, planned(Some(10.0)))];
    let all = throughputs(&variants);
    let chart = throughput_chart(&all, Vec::new());
    assert_eq!(chart.x_range, Some((0.0, 10.0)));
    let ok = series(&chart, "base ok");
    assert_eq!(ok.first().map(|p| p.0), Some(0.0));
    assert_eq!(ok.last().map(|p| p.0), Some(10.0));
    assert!(
        ok.iter().all(|&(x, rate)| x <= 10.0 && rate >= 95.0),
        "{ok:?}"
    );
    assert_eq!((all[0].1.late_ok, all[0].1.late_failed), (1, 0));
    let svg = svg::line_chart(&chart);
    assert!(
        svg.contains(">10</text>") && !svg.contains(">12</text>") && !svg.contains(">15</text>"),
        "{svg}"
    );
    let html = throughput_section(&variants);
    assert!(html.contains("(base: 1 ok, 0 failed)"), "{html}");
}

#[test]
fn a_real_collapse_still_plots_as_zero() {
    // Sends go on for 10 s, but from 7 s on nothing answers: those
    // requests time out 2 s later.
    let records = every_10ms(1000, |i| {
        if i < 700 {
            (5, Outcome::Ok)
        } else {
            (2_000, Outcome::Timeout)
        }
    });
    let variants = [with(&records, planned(Some(10.0)))];
    let all = throughputs(&variants);
    let chart = throughput_chart(&all, Vec::new());
    assert_eq!(chart.x_range, Some((0.0, 10.0)));
    let ok = series(&chart, "base ok");
    // Two points per bucket: the last three buckets are the collapse.
    assert_eq!(ok.len(), 20, "{ok:?}");
    let (before, after) = ok.split_at(14);
    assert!(before.iter().all(|p| p.1 >= 95.0), "{ok:?}");
    assert!(after.iter().all(|p| p.1 == 0.0), "{ok:?}");
    assert_eq!((after[0].0, after[5].0), (7.0, 10.0));
    // The timeouts of sends from 7 s to 8 s land in the last bucket.
    assert_eq!(series(&chart, "base failed").last(), Some(&(10.0, 100.0)));
    assert_eq!((all[0].1.late_ok, all[0].1.late_failed), (0, 200));
}

#[test]
fn a_partial_last_bucket_is_a_rate_over_the_time_it_covers() {
    assert_eq!(bucket_edges(2.6), vec![(0.0, 1.0), (1.0, 2.0), (2.0, 2.6)]);
    // A sliver joins the bucket before it.
    assert_eq!(bucket_edges(2.2), vec![(0.0, 1.0), (1.0, 2.2)]);
    assert_eq!(bucket_edges(0.3), vec![(0.0, 0.3)]);
    assert!(bucket_edges(0.0).is_empty() && bucket_edges(f64::NAN).is_empty());
    // A day-long run gets fewer, wider buckets.
    assert_eq!(bucket_edges(86_400.0).len(), 600);
    for end in [10.6f64, 10.2] {
        let records = every_10ms((end * 100.0).round() as u64, |_| (1, Outcome::Ok));
        let t = throughput(&series_of(&records, end));
        let last = t.buckets.last().copied();
        assert!(
            last.is_some_and(|b| b.end == end && (b.ok - 100.0).abs() < 1e-6),
            "{end}: {last:?}"
        );
    }
}

#[test]
fn the_sending_window_is_the_plan_or_where_sending_stopped() {
    // The last of 300 sends every 10 ms.
    let last_send = 2.99;
    let end = |v: &VariantReport| sending_end(Some(&Window::of(v)), last_send);
    assert_eq!(end(&planned(Some(10.0))), 10.0);
    // Interrupted: the plan no longer holds.
    let mut v = planned(Some(10.0));
    v.interrupted = true;
    v.measured_s = 3.0;
    assert_eq!(end(&v), 3.0);
    // Stopped by count, open loop: the next intended send.
    let mut v = planned(None);
    v.measured_s = 3.0;
    assert_eq!(end(&v), 3.0);
    // Closed loop: its measured phase runs to the last answer (3.49 s);
    // sending stopped at the last send.
    v.load.mode = "closed".into();
    v.measured_s = 3.49;
    assert_eq!(end(&v), 2.99);
    assert_eq!(sending_end(None, last_send), 2.99);
}

/// The summary's variant (20 s) with b slow from 5 s to 10 s on both
/// replicas and c's replica 1 losing packets over the same span, in
/// three phases; the tail not back by the end.
fn windowed() -> crate::analysis::Summary {
    use crate::analysis::{Recovery, RecoveryOutcome};
    use crate::output::phases::tests::{phase, window};
    let mut s = summary();
    let v = &mut s.variants[0];
    v.measured_s = 20.0;
    v.fault_windows = vec![
        window("b", 0, "slow", 5.0, Some(10.0)),
        window("b", 1, "slow", 5.0, Some(10.0)),
        window("c", 1, "net", 5.0, Some(10.0)),
    ];
    let mut during = phase("during", (5.0, 10.0), 2000, 90);
    during.faults = vec!["slow b".into(), "net c/1".into()];
    let mut after = phase("after", (10.0, 20.0), 4000, 60);
    after.recovery = Some(Recovery {
        after: vec!["slow b".into(), "net c/1".into()],
        baseline: Some("before".into()),
        baseline_p99_us: Some(12_000),
        band: 1.25,
        min_requests: 200,
        outcome: RecoveryOutcome::Recovered {
            recovery_s: 2.0,
            p99_us: 14_000,
        },
    });
    v.phases = vec![phase("before", (0.0, 5.0), 2000, 12), during, after];
    s
}

#[test]
fn endpoint_changes_are_marked_once_and_tabled_with_the_kills() {
    use crate::analysis::{CallerEndpoints, EndpointEvent};
    let mut s = summary();
    assert!(!render_report(&s).contains("<h2>Endpoints</h2>"));
    let event = |at_s: f64, kind: &str| EndpointEvent {
        at_s,
        replica: 1,
        kind: kind.into(),
        reason: "connection ended".into(),
    };
    let caller = |name: &str, shift: f64| CallerEndpoints {
        caller: name.into(),
        hop: "b".into(),
        replicas: vec![Default::default(), Default::default()],
        events: vec![
            event(1.0 + shift, "transient_failure"),
            event(2.0 + shift, "ready"),
        ],
        dropped: 0,
    };
    let v = &mut s.variants[0];
    // Two callers see each change 10 ms apart: one mark each.
    v.endpoints = vec![caller("a/0", 0.0), caller("a/1", 0.01)];
    v.kills = vec![crate::analysis::testing::kill_of_b1(&[("a/0", 0)])];
    let marks = endpoint_marks(&s.variants[0]);
    let labels: Vec<(&str, f64)> = marks.iter().map(|m| (m.label.as_str(), m.from)).collect();
    assert_eq!(labels, [("b/1 TRANSIENT_FAILURE", 1.0), ("b/1 READY", 2.0)]);
    assert!(marks.iter().all(|m| m.kind == BandKind::Mark));
    let html = render_report(&s);
    let at = html
        .find("id=\"latency-over-time-base\"")
        .expect("the chart");
    let chart = &html[at..at + html[at..].find("</svg>").expect("closed")];
    assert!(
        chart.contains("<title>b/1 TRANSIENT_FAILURE</title>"),
        "{chart}"
    );
    assert!(html.contains("<table id=\"kills\">"));
    assert!(html.contains("<td>b/1</td><td>1.00 s (planned 1.00 s)</td>"));
    let table = &html[html.find("<table id=\"endpoints\">").expect("the table")..];
    assert_eq!(
        table[..table.find("</table>").expect("closed")]
            .matches("<tr><td>base</td>")
            .count(),
        4
    );
    assert!(table.contains("transient_failure 1.00 s (connection ended)"));
}

/// A ramp of 200/s, 400/s, 800/s, 5 s each, the knee at 800/s.
fn stepped() -> crate::analysis::Summary {
    use crate::output::phases::tests::phase;
    let mut s = summary();
    let v = &mut s.variants[0];
    v.measured_s = 15.0;
    v.phases = [(200.0, 10), (400.0, 11), (800.0, 45)]
        .iter()
        .enumerate()
        .map(|(i, &(rate, p99))| {
            let from = i as f64 * 5.0;
            let mut p = phase(&format!("step {}", i + 1), (from, from + 5.0), 100, p99);
            p.offered_rate = Some(rate);
            p.ok_rate = rate.min(500.0);
            p
        })
        .collect();
    v.knee = Some(crate::analysis::Knee {
        step: "step 3".into(),
        rate: 800.0,
        reason: "p99 45ms is 4.1 times step 2's 11ms".into(),
    });
    s
}

/// The `<svg>` with `id` in `html`.
fn chart<'a>(html: &'a str, id: &str) -> &'a str {
    let at = html
        .find(&format!("<svg id=\"{id}\""))
        .unwrap_or_else(|| panic!("no chart {id}"));
    &html[at..at + html[at..].find("</svg>").expect("closed")]
}

/// Text with its tags taken out.
fn text_of(html: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out
}

/// The cells of `<table id="{id}">`, row by row, as text.
fn table_rows(html: &str, id: &str) -> Vec<Vec<String>> {
    let at = html
        .find(&format!("<table id=\"{id}\">"))
        .unwrap_or_else(|| panic!("no table {id}"));
    let table = &html[at..at + html[at..].find("</table>").expect("closed")];
    table
        .split("<tr>")
        .skip(1)
        .map(|row| {
            row.split("</t")
                .filter_map(|cell| cell.rsplit_once("<t").map(|(_, c)| c))
                .filter_map(|cell| cell.split_once('>').map(|(_, c)| text_of(c)))
                .collect()
        })
        .collect()
}

/// The (label, from px, width px) of each band rect of `svg`.
fn bands_in(svg: &str) -> Vec<(String, f64, f64)> {
    svg.split("<rect class=\"band\"")
        .skip(1)
        .map(|tag| {
            let num = |n: &str| {
                let key = format!(" {n}=\"");
                let from = tag.find(&key).expect("attribute") + key.len();
                tag[from..from + tag[from..].find('"').expect("closed")]
                    .parse::<f64>()
                    .expect("a number")
            };
            let label = tag
                .split_once("<title>")
                .and_then(|(_, t)| t.split_once("</title>"))
                .map_or(String::new(), |(t, _)| t.to_owned());
            (label, num("x"), num("width"))
        })
        .collect()
}

#[test]
fn fault_windows_band_latency_and_throughput_over_time() {
    let html = render_report(&windowed());
    for id in ["latency-over-time-base", "throughput"] {
        let svg = chart(&html, id);
        let bands = bands_in(svg);
        assert_eq!(bands.len(), 1, "{id}: {svg}");
        // One window over 5..10 s: both faults, one band.
        assert_eq!(bands[0].0, "slow b, net c/1", "{id}");
        assert!(
            svg.contains(">slow b, net c/1</text>"),
            "{id} labels it: {svg}"
        );
    }
    // On the latency chart's 0..20 s axis (the intervals span it).
    let v = &windowed().variants[0];
    let chart = latency_over_time_chart(v, "c", bands_of(v));
    assert_eq!(chart.bands.len(), 1);
    assert_eq!((chart.bands[0].from, chart.bands[0].to), (5.0, 10.0));
    assert_eq!(chart.bands[0].kind, BandKind::Window);
}

#[test]
fn each_phased_variant_gets_a_table_with_recovery_and_compounding() {
    let s = windowed();
    let html = render_report(&s);
    let rows = table_rows(&html, "phases-base");
    assert_eq!(rows.len(), 4, "{rows:?}");
    assert_eq!(rows[0][0], "phase");
    assert_eq!(rows[0].last().map(String::as_str), Some("compounding"));
    assert_eq!(
        rows[2][..10],
        [
            "during",
            "5-10",
            "slow b, net c/1",
            "2000",
            "400",
            "2.00 ms",
            "90.0 ms",
            "180 ms",
            "0",
            "-"
        ]
    );
    assert_eq!(rows[3][9], "2.00 s");
    assert!(
        html.contains(
            "<td title=\"p99 within 1.25 x before&#39;s 12.0 ms, over 200 ok requests\">2.00 s</td>"
        ),
        "the rule as the tooltip: {html}"
    );
    // The hand-made phases have no check: a dash, not a verdict.
    assert_eq!(rows[1][10], "-");
    let mut s = s;
    s.variants[0].phases[1].compounding = s.variants[0].compounding.clone();
    let c = s.variants[0].compounding.clone().expect("checked");
    let rows = table_rows(&render_report(&s), "phases-base");
    assert_eq!(
        rows[2][10],
        format!(
            "{} vs {}: {}",
            tailmesh_units::percent(c.measured),
            tailmesh_units::percent(c.model),
            c.verdict.as_str()
        )
    );
    // No check asked for: no column.
    s.variants[0].compounding = None;
    let rows = table_rows(&render_report(&s), "phases-base");
    assert_eq!(rows[0].len(), 10, "{rows:?}");
}

#[test]
fn a_ramp_is_drawn_against_offered_load_with_its_knee() {
    let s = stepped();
    let html = render_report(&s);
    // The steps tint the time charts, labelled with their rates.
    let over_time = chart(&html, "latency-over-time-base");
    let labels: Vec<String> = bands_in(over_time).into_iter().map(|b| b.0).collect();
    assert_eq!(labels, ["200/s", "400/s", "800/s"], "{over_time}");
    assert!(
        html.contains(
            "<p id=\"knee-base\">knee: step 3 (800/s): p99 45ms is 4.1 times step 2&#39;s 11ms</p>"
        ),
        "{html}"
    );
    let rows = table_rows(&html, "phases-base");
    let load: Vec<&str> = rows.iter().skip(1).map(|r| r[2].as_str()).collect();
    assert_eq!(load, ["200/s", "400/s", "800/s"]);
    for id in ["steps-latency-base", "steps-goodput-base"] {
        let svg = chart(&html, id);
        assert_eq!(svg.matches("class=\"band-mark\"").count(), 1, "{id}");
        assert!(svg.contains(">knee: step 3</text>"), "{id}: {svg}");
    }
    let v = &s.variants[0];
    let (latency, goodput) = step_charts(v, "l", "g");
    assert_eq!(
        series(&latency, "p99"),
        [(200.0, 10_000.0), (400.0, 11_000.0), (800.0, 45_000.0)]
    );
    assert_eq!(series(&latency, "p50").len(), 3);
    assert_eq!(
        series(&goodput, "goodput"),
        [(200.0, 200.0), (400.0, 400.0), (800.0, 500.0)]
    );
    assert_eq!(
        series(&goodput, "offered"),
        [(200.0, 200.0), (400.0, 400.0), (800.0, 800.0)]
    );
    assert_eq!(latency.bands[0].from, 800.0);
    assert_eq!(latency.bands[0].kind, BandKind::Mark);
    // Without a knee: nothing marked.
    let mut s = s;
    s.variants[0].knee = None;
    let html = render_report(&s);
    assert!(!html.contains("band-mark") && !html.contains("knee-base"));
}

#[test]
fn variants_with_different_schedules_name_theirs_on_the_shared_chart() {
    let mut s = windowed();
    let mut other = s.variants[0].clone();
    other.name = "pull".into();
    // The same windows: the bands as they are.
    s.variants.push(other.clone());
    let same = shared_bands(&s.variants);
    assert_eq!(same, bands_of(&s.variants[0]));
    // Pull's window later: its phases say so.
    for w in &mut other.fault_windows {
        w.start_s = 8.0;
    }
    other.phases[0].end_s = 8.0;
    other.phases[1].start_s = 8.0;
    s.variants[1] = other;
    let labels: Vec<String> = shared_bands(&s.variants)
        .into_iter()
        .map(|b| b.label)
        .collect();
    assert_eq!(labels, ["base: slow b, net c/1", "pull: slow b, net c/1"]);
    let html = render_report(&s);
    assert!(html.contains("id=\"phases-pull\""), "a table each");
}

#[test]
fn without_phases_the_page_has_no_phase_section_and_no_bands() {
    let html = render_report(&summary());
    for absent in [
        "<h2>Phases",
        "id=\"phases-",
        "class=\"band",
        "steps-latency",
        "band-label",
        "Shaded: fault windows",
    ] {
        assert!(!html.contains(absent), "{absent} in {html}");
    }
    // Beside a variant with phases, one without keeps its chart bare
    // and gets no table.
    let mut s = windowed();
    let mut plain = summary().variants.remove(0);
    plain.name = "pull".into();
    s.variants.push(plain);
    let html = render_report(&s);
    assert_eq!(bands_in(chart(&html, "latency-over-time-base")).len(), 1);
    assert!(bands_in(chart(&html, "latency-over-time-pull")).is_empty());
    assert!(html.contains("id=\"phases-base\"") && !html.contains("id=\"phases-pull\""));
    assert_eq!(html.matches("<h3>").count(), 1, "{html}");
}

#[test]
fn spectrum_ticks_read_as_percentiles() {
    assert_eq!(spectrum_tick(10.0), "90%");
    assert_eq!(spectrum_tick(1000.0), "99.9%");
    assert_eq!(spectrum_tick(1.0), "0%");
}
