//! Scenario files: parse the TOML, validate everything (every problem with
//! its line and column), then build the checked [`Scenario`].
//!
//! - `model`: the checked types the rest of the orchestrator uses.
//! - `tree`: the TOML document as an owned tree that keeps every span.
//! - `read`: typed getters over a table that record problems instead of
//!   stopping at the first.
//! - `validate`: one tree (the base file or a variant) into the model.
//! - `variant`: `[[variant]]` overrides, applied to a copy of the tree.
//! - `error`: [`ScenarioError`] and [`ScenarioErrors`].
//!
//! Plain serde with `deny_unknown_fields` stops at the first problem, so
//! the file is parsed into toml's spanned tree and read by hand.
//!
//! # Schema
//!
//! Durations are strings read by `humantime` (`"250us"`, `"20ms"`, `"1.5s"`,
//! `"30s"`, `"2m"`); a leading `-` is a "negative duration". Numbers where a
//! duration is expected are type errors. Names are DNS labels: 1 to 63 of
//! `[a-z0-9-]`, not starting or ending with `-`.
//!
//! Top level:
//!
//! | key | type | default |
//! |-----|------|---------|
//! | `name` | DNS label | required |
//! | `description` | string | `""` |
//! | `seed` | integer >= 0 | 1 |
//! | `launcher` | `"local"` or `"auto"` (both local for now) | `"local"` |
//! | `[load]` | table | required |
//! | `[[hop]]` | 1 to [`MAX_HOPS`] tables | required |
//! | `[[variant]]` | tables | one variant, "base" |
//! | `[check]` | table | `slow_threshold = "1s"`, `compounding = false` |
//! | `[report]` | table | `histogram = false` |
//! | `[telemetry]` | table | `sampling = 1.0`, no `forward` |
//!
//! `[load]`: `mode` = `"open"` | `"closed"` (required). Open needs `rate`
//! (number, > 0, <= 1 000 000) and takes `arrivals` = `"poisson"` (default)
//! | `"uniform"`; closed needs `concurrency` (1..=10 000); each mode's keys
//! are errors in the other. Exactly one of `duration` (> 0) or `requests`
//! (>= 1). `warmup` (default `"0s"`), `timeout` (> 0, default `"1s"`),
//! `connection` = `"shared"` (default) | `"per_request"`, `connections`
//! (1..=64, default 1, shared only), `payload` (bytes, 0..=4 194 304,
//! default 64).
//!
//! `[[hop]]`: `name` (required, unique), `replicas` (1..=64, default 1),
//! `concurrency` (1..=10000: requests a replica works on at once, the rest
//! wait in the replica (push) or the broker (pull); default: unlimited for
//! push, one task at a time for pull),
//! `transport` = `"push"` (default) | `"pull"`, `balance` =
//! `"round_robin"` (default) | `"random"` | `"p2c"` (accepted on pull hops
//! too, where it is unused, so a variant can flip the transport alone),
//! and these optional tables:
//!
//! - `work`: `kind` (required) = `"none"`; `"sleep"` with distribution
//!   fields; `"cpu"` with `rounds = N` or `min_rounds`/`max_rounds`
//!   (0..=100 000, min <= max) and `block` (bytes, 1..=16 777 216, default
//!   102 400). Without `work` a hop does no work.
//! - distribution fields: `dist` = `"fixed"` (default; `value`) |
//!   `"uniform"` (`min` <= `max`) | `"exp"` (`mean` > 0) | `"lognormal"`
//!   (`mean` > 0, `sigma` in (0, 10]); another distribution's fields are
//!   errors.
//! - `slow = { probability, extra }`: probability in [0, 1]; `extra` a
//!   duration string (fixed) or a distribution table.
//! - `replica_slow = { replica, factor }`: replica < the hop's replicas
//!   (0-based), factor in [1, 1000].
//! - `error = { probability, code }`: code a snake_case gRPC code name
//!   other than `"ok"`, or an integer 1..=16.
//! - `downstream`: hop names called in parallel. Default: the next hop in
//!   file order (none for the last). Unknown names, the hop itself,
//!   duplicates, cycles and hops not reachable from the first hop (the
//!   entry) are errors.
//!
//! `[report]`: `histogram` (bool): also print each variant's latency
//! histogram in the terminal, one bucket per line with a bar, as
//! back-to-back's study did.
//!
//! `[telemetry]`: `sampling` (number in [0, 1], default 1.0: the share of
//! requests traced; 0 turns tracing off, as `tailmesh run --no-traces`
//! does), `forward` (an `http://host:port` OTLP gRPC endpoint, e.g. a
//! Jaeger on 4317, that also receives every span; `--otlp-forward`
//! overrides it).
//!
//! `[check]`: `slow_threshold` (> 0, default `"1s"`), `compounding`
//! (bool, default false; true needs an explicit `slow_threshold`).
//!
//! `[[variant]]`: `name` (required DNS label, unique), `set` (table of
//! quoted paths to new values), `unset` (array of paths). Paths are
//! `"launcher"`, `"load.<key>"` and `"hop.<selector>.<key>[.<key>...]"`
//! with selector `*`, a 0-based index (all digits) or a hop name; `seed`,
//! `name`, `description` and `check.*` are per scenario, and hop names
//! cannot be changed. Unsets apply before sets; setting below a missing
//! table creates it. Each variant is the base with its overrides, validated
//! as a whole. The base file must be valid on its own: its problems are
//! reported once, and a variant reports only problems of its own, prefixed
//! `variant "<name>": ` and located at the override when the override's
//! value is the culprit. Without `[[variant]]` there is one variant, "base".
//!
//! A TOML syntax error stops the reading there: the first syntax error is
//! reported, with its place, and nothing else (toml's recovery after it
//! guesses, and its later errors are often artefacts of the first).

