//! Where the time goes, hop by hop: stacked bars of service, queue wait
//! and the rest, and the per-hop table.

use std::fmt::Write;

use tailmesh_units::{micros, percent};

use crate::analysis::VariantReport;
use crate::output::svg::{StackedBars, escape};

pub(super) fn hop_bars(variants: &[VariantReport]) -> StackedBars<'static> {
    let multi = variants.len() > 1;
    let bars = variants
        .iter()
        .flat_map(|v| {
            v.hops.iter().map(move |h| {
                let service = h.service.mean_us;
                let queue = h.queue_wait.mean_us;
                let rest = (h.total.mean_us - service - queue).max(0.0);
                let label = if multi {
                    format!("{} / {}", v.name, h.hop)
                } else {
                    h.hop.clone()
                };
                (label, vec![service, queue, rest])
            })
        })
        .collect();
    StackedBars {
        id: "hops",
        title: "Mean time per request at each hop",
        x_label: "time per request",
        x_format: micros,
        segments: vec![
            "service".into(),
            "queue wait".into(),
            "downstream and network".into(),
        ],
        bars,
    }
}

pub(super) fn hop_table(variants: &[VariantReport]) -> String {
    let mut out = String::from(
        "<table id=\"hop-table\"><tr><th>variant / hop</th><th>transport</th><th>requests per replica</th><th>p_slow</th><th>service p50</th><th>service p99</th><th>queue wait p99</th><th>total p99</th></tr>",
    );
    for v in variants {
        for h in &v.hops {
            let split: Vec<String> = h.replica_requests.iter().map(u64::to_string).collect();
            // A hop whose work is a real gRPC service says which.
            let service = h.grpc_service.as_ref().map_or(String::new(), |s| {
                let layered = if s.layers {
                    ", in tailmesh's layers"
                } else {
                    ""
                };
                format!("<br><small>service {}{layered}</small>", escape(&s.method))
            });
            let _ = write!(
                out,
                "<tr><td>{} / {}{service}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&v.name),
                escape(&h.hop),
                escape(&h.transport),
                split.join(" / "),
                h.p_slow.map_or("-".into(), percent),
                micros(h.service.p50_us as f64),
                micros(h.service.p99_us as f64),
                micros(h.queue_wait.p99_us as f64),
                micros(h.total.p99_us as f64),
            );
        }
    }
    out.push_str("</table>");
    out
}
