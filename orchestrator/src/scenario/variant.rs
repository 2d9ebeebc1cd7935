//! `[[variant]]` tables: read each variant's overrides, then apply them to
//! a copy of the base tree, which is validated as a whole afterwards.
//!
//! An override's key and value keep their own spans, so a problem caused by
//! an override points at the override, not at the base file.

use std::collections::HashMap;

use super::error::Problems;
use super::read::{Section, dns_label_problem, is_dns_label};
use super::tree::{Entry, Node, Span, Table, Value};

/// Why an override path, a variant's override or a sweep value cannot be
/// applied. Its `Display` is the problem's message, after the variant's
/// prefix.
#[derive(Debug, thiserror::Error)]
enum OverrideError {
    #[error("override path \"{path}\" has an empty part")]
    EmptyPart { path: String },
    #[error("override path \"{path}\": launcher has no keys")]
    LauncherKey { path: String },
    #[error(
        "override path \"load\" must name a key of [load], e.g. \"load.rate\" (write the whole \
         path in quotes)"
    )]
    LoadWithoutKey,
    #[error("override path \"{path}\": hop names cannot be changed by a variant")]
    HopName { path: String },
    #[error(
        "override path \"{path}\" must be hop.<selector>.<key> with selector *, a hop name or an \
         index, e.g. \"hop.*.transport\" (write the whole path in quotes)"
    )]
    HopPath { path: String },
    #[error(
        "override path \"{path}\" must name a key of [broker], e.g. \"broker.kind\" (write the \
         whole path in quotes)"
    )]
    BrokerWithoutKey { path: String },
    #[error(
        "override path \"{path}\" must name a key of [mesh], e.g. \"mesh.tls\" (write the \
         whole path in quotes)"
    )]
    MeshWithoutKey { path: String },
    #[error("seed cannot be overridden by a variant: it is per scenario")]
    Seed,
    #[error(
        "override path \"{path}\": [{section}] cannot be overridden by a variant, it is per scenario"
    )]
    PerScenario { path: String, section: String },
    #[error("override path \"{path}\": {key} cannot be overridden by a variant")]
    Fixed { path: String, key: String },
    #[error(
        "unknown section \"{section}\" in override path \"{path}\" (expected load, hop, launcher, \
         broker or mesh)"
    )]
    UnknownSection { path: String, section: String },
    #[error("hop selector \"{selector}\" in \"{path}\" matches no hop")]
    NoHopSelected { selector: String, path: String },
    #[error("unset \"{path}\": no selected hop has this key")]
    NoSelectedHopHasKey { path: String },
    #[error("unset \"{path}\": no such key")]
    NoSuchKey { path: String },
    #[error("cannot set \"{path}\"")]
    CannotSet { path: String },
    #[error(
        "cannot {} \"{path}\": {parent} is {kind}, not a table",
        if *setting { "set" } else { "unset" }
    )]
    NotATable {
        setting: bool,
        path: String,
        parent: String,
        kind: &'static str,
    },
    #[error("a hops sweep takes whole numbers, got {kind}")]
    HopsNotWhole { kind: &'static str },
    #[error("there are no [[hop]] tables to take hops from")]
    NoHops,
    #[error("a hops sweep takes 1 to {declared} (the [[hop]] tables declared), got {n}")]
    HopsOutOfRange { declared: usize, n: i64 },
}

/// How an unset entry is echoed in [`super::Variant::overrides`].
pub(super) const UNSET: &str = "<unset>";

/// One `[[variant]]` as read.
pub(super) struct Spec {
    /// The name, if valid.
    pub name: Option<String>,
    /// Starts every message about this variant: `variant "pull": `.
    pub prefix: String,
    /// `(path, value as written)` in source order, for the model.
    pub echo: Vec<(String, String)>,
    unsets: Vec<Op>,
    sets: Vec<Op>,
}

/// One override: a parsed path, where it is written, and the new value
/// (`None` to unset).
struct Op {
    path: String,
    span: Span,
    target: Target,
    value: Option<Node>,
}

