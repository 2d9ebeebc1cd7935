//! The scenario document as an owned tree whose every key and value keeps
//! its byte span, so that validation can point at the exact place of each
//! problem. Variants edit a copy of this tree before it is validated.

use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::error::Problems;

/// A byte range in the source.
pub(super) type Span = Range<usize>;

/// A value and where it is written.
#[derive(Clone, Debug)]
pub(super) struct Node {
    /// The value's text, or the header of a `[table]`.
    pub span: Span,
    pub value: Value,
}

/// A TOML value.
#[derive(Clone, Debug)]
pub(super) enum Value {
    String(String),
    Integer(i64),
    Float(f64),
    Boolean(bool),
    Datetime,
    Array(Vec<Node>),
    Table(Table),
    /// A value already reported as broken (an integer out of range); readers
    /// skip it without a second message.
    Invalid,
}

impl Value {
    /// The type with an article, for messages: "got a string".
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Value::String(_) => "a string",
            Value::Integer(_) => "an integer",
            Value::Float(_) => "a float",
            Value::Boolean(_) => "a boolean",
            Value::Datetime => "a datetime",
            Value::Array(_) => "an array",
            Value::Table(_) => "a table",
            Value::Invalid => "an invalid value",
        }
    }
}

/// A table whose entries are in source order.
#[derive(Clone, Debug, Default)]
pub(super) struct Table {
    pub entries: Vec<Entry>,
}

/// One `key = value` of a table.
#[derive(Clone, Debug)]
pub(super) struct Entry {
    pub key: String,
    pub key_span: Span,
    pub node: Node,
}

impl Table {
    pub(super) fn get(&self, key: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.key == key)
    }

    pub(super) fn get_mut(&mut self, key: &str) -> Option<&mut Entry> {
        self.entries.iter_mut().find(|e| e.key == key)
    }

    /// Removes `key`; whether it was there.
    pub(super) fn remove(&mut self, key: &str) -> bool {
        let before = self.entries.len();
        self.entries.retain(|e| e.key != key);
        self.entries.len() != before
    }

    /// Replaces the entry with the same key, or appends it.
    pub(super) fn set(&mut self, entry: Entry) {
        match self.get_mut(&entry.key) {
            Some(existing) => *existing = entry,
            None => self.entries.push(entry),
        }
    }
}

/// Converts toml's spanned document; integers that do not fit an `i64`
/// are reported here and become [`Value::Invalid`].
pub(super) fn from_document(doc: &DeTable<'_>, problems: &mut Problems) -> Table {
    table(doc, problems)
}

fn table(de: &DeTable<'_>, problems: &mut Problems) -> Table {
    let mut entries: Vec<Entry> = de
        .iter()
        .map(|(key, value)| Entry {
            key: key.get_ref().to_string(),
            key_span: key.span(),
            node: node(value, problems),
        })
        .collect();
    // toml keeps keys sorted by name; source order makes messages and
    // variant echoes read like the file.
    entries.sort_by_key(|e| e.key_span.start);
    Table { entries }
}

fn node(de: &Spanned<DeValue<'_>>, problems: &mut Problems) -> Node {
    let span = de.span();
    let value = match de.get_ref() {
        DeValue::String(s) => Value::String(s.to_string()),
        DeValue::Integer(i) => match i64::from_str_radix(i.as_str(), i.radix()) {
            Ok(v) => Value::Integer(v),
            Err(_) => {
                problems.at(span.start, format!("integer {i} does not fit in 64 bits"));
                Value::Invalid
            }
        },
        DeValue::Float(f) => match f.as_str().parse::<f64>() {
            Ok(v) => Value::Float(v),
            Err(_) => {
                problems.at(span.start, format!("invalid float {f}"));
                Value::Invalid
            }
        },
        DeValue::Boolean(b) => Value::Boolean(*b),
        DeValue::Datetime(_) => Value::Datetime,
        DeValue::Array(items) => Value::Array(items.iter().map(|v| node(v, problems)).collect()),
        DeValue::Table(t) => Value::Table(table(t, problems)),
    };
    Node { span, value }
}
