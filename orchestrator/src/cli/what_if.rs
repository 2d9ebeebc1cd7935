//! `tailmesh predict SCENARIO --from RUN --what-if KEY=VALUE...`: the
//! changed mesh's end-to-end latency, composed from the run's measured
//! segments with the changes applied (`tailmesh::analysis::what_if`),
//! beside the run's own variant recomposed and measured.

#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::path::Path;
use std::time::Duration;

use anyhow::anyhow;
use serde::Serialize;
use tailmesh::analysis::Grid;
use tailmesh::analysis::what_if::{Floors, what_if};
use tailmesh::output::segments::{file_name, read_segments};
use tailmesh::say;
use tailmesh::scenario::{self, Scenario};

use super::CliError;
use super::predict::{Predicted, render_as};

/// The names the two variants of a what-if get in the scenario it parses.
const AS_RUN: &str = "tailmesh-as-run";
const CHANGED: &str = "tailmesh-what-if";

/// What `--json` prints.
#[derive(Serialize)]
struct Report {
    scenario: String,
    from: String,
    variant: String,
    what_if: Vec<String>,
    /// The run's measured quantiles, µs.
    measured: Measured,
    as_run: Predicted,
    changed: Predicted,
}

#[derive(Serialize, Default)]
struct Measured {
    p50_us: Option<f64>,
    p90_us: Option<f64>,
    p99_us: Option<f64>,
    p999_us: Option<f64>,
}

/// A change as `set` takes it: `("hop.b.transport", "\"pull\"")`.
fn change(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("--what-if {text:?}: expected KEY=VALUE"))?;
    let (key, value) = (key.trim(), value.trim());
    if key.is_empty() || value.is_empty() {
        return Err(format!("--what-if {text:?}: expected KEY=VALUE"));
    }
    // A TOML value as it is; a bare word as a string.
    let toml_value = toml::from_str::<toml::Table>(&format!("v = {value}")).is_ok();
    let value = if toml_value {
        value.to_owned()
    } else {
        toml::Value::String(value.to_owned()).to_string()
    };
    Ok((key.to_owned(), value))
}

/// `{ "k" = v, ... }`.
fn inline(set: &[(String, String)]) -> String {
    let items: Vec<String> = set
        .iter()
        .map(|(k, v)| format!("{} = {v}", toml::Value::String(k.clone())))
        .collect();
    format!("{{ {} }}", items.join(", "))
}

/// The run's variant: `asked`, or the run folder's only one.
fn run_variant(run: &Path, asked: Option<&str>) -> Result<String, CliError> {
    if let Some(name) = asked {
        return Ok(name.to_owned());
    }
    let entries = std::fs::read_dir(run)
        .map_err(|e| CliError::Failed(anyhow!("read the run folder {}: {e}", run.display())))?;
    let mut names: Vec<String> = entries
        .filter_map(|e| {
            let name = e.ok()?.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".segments.json").map(str::to_owned)
        })
        .collect();
    names.sort();
    match names.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(CliError::Failed(anyhow!(
            "{} has no measured segments (<variant>.segments.json): a run folder of this \
             version of tailmesh, whose variant composed its tail, has them",
            run.display()
        ))),
        many => Err(CliError::Failed(anyhow!(
            "{} has the segments of several variants ({}): say which with --variant",
            run.display(),
            many.join(", ")
        ))),
    }
}

/// The run's measured quantiles of `variant` from its summary.json, if
/// it says.
fn measured(run: &Path, variant: &str) -> Measured {
    let Ok(text) = std::fs::read(run.join("summary.json")) else {
        return Measured::default();
    };
    let Ok(summary) = serde_json::from_slice::<serde_json::Value>(&text) else {
        return Measured::default();
    };
    let Some(v) = summary
        .get("variants")
        .and_then(|v| v.as_array())
        .and_then(|vs| vs.iter().find(|v| v["name"] == variant))
    else {
        return Measured::default();
    };
    let at = |q: &str| {
        v.pointer(&format!("/composition/measured/{q}_us"))
            .and_then(serde_json::Value::as_f64)
    };
    Measured {
        p50_us: at("p50"),
        p90_us: at("p90"),
        p99_us: at("p99"),
        p999_us: at("p999"),
    }
}

