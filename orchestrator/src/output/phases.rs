//! A variant's phases as text, the same in the terminal and in
//! report.html (cells of the per-phase table, the knee's line), and the
//! bands that mark fault windows and load steps on the time charts.

use crate::analysis::{Knee, PhaseReport, Recovery, RecoveryOutcome, VariantReport};

use super::svg::{Band, BandKind};
use tailmesh_units::{micros, percent};

/// The per-phase table's columns, in order (the report adds the
/// compounding check).
pub(crate) const COLUMNS: [&str; 10] = [
    "phase",
    "from-to",
    "faults / load",
    "sent",
    "rate/s",
    "p50",
    "p99",
    "p99.9",
    "errors",
    "recovery",
];

/// The cells of `p`'s row, one per [`COLUMNS`] entry (percentiles `-`
/// without ok requests).
pub(crate) fn cells(p: &PhaseReport) -> [String; 10] {
    let l = &p.latency;
    let us = |v: u64| {
        if l.count == 0 {
            "-".to_owned()
        } else {
            micros(v as f64)
        }
    };
    [
        p.name.clone(),
        format!("{}-{}", seconds(p.start_s), seconds(p.end_s)),
        conditions(p),
        p.sent.to_string(),
        if p.rate < 10.0 {
            format!("{:.1}", p.rate)
        } else {
            format!("{:.0}", p.rate)
        },
        us(l.p50_us),
        us(l.p99_us),
        us(l.p99_9_us),
        errors(p),
        p.recovery.as_ref().map_or_else(|| "-".to_owned(), recovery),
    ]
}

/// Seconds to a tenth, without a `.0`: `5`, `12.5`.
fn seconds(s: f64) -> String {
    let text = format!("{s:.1}");
    match text.strip_suffix(".0") {
        Some(whole) => whole.to_owned(),
        None => text,
    }
}

/// The faults in force and a step's offered rate: `400/s, slow b`;
/// `-` when neither.
fn conditions(p: &PhaseReport) -> String {
    let parts: Vec<String> = p
        .offered_rate
        .map(per_second)
        .into_iter()
        .chain(p.faults.iter().cloned())
        .collect();
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join(", ")
    }
}

/// Errors and timeouts as a share of the sent: `1.20 %`; `0` without
/// any (a share too small to round, `0.04 %`, still says there were some).
fn errors(p: &PhaseReport) -> String {
    if p.errors + p.timeouts == 0 {
        "0".to_owned()
    } else {
        percent(p.error_share)
    }
}

/// `1.00 s`, `not recovered (p99 140 ms)`, `not enough data: ...`.
pub(crate) fn recovery(r: &Recovery) -> String {
    match &r.outcome {
        RecoveryOutcome::Recovered { recovery_s, .. } => micros(recovery_s * 1e6),
        RecoveryOutcome::NotRecovered { last_p99_us } => {
            format!("not recovered (p99 {})", micros(*last_p99_us as f64))
        }
        RecoveryOutcome::NotEnoughData { reason } => format!("not enough data: {reason}"),
    }
}

/// What the recovery was held against: `p99 within 1.25 x before's
/// 12.0 ms, over 200 ok requests`.
pub(crate) fn recovery_rule(r: &Recovery) -> String {
    let baseline = match (&r.baseline, r.baseline_p99_us) {
        (Some(name), Some(us)) => format!("{name}'s {}", micros(us as f64)),
        (Some(name), None) => format!("{name}'s"),
        _ => "the p99 before the window".to_owned(),
    };
    format!(
        "p99 within {} x {baseline}, over {} ok requests",
        r.band, r.min_requests
    )
}

/// `knee: step 4 (800/s): p99 40ms is 4.0 times step 3's 10ms`.
pub(crate) fn knee_line(k: &Knee) -> String {
    format!("knee: {} ({}): {}", k.step, per_second(k.rate), k.reason)
}

/// A rate as `200/s`, `12.5/s`.
pub(crate) fn per_second(rate: f64) -> String {
    if rate.fract() == 0.0 {
        format!("{rate:.0}/s")
    } else {
        format!("{rate:.1}/s")
    }
}

