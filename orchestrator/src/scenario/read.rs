//! A small reader over one table of the tree: typed getters that report a
//! problem (with the value's place) instead of stopping, so a single pass
//! finds every problem in the file.

use std::time::Duration;

use super::error::Problems;
use super::tree::{Entry, Node, Span, Table, Value};

/// One table being read, with the words used to name it in messages.
pub(super) struct Section<'a> {
    pub table: &'a Table,
    /// Where "missing key" problems point: the table's header or value.
    pub span: Span,
    /// Starts every value message, e.g. `hop "b": `.
    pub prefix: String,
    /// Dotted path of the table, prepended to key names, e.g. `load.`.
    pub path: String,
    /// How the table is named in key messages, e.g. `[load]`.
    pub label: String,
}

impl<'a> Section<'a> {
    /// The full name of `key` in messages, e.g. `load.rate`.
    pub(super) fn name(&self, key: &str) -> String {
        format!("{}{}", self.path, key)
    }

    /// A nested table section for the value of `entry`, which must be a table.
    pub(super) fn child(&self, entry: &'a Entry, table: &'a Table) -> Section<'a> {
        let name = self.name(&entry.key);
        let label = if self.prefix.is_empty() {
            format!("[{name}]")
        } else {
            format!("{name} of {}", self.prefix.trim_end_matches([':', ' ']))
        };
        Section {
            table,
            span: entry.node.span.clone(),
            prefix: self.prefix.clone(),
            path: format!("{name}."),
            label,
        }
    }

    pub(super) fn get(&self, key: &str) -> Option<&'a Entry> {
        self.table.get(key)
    }

    /// A problem at `span`, prefixed with the section's context.
    pub(super) fn report(&self, p: &mut Problems, span: &Span, message: impl AsRef<str>) {
        p.at(span.start, format!("{}{}", self.prefix, message.as_ref()));
    }

    /// Reports every key not in `known`.
    pub(super) fn unknown_keys(&self, p: &mut Problems, known: &[&str]) {
        for entry in &self.table.entries {
            if !known.contains(&entry.key.as_str()) {
                p.at(
                    entry.key_span.start,
                    format!(
                        "unknown key \"{}\" in {} (expected one of: {})",
                        entry.key,
                        self.label,
                        known.join(", ")
                    ),
                );
            }
        }
    }

    /// Reports that `key` is required but absent, at the table.
    pub(super) fn missing(&self, p: &mut Problems, key: &str) {
        p.at(
            self.span.start,
            format!("missing required key \"{key}\" in {}", self.label),
        );
    }

    /// Reports `entry` as having the wrong type; `expected` has its article.
    pub(super) fn wrong_type(&self, p: &mut Problems, entry: &Entry, expected: &str) {
        if !matches!(entry.node.value, Value::Invalid) {
            self.report(
                p,
                &entry.node.span,
                format!(
                    "expected {expected} for {}, got {}",
                    self.name(&entry.key),
                    entry.node.value.kind()
                ),
            );
        }
    }

    /// Reports `key` if present: it is not allowed here, for `reason`.
    pub(super) fn forbid(&self, p: &mut Problems, key: &str, reason: &str) {
        if let Some(entry) = self.get(key) {
            self.report(p, &entry.key_span, format!("{} {reason}", self.name(key)));
        }
    }

    /// Like the getters below, but reporting a missing key.
    pub(super) fn required<T>(
        &self,
        p: &mut Problems,
        key: &str,
        get: impl FnOnce(&Self, &mut Problems, &str) -> Option<T>,
    ) -> Option<T> {
        if self.get(key).is_none() {
            self.missing(p, key);
            return None;
        }
        get(self, p, key)
    }

    pub(super) fn string(&self, p: &mut Problems, key: &str) -> Option<(&'a str, &'a Entry)> {
        let entry = self.get(key)?;
        match &entry.node.value {
            Value::String(s) => Some((s.as_str(), entry)),
            _ => {
                self.wrong_type(p, entry, "a string");
                None
            }
        }
    }

    pub(super) fn boolean(&self, p: &mut Problems, key: &str) -> Option<bool> {
        let entry = self.get(key)?;
        match entry.node.value {
            Value::Boolean(b) => Some(b),
            _ => {
                self.wrong_type(p, entry, "a boolean (true or false)");
                None
            }
        }
    }

    pub(super) fn integer(&self, p: &mut Problems, key: &str) -> Option<(i64, &'a Entry)> {
        let entry = self.get(key)?;
        match entry.node.value {
            Value::Integer(i) => Some((i, entry)),
            _ => {
                self.wrong_type(p, entry, "an integer");
                None
            }
        }
    }

    /// An integer in `lo..=hi`.
    pub(super) fn int_in(&self, p: &mut Problems, key: &str, lo: i64, hi: i64) -> Option<i64> {
        let (value, entry) = self.integer(p, key)?;
        if (lo..=hi).contains(&value) {
            Some(value)
        } else {
            self.report(
                p,
                &entry.node.span,
                format!(
                    "{} must be between {lo} and {hi}, got {value}",
                    self.name(key)
                ),
            );
            None
        }
    }

    /// An integer of at least `lo`.
    pub(super) fn int_min(&self, p: &mut Problems, key: &str, lo: i64) -> Option<i64> {
        let (value, entry) = self.integer(p, key)?;
        if value >= lo {
            Some(value)
        } else {
            self.report(
                p,
                &entry.node.span,
                format!("{} must be at least {lo}, got {value}", self.name(key)),
            );
            None
        }
    }

    /// An integer or a float.
    pub(super) fn number(&self, p: &mut Problems, key: &str) -> Option<(f64, &'a Entry)> {
        let entry = self.get(key)?;
        match entry.node.value {
            // Precision loss above 2^53 is irrelevant for the ranges we accept.
            #[allow(clippy::cast_precision_loss)]
            Value::Integer(i) => Some((i as f64, entry)),
            Value::Float(f) => Some((f, entry)),
            _ => {
                self.wrong_type(p, entry, "a number");
                None
            }
        }
    }

    /// A number in `lo..=hi` (finite); `lo_open` excludes `lo` itself.
    pub(super) fn number_in(
        &self,
        p: &mut Problems,
        key: &str,
        lo: f64,
        lo_open: bool,
        hi: f64,
    ) -> Option<f64> {
        let (value, entry) = self.number(p, key)?;
        let above = if lo_open { value > lo } else { value >= lo };
        if above && value <= hi {
            Some(value)
        } else {
            let range = if lo_open {
                format!("greater than {lo} and at most {hi}")
            } else {
                format!("between {lo} and {hi}")
            };
            self.report(
                p,
                &entry.node.span,
                format!("{} must be {range}, got {value}", self.name(key)),
            );
            None
        }
    }

    /// A probability in [0, 1].
    pub(super) fn probability(&self, p: &mut Problems, key: &str) -> Option<f64> {
        self.number_in(p, key, 0.0, false, 1.0)
    }

    /// A duration string such as "20ms".
    pub(super) fn duration(&self, p: &mut Problems, key: &str) -> Option<(Duration, &'a Entry)> {
        let entry = self.get(key)?;
        match duration_of(&entry.node) {
            Ok(d) => Some((d, entry)),
            Err(DurationProblem::AlreadyReported) => None,
            Err(problem) => {
                self.report(p, &entry.node.span, problem.message(&self.name(key)));
                None
            }
        }
    }

    /// A duration greater than zero.
    pub(super) fn positive_duration(&self, p: &mut Problems, key: &str) -> Option<Duration> {
        let (d, entry) = self.duration(p, key)?;
        if d.is_zero() {
            self.report(
                p,
                &entry.node.span,
                format!("{} must be greater than 0", self.name(key)),
            );
            return None;
        }
        Some(d)
    }

    /// One of the named `options`.
    pub(super) fn choice<T: Copy>(
        &self,
        p: &mut Problems,
        key: &str,
        options: &[(&str, T)],
    ) -> Option<T> {
        let (value, entry) = self.string(p, key)?;
        match options.iter().find(|(name, _)| *name == value) {
            Some((_, t)) => Some(*t),
            None => {
                let names: Vec<String> = options.iter().map(|(n, _)| format!("\"{n}\"")).collect();
                self.report(
                    p,
                    &entry.node.span,
                    format!(
                        "{} must be one of {}, got \"{value}\"",
                        self.name(key),
                        names.join(", ")
                    ),
                );
                None
            }
        }
    }
}

