//! The page's plain tables: latency per variant, the compounding check,
//! errors and timeouts, the broker's statistics, and what tracing cost.

use std::fmt::Write;

use tailmesh_units::{micros, percent};

use crate::analysis::VariantReport;
use crate::output::svg::escape;

/// What tracing cost in each variant that says, one line each.
pub(super) fn observer_section(variants: &[VariantReport]) -> String {
    line_section(
        variants,
        "observer",
        "<h2>What tracing cost</h2><p class=\"note\">The observer's own CPU while the load ran: \
         the hops recording and exporting spans, and the orchestrator receiving, spooling and \
         sampling them and making its own (summary.json's <code>observer</code>, per part).</p>",
        |v| v.observer.as_ref().map(|o| o.line()),
    )
}

/// What became of each variant's streams (`[load.streams]`), one line
/// each, as the terminal says it.
pub(super) fn streams_section(variants: &[VariantReport]) -> String {
    line_section(
        variants,
        "streams",
        "<h2>Streams</h2><p class=\"note\">Each message of the load's streams is one of the \
         requests above; requests.csv's <code>stream</code> column says which message of which \
         stream a row is (summary.json's <code>streams</code>; docs/streams.md).</p>",
        |v| v.streams.as_ref().map(crate::output::table::streams_line),
    )
}

/// A table `id` of one line per variant that has one (`line`), under
/// `head`; nothing when none has.
fn line_section(
    variants: &[VariantReport],
    id: &str,
    head: &str,
    line: impl Fn(&VariantReport) -> Option<String>,
) -> String {
    let rows: Vec<String> = variants
        .iter()
        .filter_map(|v| {
            Some(format!(
                "<tr><td>{}</td><td>{}</td></tr>",
                escape(&v.name),
                escape(&line(v)?)
            ))
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    format!(
        "{head}<table id=\"{id}\"><tr><th>variant</th><th>{id}</th></tr>{}</table>",
        rows.concat()
    )
}

pub(super) fn latency_table(variants: &[VariantReport]) -> String {
    let mut out = String::from(
        "<h2>End to end</h2><table id=\"latency\"><tr><th>variant</th><th>sent</th><th>ok</th><th>errors</th><th>timeouts</th><th>rate</th><th>extra requests</th><th>p50</th><th>p90</th><th>p99</th><th>p99.9</th><th>p99.99</th><th>max</th></tr>",
    );
    for v in variants {
        let l = &v.latency;
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}/s</td><td>{}</td>",
            escape(&v.name),
            v.sent,
            v.ok,
            v.errors.values().sum::<u64>(),
            v.timeouts,
            v.achieved_rate,
            percent(v.extra_load)
        );
        for us in [
            l.p50_us,
            l.p90_us,
            l.p99_us,
            l.p99_9_us,
            l.p99_99_us,
            l.max_us,
        ] {
            let _ = write!(
                out,
                "<td>{}</td>",
                if l.count == 0 {
                    "-".into()
                } else {
                    micros(us as f64)
                }
            );
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    out
}

pub(super) fn compounding_table(variants: &[VariantReport]) -> String {
    let rows: Vec<_> = variants
        .iter()
        .filter_map(|v| v.compounding.as_ref().map(|c| (v, c)))
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "<h2>Tail compounding</h2><table id=\"compounding\"><tr><th>variant</th><th>slow / n</th><th>measured</th><th>95 % interval</th><th>model 1 - prod(1 - p_i)</th><th>declared</th><th>verdict</th></tr>",
    );
    for (v, c) in rows {
        let verdict = c.verdict.as_str();
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{} / {}</td><td>{}</td><td>[{}, {}]</td><td>{}</td><td>{}</td><td class=\"{verdict}\">{verdict}</td></tr>",
            escape(&v.name),
            c.slow,
            c.n,
            percent(c.measured),
            percent(c.ci_lo),
            percent(c.ci_hi),
            percent(c.model),
            percent(c.declared_model),
        );
    }
    out.push_str("</table>");
    out
}

pub(super) fn error_table(variants: &[VariantReport]) -> String {
    let mut out = String::from(
        "<table id=\"errors\"><tr><th>variant</th><th>sent</th><th>timeouts</th><th>errors by code</th><th>accounted</th><th>incidents</th></tr>",
    );
    for v in variants {
        let errors: Vec<String> = v
            .errors
            .iter()
            .map(|(k, n)| format!("{} {n}", escape(k)))
            .collect();
        let incidents: Vec<String> = v.incidents.iter().map(|i| escape(i)).collect();
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td></tr>",
            escape(&v.name),
            v.sent,
            v.timeouts,
            if errors.is_empty() {
                "none".into()
            } else {
                errors.join(", ")
            },
            if v.accounted { "pass" } else { "fail" },
            if v.accounted { "yes" } else { "no" },
            incidents.join("<br>"),
        );
    }
    out.push_str("</table>");
    out
}

pub(super) fn broker_table(variants: &[VariantReport]) -> String {
    if variants.iter().all(|v| v.broker.is_empty()) {
        return String::new();
    }
    let mut out = String::from(
        "<h2>Broker</h2><table id=\"broker\"><tr><th>variant / topic</th><th>enqueued</th><th>completed</th><th>expired</th><th>redelivered</th><th>rejected full</th><th>max depth</th><th>queue wait p50</th><th>p99</th><th>max</th></tr>",
    );
    for v in variants {
        for t in &v.broker {
            let _ = write!(
                out,
                "<tr><td>{} / {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&v.name),
                escape(&t.topic),
                t.enqueued,
                t.completed,
                t.expired + t.expired_in_flight,
                t.redelivered,
                t.rejected_full,
                t.max_depth,
                micros(t.queue_wait_p50_ns as f64 / 1e3),
                micros(t.queue_wait_p99_ns as f64 / 1e3),
                micros(t.queue_wait_max_ns as f64 / 1e3),
            );
        }
    }
    out.push_str("</table>");
    out
}
