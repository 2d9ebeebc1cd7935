//! `tailmesh search`: the highest open-loop rate at which each variant of
//! a scenario meets an objective, found by short runs (the library's
//! `search`); each step's run folder is kept, and the search is written
//! beside them as JSON.

#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::Args;
use tailmesh::experiment::{self, RunCommand};
use tailmesh::say;
use tailmesh::scenario::{self, LoadMode, Stop};
use tailmesh::search::{self, Answer, SearchPlan, StepKind, StepVerdict};
use tailmesh_units::duration;

use super::CliError;

/// `tailmesh search`.
#[derive(Args)]
pub(crate) struct SearchArgs {
    /// The scenario file (its variants must be open loops).
    scenario: PathBuf,
    /// The objective: terms joined by commas, such as
    /// `p99<50ms,errors<0.1%`; `hop.NAME.p99<10ms` for a hop's time.
    #[arg(long)]
    slo: String,
    /// How long each step's load lasts (after the scenario's warmup).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    step: Duration,
    /// A pause between steps, so that one step's queues are gone before
    /// the next.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2s")]
    cooldown: Duration,
    /// The first rate, requests per second [default: half the hops'
    /// declared capacity, or the scenario's rate when they declare none].
    #[arg(long)]
    start: Option<f64>,
    /// The times the answer is run again to confirm it.
    #[arg(long, default_value_t = 2)]
    repeats: usize,
    /// The most steps, confirmations aside.
    #[arg(long, default_value_t = 12)]
    max_steps: usize,
    /// Trace the steps as the scenario says (off by default: a search
    /// measures the mesh, not the tracing).
    #[arg(long)]
    traces: bool,
    /// Where the steps' run folders go: `DIR/<scenario>-search/`.
    #[arg(long, default_value = "results")]
    results: PathBuf,
}

/// Runs the search for each variant.
pub(crate) fn search(args: SearchArgs) -> Result<(), CliError> {
    let objectives = search::parse_slo(&args.slo).map_err(|e| CliError::BadInput(e.into()))?;
    let (scenario, source) = scenario::load(&args.scenario)?;
    if let Some(v) = scenario
        .variants
        .iter()
        .find(|v| !matches!(v.load.mode, LoadMode::Open { .. }))
    {
        return Err(CliError::BadInput(anyhow!(
            "{}: variant {:?} is a closed loop: a search sets an open loop's rate",
            args.scenario.display(),
            v.name
        )));
    }
    let folder = args.results.join(format!("{}-search", scenario.name));
    let plan = SearchPlan {
        repeats: args.repeats,
        max_steps: args.max_steps.max(1),
        ..SearchPlan::default()
    };
    let written = objectives
        .iter()
        .map(|o| o.describe())
        .collect::<Vec<_>>()
        .join(",");
    let mut searches = Vec::new();
    let mut charts = Vec::new();
    let mut failed = Vec::new();
    for variant in &scenario.variants {
        let LoadMode::Open { rate, .. } = variant.load.mode else {
            continue;
        };
        let capacity = search::declared_capacity(variant);
        let start = args
            .start
            .or(capacity.map(|c| c / 2.0))
            .unwrap_or(rate)
            .max(1.0);
        say!(
            "variant {}: searching for the highest rate that meets {written}, from {start:.0}/s \
             ({}), {} steps of {}",
            variant.name,
            match (args.start, capacity) {
                (Some(_), _) => "--start".to_owned(),
                (None, Some(c)) => format!("half the declared capacity, {c:.0}/s"),
                (None, None) => "the scenario's rate: no hop declares a capacity".to_owned(),
            },
            plan.max_steps,
            duration(args.step)
        );
        let mut n = 0;
        let outcome = search::search(start, plan, |kind, rate| {
            n += 1;
            if n > 1 {
                std::thread::sleep(args.cooldown);
            }
            let mut step = scenario.clone();
            step.name = format!("{}-search", scenario.name);
            let mut v = variant.clone();
            if let LoadMode::Open { rate: r, steps, .. } = &mut v.load.mode {
                *r = rate;
                steps.clear();
            }
            v.load.stop = Stop::Duration(args.step);
            step.variants = vec![v];
            let text = format!(
                "# tailmesh search, variant {}, step {n}: [load] rate = {rate}, duration = \
                 \"{}\", no steps (over the file below)\n{source}",
                variant.name,
                duration(args.step)
            );
            let mut finished = experiment::execute_scenario(
                &step,
                &text,
                &RunCommand::step(args.scenario.clone(), args.results.clone(), args.traces),
            )?;
            finished.write()?;
            if finished.interrupted {
                return Err(CliError::Interrupted);
            }
            let report = finished
                .summary
                .variants
                .first()
                .ok_or_else(|| CliError::Failed(anyhow!("step {n} measured no variant")))?;
            let verdict = search::judge(
                &objectives,
                rate,
                report,
                &finished.dir.display().to_string(),
            );
            say!("{}", describe_step(n, kind, &verdict));
            Ok(verdict)
        })?;
        say!(
            "variant {}: {}",
            variant.name,
            describe_answer(&outcome.answer, &written)
        );
        if matches!(outcome.answer, Answer::FirstStepFails { .. }) {
            failed.push(format!(
                "variant {}: the first step already fails {written}: start lower (--start)",
                variant.name
            ));
        }
        charts.push((variant.name.clone(), outcome.clone()));
        searches.push(serde_json::json!({
            "variant": variant.name,
            "slo": written,
            "step_s": args.step.as_secs_f64(),
            "steps": outcome.steps.iter().map(|(kind, v)| serde_json::json!({
                "kind": kind,
                "verdict": v,
            })).collect::<Vec<_>>(),
            "answer": outcome.answer,
        }));
    }
    std::fs::create_dir_all(&folder)
        .with_context(|| format!("create {}", folder.display()))
        .map_err(CliError::Failed)?;
    let page = folder.join("search.html");
    std::fs::write(&page, search_html(&scenario.name, &written, &charts))
        .with_context(|| format!("write {}", page.display()))
        .map_err(CliError::Failed)?;
    let file = folder.join("search.json");
    let json = serde_json::to_string_pretty(&serde_json::json!({ "searches": searches }))
        .map_err(|e| CliError::Failed(e.into()))?;
    std::fs::write(&file, json + "\n")
        .with_context(|| format!("write {}", file.display()))
        .map_err(CliError::Failed)?;
    say!(
        "search written to {} and {}",
        file.display(),
        page.display()
    );
    if failed.is_empty() {
        Ok(())
    } else {
        Err(CliError::SearchFailed { lines: failed })
    }
}