/// Predicts the scenario's run variant changed by `changes`, from `run`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn predict_what_if(
    path: &Path,
    s: &Scenario,
    source: &str,
    run: &Path,
    variant: Option<&str>,
    changes: &[String],
    (push, pull): (Duration, Duration),
    json: bool,
) -> Result<(), CliError> {
    let name = run_variant(run, variant)?;
    let segments_file = run.join(file_name(&name));
    let (_, measured_segments) =
        read_segments(&segments_file).map_err(|e| CliError::Failed(anyhow!("{e}")))?;
    let base = s.variants.iter().find(|v| v.name == name).ok_or_else(|| {
        let names: Vec<&str> = s.variants.iter().map(|v| v.name.as_str()).collect();
        CliError::Failed(anyhow!(
            "{}: no variant named {name:?} (the run's); the scenario has {}",
            path.display(),
            names.join(", ")
        ))
    })?;
    if base.sweep.is_some() {
        return Err(CliError::Failed(anyhow!(
            "{}: variant {name:?} is a point of a sweep: a what-if starts from a scenario \
             without one (write the point's values into a copy of the file)",
            path.display()
        )));
    }
    if base.overrides.iter().any(|(_, v)| v == "<unset>") {
        return Err(CliError::Failed(anyhow!(
            "{}: variant {name:?} unsets keys: a what-if starts from a variant that only sets \
             them (write it into a copy of the file)",
            path.display()
        )));
    }
    let changes: Vec<(String, String)> = changes
        .iter()
        .map(|c| change(c))
        .collect::<Result<_, _>>()
        .map_err(|e| CliError::Failed(anyhow!(e)))?;
    let mut set = base.overrides.clone();
    for (k, v) in &changes {
        set.retain(|(key, _)| key != k);
        set.push((k.clone(), v.clone()));
    }
    let mut text = source.to_owned();
    text.push_str(&format!(
        "\n[[variant]]\nname = \"{AS_RUN}\"\nset = {}\n\n[[variant]]\nname = \"{CHANGED}\"\nset = {}\n",
        inline(&base.overrides),
        inline(&set)
    ));
    let origin = format!("{} with --what-if", path.display());
    let changed_scenario = scenario::parse(&text, &origin).map_err(CliError::Scenario)?;
    let pick = |n: &str| {
        changed_scenario
            .variants
            .iter()
            .find(|v| v.name == n)
            .ok_or_else(|| CliError::Failed(anyhow!("the what-if lost variant {n}")))
    };
    let (as_run, changed) = (pick(AS_RUN)?, pick(CHANGED)?);
    let grid = Grid::for_horizon(changed.load.timeout.max(as_run.load.timeout));
    let w = what_if(
        as_run,
        changed,
        &measured_segments,
        Floors { push, pull },
        grid,
    );
    let report = Report {
        scenario: s.name.clone(),
        from: run.display().to_string(),
        variant: name.clone(),
        what_if: changes.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        measured: measured(run, &name),
        as_run: Predicted::of(&name, w.as_run),
        changed: Predicted::of(&name, w.changed),
    };
    if json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| CliError::Failed(anyhow!("the prediction as JSON: {e}")))?;
        say!("{text}");
        return Ok(());
    }
    say!(
        "what-if from {} (variant {name}): {}",
        run.display(),
        if report.what_if.is_empty() {
            "no change".to_owned()
        } else {
            report.what_if.join(" ")
        }
    );
    let us = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), tailmesh_units::micros);
    say!(
        "  measured  p50 {}  p90 {}  p99 {}  p99.9 {}",
        us(report.measured.p50_us),
        us(report.measured.p90_us),
        us(report.measured.p99_us),
        us(report.measured.p999_us)
    );
    say!(
        "{}",
        render_as("  as run  ", &report.as_run, as_run.load.timeout)
    );
    say!(
        "{}",
        render_as("  what-if ", &report.changed, changed.load.timeout)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_a_key_and_a_toml_value_or_a_bare_word() {
        assert_eq!(
            change("hop.b.transport=pull"),
            Ok(("hop.b.transport".to_owned(), "\"pull\"".to_owned()))
        );
        assert_eq!(
            change(" hop.b.replicas = 2 "),
            Ok(("hop.b.replicas".to_owned(), "2".to_owned()))
        );
        assert_eq!(
            change("hop.c.net={loss=0.01}"),
            Ok(("hop.c.net".to_owned(), "{loss=0.01}".to_owned()))
        );
        assert!(change("hop.b.replicas").is_err());
        assert!(change("=2").is_err());
        assert_eq!(
            inline(&[("hop.b.replicas".to_owned(), "2".to_owned())]),
            "{ \"hop.b.replicas\" = 2 }"
        );
    }
}
