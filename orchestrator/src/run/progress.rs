//! What a run shows while it runs: one line describing each variant's load,
//! and its progress: on a terminal, a progress bar for variants longer
//! than two seconds; elsewhere, a line every 10 s (the load generator's
//! `Progress` paces both).

use std::{io::IsTerminal, time::Duration};

use indicatif::{ProgressBar, ProgressStyle};

use crate::{
    loadgen::{Progress, View},
    scenario::{LoadMode, Stop, Variant},
};

pub(crate) use crate::scenario::describe_load;

/// Where `variant`'s progress goes: the bar on a terminal (none for a
/// short variant), lines on any other standard error.
pub(super) fn view(variant: &Variant) -> Option<Progress> {
    let view = if std::io::stderr().is_terminal() {
        View::Bar(progress_bar(variant)?)
    } else {
        View::Lines {
            variant: variant.name.clone(),
        }
    };
    Some(Progress::new(view, variant.load.stop))
}

fn progress_bar(variant: &Variant) -> Option<ProgressBar> {
    let load = &variant.load;
    let (len, unit) = match (load.stop, &load.mode) {
        (Stop::Duration(d), _) => (u64::try_from(d.as_millis()).unwrap_or(u64::MAX), "ms"),
        (Stop::Requests(n), _) => (n, "requests"),
    };
    let expected = match (load.stop, &load.mode) {
        (Stop::Duration(d), _) => d,
        (Stop::Requests(n), LoadMode::Open { rate, .. }) => {
            Duration::from_secs_f64(n as f64 / rate)
        }
        // Closed loop with a request count: the length is unknown up front.
        (Stop::Requests(_), LoadMode::Closed { .. }) => Duration::from_secs(3),
    } + load.warmup;
    if expected <= Duration::from_secs(2) {
        return None;
    }
    let bar = ProgressBar::new(len);
    let template = format!("{{prefix}} [{{bar:40}}] {{pos}}/{{len}} {unit} ({{elapsed}}) {{msg}}");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(variant.name.clone());
    Some(bar)
}