/// What an override path addresses.
#[derive(Clone)]
enum Target {
    Launcher,
    /// Keys below `[load]`.
    Load(Vec<String>),
    /// Keys below `[broker]`.
    Broker(Vec<String>),
    /// Keys below `[mesh]`.
    Mesh(Vec<String>),
    /// Keys below each selected `[[hop]]`.
    Hop {
        selector: String,
        rest: Vec<String>,
    },
}

/// Reads `[[variant]]`; `None` when the file declares none.
pub(super) fn read(root: &Table, source: &str, p: &mut Problems) -> Option<Vec<Spec>> {
    let entry = root.get("variant")?;
    let Value::Array(items) = &entry.node.value else {
        if !matches!(entry.node.value, Value::Invalid) {
            p.at(
                entry.node.span.start,
                format!(
                    "expected an array of tables ([[variant]]) for variant, got {}",
                    entry.node.value.kind()
                ),
            );
        }
        return Some(Vec::new());
    };
    let mut specs = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (index, item) in items.iter().enumerate() {
        let Value::Table(table) = &item.value else {
            p.at(
                item.span.start,
                format!(
                    "expected a table for each [[variant]], got {}",
                    item.value.kind()
                ),
            );
            continue;
        };
        specs.push(spec(index, item, table, source, &mut seen, p));
    }
    Some(specs)
}

fn spec(
    index: usize,
    node: &Node,
    table: &Table,
    source: &str,
    seen: &mut HashMap<String, usize>,
    p: &mut Problems,
) -> Spec {
    let raw_name = match table.get("name").map(|e| &e.node.value) {
        Some(Value::String(name)) => Some(name.as_str()),
        _ => None,
    };
    let (prefix, label) = match raw_name {
        Some(name) => (
            format!("variant \"{name}\": "),
            format!("[[variant]] \"{name}\""),
        ),
        None => (
            format!("variant at index {index}: "),
            format!("[[variant]] at index {index}"),
        ),
    };
    let s = Section {
        table,
        span: node.span.clone(),
        prefix: prefix.clone(),
        path: String::new(),
        label,
    };
    s.unknown_keys(p, &["name", "set", "unset"]);
    let name = s.required(p, "name", Section::string).and_then(|(name, entry)| {
        if !is_dns_label(name) {
            p.at(entry.node.span.start, dns_label_problem("variant name", name));
            None
        } else if let Some(first) = seen.get(name) {
            p.at(
                entry.node.span.start,
                format!("duplicate variant name \"{name}\" (also used by the variant at index {first})"),
            );
            None
        } else {
            seen.insert(name.to_owned(), index);
            Some(name.to_owned())
        }
    });

    let mut echo = Vec::new();
    let mut sets = Vec::new();
    if let Some(entry) = s.get("set") {
        match &entry.node.value {
            Value::Table(set) => {
                for e in &set.entries {
                    let value_text = source.get(e.node.span.clone()).unwrap_or_default();
                    echo.push((e.key_span.start, e.key.clone(), value_text.to_owned()));
                    match target(&e.key) {
                        Ok(target) => sets.push(Op {
                            path: e.key.clone(),
                            span: e.key_span.clone(),
                            target,
                            value: Some(e.node.clone()),
                        }),
                        Err(why) => s.report(p, &e.key_span, why.to_string()),
                    }
                }
            }
            _ => s.wrong_type(
                p,
                entry,
                "an inline table of overrides such as { \"hop.*.transport\" = \"pull\" }",
            ),
        }
    }
    let mut unsets = Vec::new();
    if let Some(entry) = s.get("unset") {
        match &entry.node.value {
            Value::Array(items) => {
                for item in items {
                    let Value::String(path) = &item.value else {
                        s.report(
                            p,
                            &item.span,
                            format!(
                                "expected paths (strings) in unset, got {}",
                                item.value.kind()
                            ),
                        );
                        continue;
                    };
                    echo.push((item.span.start, path.clone(), UNSET.to_owned()));
                    match target(path) {
                        Ok(target) => unsets.push(Op {
                            path: path.clone(),
                            span: item.span.clone(),
                            target,
                            value: None,
                        }),
                        Err(why) => s.report(p, &item.span, why.to_string()),
                    }
                }
            }
            _ => s.wrong_type(p, entry, "an array of paths"),
        }
    }
    echo.sort_by_key(|(at, _, _)| *at);
    Spec {
        name,
        prefix,
        echo: echo
            .into_iter()
            .map(|(_, path, value)| (path, value))
            .collect(),
        unsets,
        sets,
    }
}