/// `None` if `key` is absent, `Some(None)` if it is not a table (reported).
pub(super) fn table_section<'a>(
    parent: &Section<'a>,
    p: &mut Problems,
    key: &str,
) -> Option<Option<Section<'a>>> {
    let entry = parent.get(key)?;
    match &entry.node.value {
        Value::Table(table) => Some(Some(parent.child(entry, table))),
        _ => {
            parent.wrong_type(p, entry, "a table");
            Some(None)
        }
    }
}

/// Why a value is not a duration.
pub(super) enum DurationProblem {
    WrongType(&'static str),
    Negative(String),
    Invalid(String, String),
    AlreadyReported,
}

impl DurationProblem {
    /// The message for the value named `name`.
    pub(super) fn message(&self, name: &str) -> String {
        match self {
            DurationProblem::WrongType(got) => {
                format!("expected a duration string such as \"20ms\" for {name}, got {got}")
            }
            DurationProblem::Negative(s) => format!("negative duration \"{s}\" for {name}"),
            DurationProblem::Invalid(s, why) => {
                format!("invalid duration \"{s}\" for {name}: {why}")
            }
            DurationProblem::AlreadyReported => String::new(),
        }
    }
}

/// Parses a duration string with humantime ("250us", "20ms", "1.5s", "2m").
pub(super) fn duration_of(node: &Node) -> Result<Duration, DurationProblem> {
    match &node.value {
        Value::String(s) => {
            let trimmed = s.trim();
            if trimmed.starts_with('-') {
                Err(DurationProblem::Negative(s.clone()))
            } else {
                humantime::parse_duration(trimmed)
                    .map_err(|e| DurationProblem::Invalid(s.clone(), e.to_string()))
            }
        }
        Value::Invalid => Err(DurationProblem::AlreadyReported),
        other => Err(DurationProblem::WrongType(other.kind())),
    }
}

/// Whether `name` is a DNS label: 1 to 63 of [a-z0-9-], no '-' at either end.
pub(crate) fn is_dns_label(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// The message for a name that is not a DNS label.
pub(super) fn dns_label_problem(what: &str, name: &str) -> String {
    format!(
        "{what} \"{name}\" is not a DNS label: use 1 to 63 lowercase letters, digits and '-', \
         not starting or ending with '-'"
    )
}
