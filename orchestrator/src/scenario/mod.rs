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
//! | `launcher` | `"local"`, `"netns"` or `"auto"` | `"local"`; `"auto"` with network faults |
//! | `[load]` | table | required |
//! | `[[hop]]` | 1 to [`MAX_HOPS`] tables | required |
//! | `[[variant]]` | tables | one variant, "base" |
//! | `[check]` | table | `slow_threshold = "1s"`, `compounding = false`, `max_error_rate = 0.01` |
//! | `[report]` | table | `histogram = false` |
//! | `[sweep]` | table | none |
//! | `[telemetry]` | table | `sampling = 1.0`, no `forward` |
//! | `[broker]` | table | `kind = "tailmesh"` |
//!
//! `[load]`: `mode` = `"open"` | `"closed"` (required). Open needs `rate`
//! (number, > 0, <= 1 000 000) and takes `arrivals` = `"poisson"` (default)
//! | `"uniform"`; closed needs `concurrency` (1..=10 000); each mode's keys
//! are errors in the other. Exactly one of `duration` (> 0) or `requests`
//! (>= 1). `warmup` (default `"0s"`), `timeout` (> 0, default `"1s"`),
//! `connection` = `"shared"` (default) | `"per_request"`, `connections`
//! (1..=64, default 1, shared only), `payload` (bytes, 0..=4 194 304, the
//! services' [`MAX_PAYLOAD_BYTES`](tailmesh_services::limits::MAX_PAYLOAD_BYTES);
//! default 64). The requests that may be in flight (open: `rate` x
//! `timeout`; closed: `concurrency`) times `payload` plus 8 KiB may not
//! exceed [`MAX_IN_FLIGHT_BYTES`](tailmesh_services::limits::MAX_IN_FLIGHT_BYTES)
//! (1 GiB): over it is an error at `payload` (else `timeout`).
//!
//! `[[hop]]`: `name` (required, unique), `replicas` (1..=64, default 1),
//! `concurrency` (1..=10000: requests a replica works on at once, the rest
//! wait in the replica (push) or the broker (pull); default: unlimited for
//! push, one task at a time for pull), `queue_limit` (0..=1 000 000,
//! only with `concurrency`, default 1000: the most requests that may wait
//! for a slot at one push replica; one more is refused at once with
//! RESOURCE_EXHAUSTED, counted on the hop as `resource_exhausted`; pull
//! hops ignore it, their queue is the broker's), `discipline` =
//! `"fifo"` (default) | `"lifo"` | `"adaptive"` (the order waiting
//! requests are served in: at a push replica's line for a slot, which
//! needs `concurrency`, or in a pull hop's broker topic; see
//! [`tailmesh_services::discipline`]),
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
//! - `net = { loss, delay, jitter, start, duration }`: a network fault on
//!   every replica of the hop, per packet and per direction: `loss` in
//!   [0, 1] (default 0), `delay` >= 0 (default 0), `jitter` <= `delay`
//!   (jitter without delay is an error), `start` (default `"0s"`, from the
//!   start of the load) and `duration` (> 0; default: until the end).
//!   Needs the netns launcher: `launcher = "local"` with a network fault is
//!   an error; `"auto"` (the default when a hop has one) picks netns, and a
//!   run without root fails before starting anything.
//! - `replica_net`: one table or an array of tables, each `replica`
//!   (< replicas, at most once) plus the fields of `net`; it replaces the
//!   hop's `net` on that replica.
//! - `error = { probability, code }`: code a snake_case gRPC code name
//!   other than `"ok"`, or an integer 1..=16.
//! - `downstream`: hop names called in parallel. Default: the next hop in
//!   file order (none for the last) when no hop of the file names its
//!   downstream hops; once one does, the file is a tree and a hop without
//!   `downstream` is a leaf. Unknown names, the hop itself,
//!   duplicates, cycles and hops not reachable from the first hop (the
//!   entry) are errors.
//!
//! `[broker]`: `kind` = `"tailmesh"` (default: tailmesh's own broker) |
//! `"rabbitmq"` | `"nats"` (NATS JetStream): the broker every pull hop of
//! the variant goes through. Variants may override it
//! (`"broker.kind" = "nats"`), so one scenario compares brokers side by
//! side.
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
//! (bool, default false; true needs an explicit `slow_threshold`),
//! `max_error_rate` (number in [0, 1], default
//! [`DEFAULT_MAX_ERROR_RATE`] = 0.01: the largest share of a variant's
//! requests, errors plus timeouts over sent, that may fail; a variant
//! above it fails the check).
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
//! `[sweep]`: `key` (required): `"hops"` (the first n `[[hop]]` tables
//! form the chain) or an override path as in `set`; and either `values`
//! (a non-empty array, at most 64) or integer `from`, `to` (inclusive) and
//! `step` (default 1). Every variant (or the base) runs once per value, as
//! a variant named `<variant>-<last key segment>-<value>`; a value that does
//! not fit (more hops than declared, an invalid probability) is reported at
//! the value, prefixed with the variant and the sweep point.
//!
//! A TOML syntax error stops the reading there: the first syntax error is
//! reported, with its place, and nothing else (toml's recovery after it
//! guesses, and its later errors are often artefacts of the first).