/// Parses an override path such as `hop.*.transport`.
fn target(path: &str) -> Result<Target, OverrideError> {
    let segments: Vec<String> = path.split('.').map(str::to_owned).collect();
    let path = || path.to_owned();
    // `split` yields at least one part, so an empty path is an empty part.
    let Some((first, rest)) = segments
        .split_first()
        .filter(|_| !segments.iter().any(String::is_empty))
    else {
        return Err(OverrideError::EmptyPart { path: path() });
    };
    match first.as_str() {
        "launcher" if rest.is_empty() => Ok(Target::Launcher),
        "launcher" => Err(OverrideError::LauncherKey { path: path() }),
        "load" if rest.is_empty() => Err(OverrideError::LoadWithoutKey),
        "load" => Ok(Target::Load(rest.to_vec())),
        "broker" if rest.is_empty() => Err(OverrideError::BrokerWithoutKey { path: path() }),
        "broker" => Ok(Target::Broker(rest.to_vec())),
        "mesh" if rest.is_empty() => Err(OverrideError::MeshWithoutKey { path: path() }),
        "mesh" => Ok(Target::Mesh(rest.to_vec())),
        "hop" => match rest.split_first() {
            Some((_, keys)) if keys.first().is_some_and(|k| k == "name") => {
                Err(OverrideError::HopName { path: path() })
            }
            Some((selector, keys)) if !keys.is_empty() => Ok(Target::Hop {
                selector: selector.clone(),
                rest: keys.to_vec(),
            }),
            _ => Err(OverrideError::HopPath { path: path() }),
        },
        "seed" => Err(OverrideError::Seed),
        "check" | "report" | "telemetry" => Err(OverrideError::PerScenario {
            path: path(),
            section: first.clone(),
        }),
        "name" | "description" | "variant" => Err(OverrideError::Fixed {
            path: path(),
            key: first.clone(),
        }),
        _ => Err(OverrideError::UnknownSection {
            path: path(),
            section: first.clone(),
        }),
    }
}

/// The base tree with `spec`'s overrides applied: unsets first, then sets.
/// Paths that address nothing are reported, prefixed with the variant.
pub(super) fn apply(base: &Table, spec: &Spec, p: &mut Problems) -> Table {
    let mut tree = base.clone();
    for op in spec.unsets.iter().chain(&spec.sets) {
        if let Err(why) = apply_one(&mut tree, op) {
            p.at(op.span.start, format!("{}{why}", spec.prefix));
        }
    }
    tree
}

fn apply_one(tree: &mut Table, op: &Op) -> Result<(), OverrideError> {
    match &op.target {
        Target::Launcher => edit(tree, &["launcher".to_owned()], op),
        Target::Load(rest) => {
            let mut path = vec!["load".to_owned()];
            path.extend(rest.iter().cloned());
            edit(tree, &path, op)
        }
        Target::Broker(rest) => {
            let mut path = vec!["broker".to_owned()];
            path.extend(rest.iter().cloned());
            edit(tree, &path, op)
        }
        Target::Mesh(rest) => {
            let mut path = vec!["mesh".to_owned()];
            path.extend(rest.iter().cloned());
            edit(tree, &path, op)
        }
        Target::Hop { selector, rest } => {
            let hops = selected_hops(tree, selector);
            if hops.is_empty() {
                return Err(OverrideError::NoHopSelected {
                    selector: selector.clone(),
                    path: op.path.clone(),
                });
            }
            let mut done = false;
            for hop in hops {
                match edit(hop, rest, op) {
                    Ok(()) => done = true,
                    // `*` may cover hops that lack the key to unset.
                    Err(_) if op.value.is_none() && selector == "*" => {}
                    Err(why) => return Err(why),
                }
            }
            if done {
                Ok(())
            } else {
                Err(OverrideError::NoSelectedHopHasKey {
                    path: op.path.clone(),
                })
            }
        }
    }
}

