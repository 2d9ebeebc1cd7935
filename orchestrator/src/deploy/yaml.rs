//! Just enough YAML to write Compose files and Kubernetes manifests that
//! read like hand-written ones: block maps and sequences, flow sequences
//! for commands, literal blocks for embedded files, and quoting wherever a
//! plain scalar could be misread (numbers, booleans, `: `, `#`).

/// A YAML value.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Node {
    /// A string, quoted when a plain scalar would be misread.
    Str(String),
    /// Written as is: numbers, booleans, aliases such as `*tailmesh`.
    Raw(String),
    /// A multi-line string, written as a literal block (`|`).
    Block(String),
    /// A block sequence.
    Seq(Vec<Node>),
    /// A flow sequence of scalars on one line: `[a, b, "c d"]`.
    Flow(Vec<Node>),
    /// A block map, keys in order.
    Map(Vec<(String, Node)>),
    /// A map with an anchor: `key: &name` and the map below.
    Anchored(String, Vec<(String, Node)>),
}

/// A string node.
pub(super) fn s(text: impl Into<String>) -> Node {
    Node::Str(text.into())
}

/// A map node from `(key, value)` pairs.
pub(super) fn map<K: Into<String>>(entries: impl IntoIterator<Item = (K, Node)>) -> Node {
    Node::Map(entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
}

/// A flow sequence of strings.
pub(super) fn flow<T: Into<String>>(items: impl IntoIterator<Item = T>) -> Node {
    Node::Flow(items.into_iter().map(|t| Node::Str(t.into())).collect())
}

/// Renders `node` (a map) as a YAML document, without the `---` marker.
pub(super) fn render(node: &Node) -> String {
    let mut out = String::new();
    match node {
        Node::Map(entries) => write_map(&mut out, entries, 0),
        other => {
            write_inline(&mut out, other, 0);
            out.push('\n');
        }
    }
    out
}

fn write_map(out: &mut String, entries: &[(String, Node)], indent: usize) {
    for (key, value) in entries {
        out.push_str(&" ".repeat(indent));
        write_key(out, key);
        out.push(':');
        write_value(out, value, indent);
    }
}

/// After `key:` or `- `: the value, inline or on the lines below.
fn write_value(out: &mut String, value: &Node, indent: usize) {
    match value {
        Node::Map(entries) if !entries.is_empty() => {
            out.push('\n');
            write_map(out, entries, indent + 2);
        }
        Node::Anchored(anchor, entries) => {
            out.push_str(" &");
            out.push_str(anchor);
            out.push('\n');
            write_map(out, entries, indent + 2);
        }
        Node::Seq(items) if !items.is_empty() => {
            out.push('\n');
            write_seq(out, items, indent + 2);
        }
        other => {
            out.push(' ');
            write_inline(out, other, indent);
            out.push('\n');
        }
    }
}

fn write_seq(out: &mut String, items: &[Node], indent: usize) {
    for item in items {
        out.push_str(&" ".repeat(indent));
        out.push('-');
        match item {
            Node::Map(entries) if !entries.is_empty() => {
                // The first entry on the dash's line, the rest below it.
                let mut first = String::new();
                write_map(&mut first, entries, indent + 2);
                out.push(' ');
                out.push_str(first.trim_start());
            }
            other => write_value(out, other, indent),
        }
    }
}

/// Scalars, flow sequences, empty collections and literal blocks.
fn write_inline(out: &mut String, node: &Node, indent: usize) {
    match node {
        Node::Str(text) => write_str(out, text),
        Node::Raw(text) => out.push_str(text),
        Node::Flow(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_inline(out, item, indent);
            }
            out.push(']');
        }
        Node::Map(_) | Node::Anchored(..) => out.push_str("{}"),
        Node::Seq(_) => out.push_str("[]"),
        Node::Block(text) => write_block(out, text, indent + 2),
    }
}

/// `|` (or `|-` without a final newline) and the lines, indented; an
/// explicit indentation indicator when the first line starts with a space.
fn write_block(out: &mut String, text: &str, indent: usize) {
    out.push('|');
    if text.lines().next().is_some_and(|l| l.starts_with(' ')) {
        out.push('2');
    }
    if !text.ends_with('\n') {
        out.push('-');
    }
    for line in text.lines() {
        out.push('\n');
        if !line.is_empty() {
            out.push_str(&" ".repeat(indent));
            out.push_str(line);
        }
    }
}