mod error;
mod model;
mod read;
mod tree;
mod validate;
mod variant;

#[cfg(test)]
mod tests;

use std::path::Path;

pub use error::{ScenarioError, ScenarioErrors};
pub use model::*;

use error::Problems;
use validate::Parts;

/// Parses and validates a scenario; `origin` names the source in messages
/// (a file path).
pub fn parse(source: &str, origin: &str) -> Result<Scenario, ScenarioErrors> {
    let mut problems = Problems::default();
    let (doc, syntax) = toml::de::DeTable::parse_recoverable(source);
    // Only the first: after it, toml's recovery guesses, and its later
    // errors (a "duplicate key" after an unclosed header) mislead.
    if let Some(error) = syntax.first() {
        let message = format!("TOML syntax error: {}", error.message());
        match error.span() {
            Some(span) => problems.at(span.start, message),
            None => problems.nowhere(message),
        }
        return Err(problems.into_errors(source, origin));
    }
    let root = tree::from_document(doc.get_ref(), &mut problems);

    let (base, base_problems) = validate::validate(&root);
    let specs = variant::read(&root, source, &mut problems);
    let mut variants = Vec::new();
    match specs {
        None => {
            if let Some(parts) = &base {
                variants.push(variant_of("base".to_owned(), Vec::new(), parts));
            }
        }
        Some(specs) => {
            for spec in specs {
                let tree = variant::apply(&root, &spec, &mut problems);
                let (parts, own) = validate::validate(&tree);
                for problem in own.list {
                    // The base's problems are reported once, below.
                    if !base_problems.list.contains(&problem) {
                        problems.list.push(error::Problem {
                            at: problem.at,
                            message: format!("{}{}", spec.prefix, problem.message),
                        });
                    }
                }
                if let (Some(parts), Some(name)) = (parts, spec.name) {
                    variants.push(variant_of(name, spec.echo, &parts));
                }
            }
        }
    }
    problems.list.extend(base_problems.list);
    if base.is_none() && problems.is_empty() {
        // Every path that rejects a part records why; this only guards
        // against a silent rejection slipping in.
        problems.nowhere("the scenario is invalid");
    }

    match base {
        Some(base) if problems.is_empty() => Ok(Scenario {
            name: base.name,
            description: base.description,
            seed: base.seed,
            variants,
            check: base.check,
            report: base.report,
            telemetry: base.telemetry,
        }),
        _ => Err(problems.into_errors(source, origin)),
    }
}

/// Reads the file and calls [`parse`] (an unreadable file is one
/// [`ScenarioError`] without line or column).
pub fn load(path: &Path) -> Result<Scenario, ScenarioErrors> {
    let origin = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(source) => parse(&source, &origin),
        Err(e) => Err(ScenarioErrors {
            errors: vec![ScenarioError {
                origin,
                line: 0,
                column: 0,
                message: format!("cannot read the scenario: {e}"),
            }],
        }),
    }
}

fn variant_of(name: String, overrides: Vec<(String, String)>, parts: &Parts) -> Variant {
    Variant {
        name,
        overrides,
        load: parts.load.clone(),
        hops: parts.hops.clone(),
        launcher: parts.launcher,
    }
}