/// The tables of the hops `selector` picks: `*`, a 0-based index or a name.
fn selected_hops<'t>(tree: &'t mut Table, selector: &str) -> Vec<&'t mut Table> {
    let index: Option<usize> = if selector.bytes().all(|b| b.is_ascii_digit()) {
        selector.parse().ok()
    } else {
        None
    };
    let Some(Entry {
        node: Node {
            value: Value::Array(items),
            ..
        },
        ..
    }) = tree.get_mut("hop")
    else {
        return Vec::new();
    };
    items
        .iter_mut()
        .enumerate()
        .filter_map(|(i, item)| match &mut item.value {
            Value::Table(table) => {
                let picked = if selector == "*" {
                    true
                } else if let Some(index) = index {
                    i == index
                } else {
                    matches!(table.get("name").map(|e| &e.node.value),
                             Some(Value::String(name)) if name == selector)
                };
                picked.then_some(table)
            }
            _ => None,
        })
        .collect()
}

/// Sets or removes `path` below `table`, creating missing tables on the way
/// (they take the override's place, so their problems point at it).
fn edit(table: &mut Table, path: &[String], op: &Op) -> Result<(), OverrideError> {
    let Some((last, parents)) = path.split_last() else {
        return Ok(());
    };
    let mut table = table;
    for (depth, segment) in parents.iter().enumerate() {
        if table.get(segment).is_none() {
            if op.value.is_none() {
                return Err(OverrideError::NoSuchKey {
                    path: op.path.clone(),
                });
            }
            table.entries.push(Entry {
                key: segment.clone(),
                key_span: op.span.clone(),
                node: Node {
                    span: op.span.clone(),
                    value: Value::Table(Table::default()),
                },
            });
        }
        let Some(entry) = table.get_mut(segment) else {
            return Err(OverrideError::CannotSet {
                path: op.path.clone(),
            });
        };
        table = match &mut entry.node.value {
            Value::Table(t) => t,
            other => {
                return Err(OverrideError::NotATable {
                    setting: op.value.is_some(),
                    path: op.path.clone(),
                    parent: parents[..=depth].join("."),
                    kind: other.kind(),
                });
            }
        };
    }
    match &op.value {
        Some(value) => {
            table.set(Entry {
                key: last.clone(),
                key_span: op.span.clone(),
                node: value.clone(),
            });
            Ok(())
        }
        None if table.remove(last) => Ok(()),
        None => Err(OverrideError::NoSuchKey {
            path: op.path.clone(),
        }),
    }
}

/// `[sweep]` as read: the key, and each value with where it is written.
pub(super) struct SweepSpec {
    /// `"hops"` or an override path.
    pub key: String,
    /// `None` for `"hops"`; the override target otherwise.
    target: Option<Target>,
    /// The values and their spans.
    pub values: Vec<Node>,
    /// The values as TOML text, for names and the model.
    pub texts: Vec<String>,
}

/// Most values a sweep may have: each one runs every variant once more.
const MAX_SWEEP_VALUES: usize = 64;