mod broker;
mod error;
mod model;
mod read;
pub(crate) use read::is_dns_label;
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
    // A set, so that checking a variant's problems against the base's
    // stays linear in their number.
    let base_seen: std::collections::HashSet<error::Problem> =
        base_problems.list.iter().cloned().collect();
    let specs = variant::read(&root, source, &mut problems);
    let sweep = variant::read_sweep(&root, source, &mut problems);
    // The declared variants' trees (or the base alone), before any sweep.
    // (name, message prefix, overrides as written, tree) of each.
    type Declared = (Option<String>, String, Vec<(String, String)>, tree::Table);
    let mut declared: Vec<Declared> = Vec::new();
    match specs {
        None => declared.push((
            Some("base".to_owned()),
            String::new(),
            Vec::new(),
            root.clone(),
        )),
        Some(specs) => {
            for spec in specs {
                let tree = variant::apply(&root, &spec, &mut problems);
                declared.push((
                    spec.name.clone(),
                    spec.prefix.clone(),
                    spec.echo.clone(),
                    tree,
                ));
            }
        }
    }
    let mut variants = Vec::new();
    for (group, prefix, echo, tree) in declared {
        // Each declared variant runs once, or once per sweep value.
        let points: Vec<Option<usize>> = match &sweep {
            Some(sweep) => (0..sweep.values.len()).map(Some).collect(),
            None => vec![None],
        };
        for point in points {
            let (tree, name, prefix, echo, at) = match (point, &sweep) {
                (Some(i), Some(sweep)) => {
                    let Some(tree) = variant::apply_sweep(&tree, sweep, i, &prefix, &mut problems)
                    else {
                        continue;
                    };
                    let suffix = variant::sweep_suffix(&sweep.key, &sweep.texts[i]);
                    let name = group.as_ref().map(|n| format!("{n}-{suffix}"));
                    let prefix = match &name {
                        Some(n) => format!(
                            "variant \"{n}\" (sweep {} = {}): ",
                            sweep.key, sweep.texts[i]
                        ),
                        None => prefix.clone(),
                    };
                    let mut echo = echo.clone();
                    echo.push((format!("sweep {}", sweep.key), sweep.texts[i].clone()));
                    (tree, name, prefix, echo, Some((i, sweep)))
                }
                _ => (
                    tree.clone(),
                    group.clone(),
                    prefix.clone(),
                    echo.clone(),
                    None,
                ),
            };
            let (parts, own) = validate::validate(&tree);
            for problem in own.list {
                // The base's problems are reported once, below.
                if !base_seen.contains(&problem) {
                    problems.list.push(error::Problem {
                        at: problem.at,
                        message: format!("{prefix}{}", problem.message),
                    });
                }
            }
            if let (Some(parts), Some(variant_name)) = (parts, name) {
                let mut v = variant_of(variant_name, echo, &parts);
                v.sweep = at.map(|(i, sweep)| SweepPoint {
                    group: group.clone().unwrap_or_default(),
                    value: sweep.texts[i].clone(),
                });
                variants.push(v);
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    for v in &variants {
        if !seen.insert(v.name.as_str()) || !read::is_dns_label(&v.name) {
            problems.nowhere(format!(
                "the sweep makes the variant name \"{}\", which is a duplicate or not a DNS label: shorten the variant names or the values",
                v.name
            ));
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
            sweep: sweep.map(|s| Sweep {
                key: s.key,
                values: s.texts,
            }),
            telemetry: base.telemetry,
        }),
        _ => Err(problems.into_errors(source, origin)),
    }
}

/// Reads the file and calls [`parse`]; returns the scenario with the text
/// it was parsed from. An unreadable file is one [`ScenarioError`] without
/// line or column; a file that is not UTF-8 text, one at its first
/// offending byte.
pub fn load(path: &Path) -> Result<(Scenario, String), ScenarioErrors> {
    let origin = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| {
        Problems::one(None, format!("cannot read the scenario: {e}")).into_errors("", &origin)
    })?;
    let source = decode(bytes, &origin)?;
    let scenario = parse(&source, &origin)?;
    Ok((scenario, source))
}

/// The text of a scenario file, or where it stops being UTF-8.
fn decode(bytes: Vec<u8>, origin: &str) -> Result<String, ScenarioErrors> {
    String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        let bytes = e.as_bytes();
        let byte = bytes.get(valid).copied().unwrap_or_default();
        // Everything before the bad byte is text, so it locates it.
        let prefix = String::from_utf8_lossy(&bytes[..valid]);
        let kind = if bytes.contains(&0) {
            "a binary file, not a scenario: "
        } else {
            ""
        };
        Problems::one(
            Some(valid),
            format!(
                "{kind}not UTF-8 text: byte 0x{byte:02x} is not a valid character here \
                 (scenario files are TOML, which is UTF-8)"
            ),
        )
        .into_errors(&prefix, origin)
    })
}

fn variant_of(name: String, overrides: Vec<(String, String)>, parts: &Parts) -> Variant {
    Variant {
        name,
        overrides,
        load: parts.load.clone(),
        hops: parts.hops.clone(),
        launcher: parts.launcher,
        broker: parts.broker,
        sweep: None,
    }
}