fn write_key(out: &mut String, key: &str) {
    if key == "<<" {
        out.push_str(key);
    } else {
        write_str(out, key);
    }
}

fn write_str(out: &mut String, text: &str) {
    if plain_is_safe(text) {
        out.push_str(text);
    } else {
        // A JSON string is a valid YAML double-quoted scalar.
        out.push_str(&serde_json::Value::String(text.to_owned()).to_string());
    }
}

/// Whether `text` reads back as the same string when written plain, in
/// block and flow context alike.
fn plain_is_safe(text: &str) -> bool {
    let Some(first) = text.chars().next() else {
        return false;
    };
    // '-' starts a plain scalar when a non-space follows ("--listen").
    let special_start = "?:,[]{}#&*!|>'\"%@`~ ".contains(first)
        || (first == '-' && text[1..].chars().next().is_none_or(|c| c == ' '));
    // YAML 1.1 readers take 16686:16686 for a base-60 number.
    let numeric_looking = text
        .chars()
        .all(|c| c.is_ascii_digit() || ":._".contains(c));
    let looks_like_other_type = text.parse::<f64>().is_ok()
        || matches!(
            text.to_ascii_lowercase().as_str(),
            "true" | "false" | "yes" | "no" | "on" | "off" | "null" | "y" | "n" | ".inf" | ".nan"
        )
        || text.starts_with("0x")
        || text.starts_with("0o");
    let safe_chars = text
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_./:=@+".contains(c));
    !special_start
        && !numeric_looking
        && !looks_like_other_type
        && safe_chars
        && !text.contains(": ")
        && !text.ends_with(':')
        && !text.contains(" #")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_sequences_and_blocks_render_as_written_by_hand() {
        let doc = map([
            ("name", s("tailmesh-default")),
            (
                "x-base",
                Node::Anchored("base".into(), vec![("image".into(), s("tailmesh:latest"))]),
            ),
            (
                "services",
                map([(
                    "hop-a-0",
                    map([
                        ("<<", Node::Raw("*base".into())),
                        ("command", flow(["hop", "--replica", "0"])),
                        ("depends_on", map(Vec::<(String, Node)>::new())),
                        (
                            "ports",
                            Node::Seq(vec![s("16686:16686"), map([("name", s("grpc"))])]),
                        ),
                    ]),
                )]),
            ),
            ("content", Node::Block("a = 1\n# note: yes\n".into())),
        ]);
        assert_eq!(
            render(&doc),
            "name: tailmesh-default\n\
             x-base: &base\n  image: tailmesh:latest\n\
             services:\n  hop-a-0:\n    <<: *base\n    command: [hop, --replica, \"0\"]\n    \
             depends_on: {}\n    ports:\n      - \"16686:16686\"\n      - name: grpc\n\
             content: |\n  a = 1\n  # note: yes\n"
        );
    }

    #[test]
    fn scalars_that_would_read_back_differently_are_quoted() {
        for (text, written) in [
            ("0", "\"0\""),
            ("1.5", "\"1.5\""),
            ("true", "\"true\""),
            ("no", "\"no\""),
            ("", "\"\""),
            ("a: b", "\"a: b\""),
            ("-", "\"-\""),
            ("-x", "-x"),
            ("16686:16686", "\"16686:16686\""),
            ("*x", "\"*x\""),
            ("x #y", "\"x #y\""),
            ("say \"hi\"", "\"say \\\"hi\\\"\""),
            ("http://jaeger:4317", "http://jaeger:4317"),
            ("0.0.0.0:7000", "\"0.0.0.0:7000\""),
            ("hop-a-0:7000", "hop-a-0:7000"),
            ("--scenario", "--scenario"),
        ] {
            let mut out = String::new();
            write_str(&mut out, text);
            assert_eq!(out, written, "{text:?}");
        }
    }

    #[test]
    fn blocks_keep_leading_spaces_and_the_missing_final_newline() {
        let mut out = String::new();
        write_block(&mut out, "  indented\nlast", 2);
        assert_eq!(out, "|2-\n    indented\n  last");
    }
}