/// Reads `[sweep]`: `key` and either `values = [...]` or integer `from`,
/// `to` (inclusive) and optional `step`. `None` when absent or broken
/// (reported).
pub(super) fn read_sweep(root: &Table, source: &str, p: &mut Problems) -> Option<SweepSpec> {
    let entry = root.get("sweep")?;
    let Value::Table(table) = &entry.node.value else {
        p.at(
            entry.node.span.start,
            format!(
                "expected a table for sweep, got {}",
                entry.node.value.kind()
            ),
        );
        return None;
    };
    let s = Section {
        table,
        span: entry.node.span.clone(),
        prefix: String::new(),
        path: "sweep".to_owned(),
        label: "[sweep]".to_owned(),
    };
    s.unknown_keys(p, &["key", "values", "from", "to", "step"]);
    let (key, key_entry) = s.required(p, "key", Section::string)?;
    let target = if key == "hops" {
        None
    } else {
        match target(key) {
            Ok(t) => Some(t),
            Err(why) => {
                s.report(p, &key_entry.node.span, why.to_string());
                return None;
            }
        }
    };
    let values: Vec<Node> = match (s.get("values"), s.get("from")) {
        (Some(_), Some(from)) => {
            s.report(p, &from.key_span, "give either values or from/to, not both");
            return None;
        }
        (Some(values), None) => match &values.node.value {
            Value::Array(items) => items.clone(),
            other => {
                s.report(
                    p,
                    &values.node.span,
                    format!("expected an array of values, got {}", other.kind()),
                );
                return None;
            }
        },
        (None, Some(_)) => {
            let from = s.int_in(p, "from", 0, 1_000_000)?;
            let to = s.required(p, "to", |s, p, k| s.int_in(p, k, 0, 1_000_000))?;
            let step = match s.get("step") {
                None => 1,
                Some(_) => s.int_in(p, "step", 1, 1_000_000)?,
            };
            if to < from {
                s.forbid(
                    p,
                    "to",
                    &format!("must not be below from ({from}), got {to}"),
                );
                return None;
            }
            let span = s
                .get("from")
                .map(|e| e.node.span.clone())
                .unwrap_or_default();
            (from..=to)
                .step_by(step as usize)
                .map(|v| Node {
                    span: span.clone(),
                    value: Value::Integer(v),
                })
                .collect()
        }
        (None, None) => {
            s.report(
                p,
                &entry.node.span,
                "[sweep] needs values = [...] or from/to",
            );
            return None;
        }
    };
    if values.is_empty() {
        let at = s.get("values").map_or(&entry.node.span, |v| &v.node.span);
        s.report(
            p,
            at,
            "the sweep has no values: sweeping over an empty list runs nothing",
        );
        return None;
    }
    if values.len() > MAX_SWEEP_VALUES {
        s.report(
            p,
            &entry.node.span,
            format!(
                "a sweep takes at most {MAX_SWEEP_VALUES} values, got {}",
                values.len()
            ),
        );
        return None;
    }
    let texts = values
        .iter()
        .map(|v| match &v.value {
            Value::Integer(i) => i.to_string(),
            _ => source.get(v.span.clone()).unwrap_or_default().to_owned(),
        })
        .collect();
    Some(SweepSpec {
        key: key.to_owned(),
        target,
        values,
        texts,
    })
}

/// `tree` with sweep value `i` applied; a problem is reported at the value.
pub(super) fn apply_sweep(
    tree: &Table,
    sweep: &SweepSpec,
    i: usize,
    prefix: &str,
    p: &mut Problems,
) -> Option<Table> {
    let value = &sweep.values[i];
    let mut tree = tree.clone();
    let outcome = match &sweep.target {
        None => truncate_hops(&mut tree, value),
        Some(target) => {
            let op = Op {
                path: sweep.key.clone(),
                span: value.span.clone(),
                target: target.clone(),
                value: Some(value.clone()),
            };
            apply_one(&mut tree, &op)
        }
    };
    match outcome {
        Ok(()) => Some(tree),
        Err(why) => {
            p.at(
                value.span.start,
                format!("{prefix}sweep value {}: {why}", sweep.texts[i]),
            );
            None
        }
    }
}

/// Keeps the first n `[[hop]]` tables: a chain of n hops.
fn truncate_hops(tree: &mut Table, n: &Node) -> Result<(), OverrideError> {
    let Value::Integer(n) = n.value else {
        return Err(OverrideError::HopsNotWhole {
            kind: n.value.kind(),
        });
    };
    let Some(Value::Array(hops)) = tree.get_mut("hop").map(|e| &mut e.node.value) else {
        return Err(OverrideError::NoHops);
    };
    match usize::try_from(n) {
        Ok(n) if (1..=hops.len()).contains(&n) => {
            hops.truncate(n);
            Ok(())
        }
        _ => Err(OverrideError::HopsOutOfRange {
            declared: hops.len(),
            n,
        }),
    }
}

/// A DNS-label-safe rendering of a sweep key's last segment and a value:
/// `("hop.*.slow.probability", "0.05")` -> `probability-0-05`.
pub(super) fn sweep_suffix(key: &str, value: &str) -> String {
    let last = key.rsplit('.').next().unwrap_or(key);
    let mut out = String::new();
    for c in format!("{last}-{value}").chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches('-').to_owned()
}
