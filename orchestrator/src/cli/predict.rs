//! `tailmesh predict`: the end-to-end latency each variant of a scenario
//! declares, composed from its hops before anything runs.

#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;
use std::time::Duration;

use anyhow::anyhow;
use clap::Args;
use serde::Serialize;
use tailmesh::analysis::{Declared, Dist, Grid, Undeclared, declared};
use tailmesh::say;
use tailmesh::scenario::{self, Hop};
use tailmesh_services::model::Transport;
use tailmesh_units::{duration, percent};

use super::CliError;

/// The overhead of reaching a push hop on these machines: the per-hop cost
/// of a zero-work push hop with traces on, 132 and 129.5 µs on a quiet
/// machine (docs/performance.md, "Hop floor").
pub(crate) const PUSH_FLOOR: Duration = Duration::from_micros(130);

/// The overhead of reaching a pull hop: twice push's, as a pull hop is two
/// round trips (to the broker, from it) where push is one; measured 2.2x
/// h2load's single hop the same day (docs/performance.md, "The three pull
/// backends": 89 µs against 41 µs).
pub(crate) const PULL_FLOOR: Duration = Duration::from_micros(260);

/// The quantiles printed, as fractions, and their names.
const QUANTILES: [(f64, &str); 4] = [(0.5, "p50"), (0.9, "p90"), (0.99, "p99"), (0.999, "p99.9")];

/// `tailmesh predict`.
#[derive(Args)]
pub(crate) struct PredictArgs {
    /// The scenario file.
    scenario: PathBuf,
    /// The time to reach each hop beyond its work: `DUR` for every hop, or
    /// `push=DUR,pull=DUR` (either may be left out) [default: push=130us,
    /// pull=260us, the floors measured on this project's machines].
    #[arg(long, value_parser = overheads)]
    overhead: Option<Overheads>,
    /// Only this variant (repeatable); default: every variant.
    #[arg(long = "variant", value_name = "NAME")]
    variants: Vec<String>,
    /// Print JSON instead of lines.
    #[arg(long)]
    json: bool,
    /// A run folder of this scenario: predict from its measured segments
    /// (its `<variant>.segments.json`), the variant given by --variant or
    /// the run's only one.
    #[arg(long, value_name = "RUN")]
    from: Option<PathBuf>,
    /// With --from, a change to predict (repeatable): any override a
    /// variant's `set` takes, `KEY=VALUE` with the value in TOML syntax
    /// (a bare word is taken as a string), e.g.
    /// `hop.b.transport=pull`, `hop.b.replicas=2`,
    /// `hop.c.net={loss=0.01}`.
    #[arg(long = "what-if", value_name = "KEY=VALUE", requires = "from")]
    what_if: Vec<String>,
}

/// The overhead per hop reached, by transport.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Overheads {
    push: Duration,
    pull: Duration,
}

impl Default for Overheads {
    fn default() -> Self {
        Overheads {
            push: PUSH_FLOOR,
            pull: PULL_FLOOR,
        }
    }
}

/// `DUR` or `push=DUR,pull=DUR`.
fn overheads(text: &str) -> Result<Overheads, String> {
    let duration = |s: &str| {
        humantime::parse_duration(s.trim()).map_err(|e| format!("{s:?} is not a duration: {e}"))
    };
    if !text.contains('=') {
        let d = duration(text)?;
        return Ok(Overheads { push: d, pull: d });
    }
    let mut out = Overheads::default();
    for item in text.split(',') {
        match item.split_once('=') {
            Some(("push", d)) => out.push = duration(d)?,
            Some(("pull", d)) => out.pull = duration(d)?,
            _ => return Err(format!("{item:?}: expected push=DUR or pull=DUR")),
        }
    }
    Ok(out)
}

/// One variant's prediction, as `--json` prints it.
#[derive(Serialize)]
pub(crate) struct Predicted {
    variant: String,
    /// The quantiles in µs, `null` when past the load's timeout.
    p50_us: Option<u64>,
    p90_us: Option<u64>,
    p99_us: Option<u64>,
    p999_us: Option<u64>,
    /// The share of requests predicted to fail or time out.
    censored: Option<f64>,
    assumptions: Vec<String>,
    /// Why there is no prediction, if there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    undeclared: Option<String>,
}

#[derive(Serialize)]
struct Report {
    scenario: String,
    overhead_push_us: u64,
    overhead_pull_us: u64,
    variants: Vec<Predicted>,
}

pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Reads and checks the scenario as `validate` does, predicts each variant
/// asked for, prints a line (and its assumptions) per variant.
pub(crate) fn predict(args: PredictArgs) -> Result<(), CliError> {
    let (s, source) = scenario::load(&args.scenario).map_err(CliError::Scenario)?;
    if let Some(unknown) = args
        .variants
        .iter()
        .find(|n| !s.variants.iter().any(|v| &v.name == *n))
    {
        let names: Vec<&str> = s.variants.iter().map(|v| v.name.as_str()).collect();
        return Err(CliError::Failed(anyhow!(
            "{}: no variant named {unknown:?}; the scenario has {}",
            args.scenario.display(),
            names.join(", ")
        )));
    }
    let overhead = args.overhead.unwrap_or_default();
    if let Some(run) = &args.from {
        return super::what_if::predict_what_if(
            &args.scenario,
            &s,
            &source,
            run,
            args.variants.first().map(String::as_str),
            &args.what_if,
            (overhead.push, overhead.pull),
            args.json,
        );
    }
    let mut report = Report {
        scenario: s.name.clone(),
        overhead_push_us: micros(overhead.push),
        overhead_pull_us: micros(overhead.pull),
        variants: Vec::new(),
    };
    for v in &s.variants {
        if !args.variants.is_empty() && !args.variants.contains(&v.name) {
            continue;
        }
        let grid = Grid::for_horizon(v.load.timeout);
        let reach = |hop: &Hop| {
            Dist::point(
                grid,
                match hop.transport {
                    Transport::Push => overhead.push,
                    Transport::Pull => overhead.pull,
                },
            )
        };
        let predicted = Predicted::of(&v.name, declared(v, grid, &reach));
        if !args.json {
            say!("{}", render(&predicted, v.load.timeout));
        }
        report.variants.push(predicted);
    }
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| CliError::Failed(anyhow!("the prediction as JSON: {e}")))?;
        say!("{text}");
    }
    Ok(())
}

impl Predicted {
    /// `name`'s prediction, or why there is none.
    pub(crate) fn of(name: &str, declared: Result<Declared, Undeclared>) -> Predicted {
        match declared {
            Ok(d) => {
                let q: Vec<Option<u64>> = QUANTILES
                    .iter()
                    .map(|(q, _)| d.dist.quantile(*q).map(micros))
                    .collect();
                Predicted {
                    variant: name.to_owned(),
                    p50_us: q[0],
                    p90_us: q[1],
                    p99_us: q[2],
                    p999_us: q[3],
                    censored: Some(d.dist.beyond()),
                    assumptions: d.assumptions,
                    undeclared: None,
                }
            }
            Err(why) => Predicted {
                variant: name.to_owned(),
                p50_us: None,
                p90_us: None,
                p99_us: None,
                p999_us: None,
                censored: None,
                assumptions: Vec::new(),
                undeclared: Some(why.to_string()),
            },
        }
    }
}

/// `variant NAME  p50 ..  p90 ..  p99 ..  p99.9 ..  censored ..`, and an
/// `  assumes: ` line per assumption.
pub(crate) fn render(p: &Predicted, timeout: Duration) -> String {
    render_as(&format!("variant {}", p.variant), p, timeout)
}

/// [`render`] with `label` first.
pub(crate) fn render_as(label: &str, p: &Predicted, timeout: Duration) -> String {
    let mut line = label.to_owned();
    if let Some(why) = &p.undeclared {
        line.push_str(&format!("  no prediction: {why}"));
        return line;
    }
    for ((_, name), us) in QUANTILES
        .iter()
        .zip([p.p50_us, p.p90_us, p.p99_us, p.p999_us])
    {
        let value = us.map_or_else(
            || format!(">{}", duration(timeout)),
            |us| tailmesh_units::micros(us as f64),
        );
        line.push_str(&format!("  {name} {value}"));
    }
    if let Some(c) = p.censored.filter(|c| *c >= 1e-6) {
        line.push_str(&format!("  censored {}", percent(c)));
    }
    for a in &p.assumptions {
        line.push_str(&format!("\n  assumes: {a}"));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overheads_take_one_duration_or_one_per_transport() {
        let us = Duration::from_micros;
        assert_eq!(
            overheads("200us"),
            Ok(Overheads {
                push: us(200),
                pull: us(200)
            })
        );
        assert_eq!(
            overheads("pull=1ms"),
            Ok(Overheads {
                push: PUSH_FLOOR,
                pull: us(1000)
            })
        );
        assert_eq!(
            overheads("push=50us,pull=1ms"),
            Ok(Overheads {
                push: us(50),
                pull: us(1000)
            })
        );
        assert!(overheads("tcp=1ms").is_err());
        assert!(overheads("push=fast").is_err());
    }
}