/// One band per fault window of `v`, read from its phases (which name
/// the faults: `slow b`, `net b/1`, `net b` for a hop-wide one): a
/// fault's band runs over the consecutive phases it is in force in;
/// faults over the same span share a band and its label.
pub(crate) fn fault_bands(v: &VariantReport) -> Vec<Band> {
    // Each fault's run of phases: (label, from, to).
    let mut runs: Vec<(&str, f64, f64)> = Vec::new();
    for p in &v.phases {
        for fault in &p.faults {
            match runs
                .iter_mut()
                .find(|r| r.0 == fault.as_str() && r.2 == p.start_s)
            {
                Some(run) => run.2 = p.end_s,
                None => runs.push((fault, p.start_s, p.end_s)),
            }
        }
    }
    let mut bands: Vec<Band> = Vec::new();
    for (label, from, to) in runs {
        match bands.iter_mut().find(|b| b.from == from && b.to == to) {
            Some(b) => {
                b.label.push_str(", ");
                b.label.push_str(label);
            }
            None => bands.push(Band {
                from,
                to,
                label: label.to_owned(),
                kind: BandKind::Window,
            }),
        }
    }
    bands.sort_by(|a, b| a.from.total_cmp(&b.from).then(a.to.total_cmp(&b.to)));
    bands
}

/// One band per load step of `v`, labelled with its offered rate (a step
/// cut by a fault window into several phases is one band).
pub(crate) fn step_bands(v: &VariantReport) -> Vec<Band> {
    let mut bands: Vec<Band> = Vec::new();
    for p in &v.phases {
        let Some(rate) = p.offered_rate else { continue };
        let label = per_second(rate);
        match bands.last_mut() {
            Some(b) if b.label == label && b.to == p.start_s => b.to = p.end_s,
            _ => bands.push(Band {
                from: p.start_s,
                to: p.end_s,
                label,
                kind: BandKind::Step,
            }),
        }
    }
    bands
}

