//! Scenario files: parse the TOML, validate everything (every problem with
//! its line and column), then build the checked [`Scenario`].
//!
//! - `model`: the checked types the rest of the orchestrator uses.
//! - `tree`: the TOML document as an owned tree that keeps every span.
//! - `read`: typed getters over a table that record problems instead of
//!   stopping at the first.
//! - `validate`: one tree (the base file or a variant) into the model.
//! - `variant`: `[[variant]]` overrides, applied to a copy of the tree.
//! - `endpoints`: a hop's mesh-client keys (health, backoff, keepalive,
//!   ewma, ejection) and `kill`.
//! - `service`: `[hop.service]`, a real gRPC service as a hop's work.
//! - `error`: [`ScenarioError`] and [`ScenarioErrors`].
//!
//! Plain serde with `deny_unknown_fields` stops at the first problem, so
//! the file is parsed into toml's spanned tree and read by hand.
//!
//! The schema (every key, its default and its limits) is documented once,
//! in docs/scenarios.md; a change to what `validate` accepts changes that
//! file too.
//!
//! A TOML syntax error stops the reading there: the first syntax error is
//! reported, with its place, and nothing else (toml's recovery after it
//! guesses, and its later errors are often artefacts of the first).

mod broker;
mod endpoints;
mod error;
mod mesh;
mod model;
mod read;
pub(crate) use read::is_dns_label;
mod service;
mod tree;
mod validate;
mod variant;

#[cfg(test)]
mod declared_tests;
#[cfg(test)]
mod tests;

use std::path::Path;

pub use endpoints::EJECTION_DEFAULTS;
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
    let mut scenario = parse(&source, &origin)?;
    // A service's relative paths are the scenario file's; absolute, as a
    // service's command runs there.
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => {
            std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
        }
        _ => std::env::current_dir().unwrap_or_default(),
    };
    for hop in scenario.variants.iter_mut().flat_map(|v| v.hops.iter_mut()) {
        if let Some(service) = &mut hop.service {
            service.dir = dir.clone();
        }
    }
    // What needs the files a scenario names, now that they can be found
    // (parse's source parsed once more for the keys' places).
    let mut problems = Problems::default();
    let (doc, _) = toml::de::DeTable::parse_recoverable(source.as_str());
    let root = tree::from_document(doc.get_ref(), &mut Problems::default());
    let hops = scenario.variants.iter().flat_map(|v| &v.hops);
    service::method_kinds(&root, hops, &mut problems);
    if !problems.is_empty() {
        return Err(problems.into_errors(&source, &origin));
    }
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
        broker: parts.broker.kind,
        queue_bounds: parts.broker.bounds,
        mesh: parts.mesh,
        sweep: None,
    }
}