fn describe_step(n: usize, kind: StepKind, v: &StepVerdict) -> String {
    let kind = match kind {
        StepKind::Climb => "climb",
        StepKind::Bisect => "bisect",
        StepKind::Confirm => "confirm",
    };
    let measured: Vec<String> = v
        .measured
        .iter()
        .map(|m| {
            let not = if m.met { "" } else { " (not met)" };
            format!("{}: {}{not}", m.objective, m.measured)
        })
        .collect();
    format!(
        "  step {n:>2} {kind:<7} {:>8.0}/s (achieved {:.0}/s): {}{} -> {}",
        v.rate,
        v.achieved_rate,
        measured.join(", "),
        v.unjudged
            .as_ref()
            .map(|u| format!(" [{u}]"))
            .unwrap_or_default(),
        if v.met { "met" } else { "not met" }
    )
}

fn describe_answer(answer: &Answer, slo: &str) -> String {
    match answer {
        Answer::Found {
            rate,
            fails_at,
            confirmed,
        } => format!(
            "{rate:.0}/s meets {slo}, {fails_at:.0}/s does not ({}); the answer lies in \
             [{rate:.0}, {fails_at:.0}) requests per second",
            if *confirmed {
                "confirmed by the repeats"
            } else {
                "not repeated"
            }
        ),
        Answer::FirstStepFails { rate } => {
            format!("the first step, {rate:.0}/s, already fails {slo}: nothing searched")
        }
        Answer::NoFailureUpTo { rate } => {
            format!("every step met {slo}, up to {rate:.0}/s: raise --max-steps or --start")
        }
        Answer::StepLimit { rate, fails_at } => format!(
            "out of steps: {rate:.0}/s meets {slo}, {fails_at:.0}/s does not, the bracket is \
             wider than 2 % (raise --max-steps, or --start nearer)"
        ),
    }
}

/// A page with, per variant, the steps' p99 and goodput against the
/// offered rate, the answer marked.
fn search_html(scenario: &str, slo: &str, searches: &[(String, search::Search)]) -> String {
    use tailmesh::output::svg::{
        Band, BandKind, Frame, LineChart, Scale, Series, escape, line_chart,
    };
    let mut body = String::new();
    for (k, (variant, s)) in searches.iter().enumerate() {
        let mut steps: Vec<&StepVerdict> = s.steps.iter().map(|(_, v)| v).collect();
        steps.sort_by(|a, b| a.rate.total_cmp(&b.rate));
        let points = |f: fn(&StepVerdict) -> f64, met: bool| -> Vec<(f64, f64)> {
            steps
                .iter()
                .filter(|v| v.met == met)
                .map(|v| (v.rate, f(v)))
                .collect()
        };
        let marks: Vec<Band> = match &s.answer {
            Answer::Found { rate, .. } | Answer::StepLimit { rate, .. } => vec![Band {
                from: *rate,
                to: *rate,
                label: format!("answer {rate:.0}/s"),
                kind: BandKind::Mark,
            }],
            _ => Vec::new(),
        };
        let frame = |y_label| Frame {
            x_label: "offered rate (requests/s)",
            y_label,
            x_scale: Scale::Linear,
            y_scale: Scale::Linear,
            x_format: |v| format!("{v:.0}"),
            y_format: |v| format!("{v:.0}"),
        };
        let series = |f: fn(&StepVerdict) -> f64, name: &str| {
            vec![
                Series {
                    name: format!("{name}, met"),
                    points: points(f, true),
                    dashed: false,
                    colour: 2,
                    intervals: Vec::new(),
                },
                Series {
                    name: format!("{name}, not met"),
                    points: points(f, false),
                    dashed: true,
                    colour: 1,
                    intervals: Vec::new(),
                },
            ]
        };
        let chart = |id: &str, title: &str, y_label, f: fn(&StepVerdict) -> f64, name: &str| {
            line_chart(&LineChart {
                id: &format!("{id}-{k}"),
                title,
                frame: frame(y_label),
                x_range: None,
                series: series(f, name),
                bands: marks.clone(),
            })
        };
        let p99 = chart(
            "p99",
            "p99 of the ok requests by step",
            "p99 (ms)",
            |v| v.p99_ms,
            "p99",
        );
        let goodput = chart(
            "goodput",
            "goodput (ok requests/s) by step",
            "ok requests/s",
            |v| v.ok_rate,
            "goodput",
        );
        body.push_str(&format!(
            "<h2>variant {}</h2>\n<p>{}</p>\n{p99}\n{goodput}\n",
            escape(variant),
            escape(&describe_answer(&s.answer, slo))
        ));
    }
    format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{t}</title>\n\
         <style>{style}</style></head>\n<body><h1>{t}</h1>\n<p>objective: {o}</p>\n{body}\
         </body></html>\n",
        style = tailmesh::output::report::STYLE,
        t = escape(&format!("tailmesh search: {scenario}")),
        o = escape(slo),
    )
}