/// Whether `v` ran load steps.
pub(crate) fn stepped(v: &VariantReport) -> bool {
    v.phases.iter().any(|p| p.offered_rate.is_some())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::analysis::Percentiles;
    use tailmesh_netfault::WindowRecord;

    /// A phase from `start_s` to `end_s` with `sent` requests, all ok,
    /// a p50 of 2 ms, a p99 of `p99_ms` and a p99.9 twice that.
    pub(crate) fn phase(
        name: &str,
        (start_s, end_s): (f64, f64),
        sent: u64,
        p99_ms: u64,
    ) -> PhaseReport {
        let secs = end_s - start_s;
        PhaseReport {
            name: name.into(),
            start_s,
            end_s,
            sent,
            ok: sent,
            rate: sent as f64 / secs,
            ok_rate: sent as f64 / secs,
            latency: Percentiles {
                count: sent,
                p50_us: 2_000,
                p99_us: p99_ms * 1000,
                p99_9_us: p99_ms * 2000,
                ..Percentiles::default()
            },
            ..PhaseReport::default()
        }
    }

    pub(crate) fn window(
        hop: &str,
        replica: u32,
        kind: &str,
        start_s: f64,
        end_s: Option<f64>,
    ) -> WindowRecord {
        WindowRecord {
            hop: hop.into(),
            replica,
            generator: None,
            kind: kind.into(),
            start_s,
            end_s,
            applied_at_s: Some(start_s + 0.002),
            cleared_at_s: None,
        }
    }

    fn recovery_of(outcome: RecoveryOutcome) -> Recovery {
        Recovery {
            after: vec!["slow b".into()],
            baseline: Some("before".into()),
            baseline_p99_us: Some(12_000),
            band: 1.25,
            min_requests: 200,
            outcome,
        }
    }

    #[test]
    fn recoveries_read_as_a_time_or_why_not() {
        let r = |o| recovery(&recovery_of(o));
        assert_eq!(
            r(RecoveryOutcome::Recovered {
                recovery_s: 1.04,
                p99_us: 11_000
            }),
            "1.04 s"
        );
        assert_eq!(
            r(RecoveryOutcome::NotRecovered {
                last_p99_us: 140_000
            }),
            "not recovered (p99 140 ms)"
        );
        assert_eq!(
            r(RecoveryOutcome::NotEnoughData {
                reason: "150 ok requests in before, fewer than 200".into()
            }),
            "not enough data: 150 ok requests in before, fewer than 200"
        );
        assert_eq!(
            recovery_rule(&recovery_of(RecoveryOutcome::NotRecovered {
                last_p99_us: 1
            })),
            "p99 within 1.25 x before's 12.0 ms, over 200 ok requests"
        );
    }

    #[test]
    fn a_row_has_the_faults_or_the_step_and_the_errors_share() {
        let mut p = phase("step 2, during", (10.0, 15.0), 1000, 40);
        p.offered_rate = Some(200.0);
        p.faults = vec!["slow b".into(), "net c/1".into()];
        p.errors = 10;
        p.timeouts = 2;
        p.error_share = 0.012;
        let row = cells(&p);
        assert_eq!(
            row,
            [
                "step 2, during",
                "10-15",
                "200/s, slow b, net c/1",
                "1000",
                "200",
                "2.00 ms",
                "40.0 ms",
                "80.0 ms",
                "1.20 %",
                "-",
            ]
        );
        let mut empty = phase("before", (0.0, 2.5), 0, 0);
        empty.latency = Percentiles::default();
        empty.rate = 2.0 / 3.0;
        let row = cells(&empty);
        assert_eq!(
            [&row[1], &row[2], &row[4], &row[6], &row[8]],
            ["0-2.5", "-", "0.7", "-", "0"]
        );
        p.errors = 0;
        p.timeouts = 1;
        p.error_share = 1.0 / 10_000.0;
        // A share too small for one decimal still reads as some.
        assert_eq!(cells(&p)[8], "0.01 %");
    }

    #[test]
    fn windows_over_one_span_share_a_band_and_each_runs_over_its_phases() {
        let mut v = crate::analysis::testing::summary().variants.remove(0);
        let b = v.hops[1].hop.clone();
        let c = v.hops[2].hop.clone();
        let with = |name: &str, span, faults: &[String]| {
            let mut p = phase(name, span, 100, 10);
            p.faults = faults.to_vec();
            p
        };
        let (slow_b, net_b1) = (format!("slow {b}"), format!("net {b}/1"));
        let (net_c, replica_b2) = (format!("net {c}"), format!("replica_slow {b}/2"));
        v.phases = vec![
            with("before", (0.0, 2.0), &[]),
            with("during 1", (2.0, 4.0), std::slice::from_ref(&replica_b2)),
            with("after 1", (4.0, 5.0), &[]),
            // Two faults over the same span: one band.
            with("during 2", (5.0, 10.0), &[slow_b.clone(), net_b1.clone()]),
            with("after 2", (10.0, 12.0), &[]),
            // One fault over two phases (split by nothing else here): one band.
            with("during 3", (12.0, 15.0), std::slice::from_ref(&net_c)),
            with("during 4", (15.0, 20.0), std::slice::from_ref(&net_c)),
        ];
        let bands = fault_bands(&v);
        let got: Vec<(f64, f64, &str)> = bands
            .iter()
            .map(|b| (b.from, b.to, b.label.as_str()))
            .collect();
        let (slow, net) = (format!("{slow_b}, {net_b1}"), net_c.clone());
        let replica = replica_b2.clone();
        assert_eq!(
            got,
            [
                (2.0, 4.0, replica.as_str()),
                (5.0, 10.0, slow.as_str()),
                (12.0, 20.0, net.as_str())
            ]
        );
        assert!(bands.iter().all(|b| b.kind == BandKind::Window));
    }

    #[test]
    fn a_step_cut_by_a_window_is_one_band() {
        let mut v = crate::analysis::testing::summary().variants.remove(0);
        let step = |name: &str, span, rate| {
            let mut p = phase(name, span, 100, 10);
            p.offered_rate = Some(rate);
            p
        };
        v.phases = vec![
            step("step 1, before", (0.0, 5.0), 200.0),
            step("step 2, before", (5.0, 7.0), 400.0),
            step("step 2, during", (7.0, 10.0), 400.0),
            step("step 3, after", (10.0, 15.0), 800.5),
        ];
        assert!(stepped(&v));
        let got: Vec<(f64, f64, String)> = step_bands(&v)
            .into_iter()
            .map(|b| (b.from, b.to, b.label))
            .collect();
        assert_eq!(
            got,
            [
                (0.0, 5.0, "200/s".to_owned()),
                (5.0, 10.0, "400/s".to_owned()),
                (10.0, 15.0, "800.5/s".to_owned())
            ]
        );
        v.phases.iter_mut().for_each(|p| p.offered_rate = None);
        assert!(!stepped(&v) && step_bands(&v).is_empty());
    }

    #[test]
    fn the_knee_line_names_the_step_and_its_rate() {
        let k = Knee {
            step: "step 4".into(),
            rate: 800.0,
            reason: "p99 40ms is 4.0 times step 3's 10ms".into(),
        };
        assert_eq!(
            knee_line(&k),
            "knee: step 4 (800/s): p99 40ms is 4.0 times step 3's 10ms"
        );
    }
}
