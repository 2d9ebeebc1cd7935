//! `[broker]`: which broker pull hops go through.

use tailmesh_services::model::BrokerKind;

use super::error::Problems;
use super::read::Section;

const BROKER_KEYS: &[&str] = &["kind"];

/// Reads `[broker]`: `kind` = `"tailmesh"` (the default) | `"rabbitmq"` |
/// `"nats"`.
pub(super) fn broker(s: &Section<'_>, p: &mut Problems) -> Option<BrokerKind> {
    s.unknown_keys(p, BROKER_KEYS);
    match s.get("kind") {
        None => Some(BrokerKind::default()),
        Some(_) => s.choice(
            p,
            "kind",
            &[
                ("tailmesh", BrokerKind::Tailmesh),
                ("rabbitmq", BrokerKind::Rabbitmq),
                ("nats", BrokerKind::Nats),
            ],
        ),
    }
}

#[cfg(test)]
mod tests {
    use tailmesh_services::model::BrokerKind;

    use crate::scenario::parse;

    const BASE: &str = r#"
name = "b"
[load]
mode = "closed"
concurrency = 1
requests = 10
[[hop]]
name = "a"
transport = "pull"
"#;

    fn kinds(text: &str) -> Vec<(String, BrokerKind)> {
        let scenario = parse(text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
        scenario
            .variants
            .into_iter()
            .map(|v| (v.name, v.broker))
            .collect()
    }

    fn problems(text: &str) -> String {
        match parse(text, "t.toml") {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn the_broker_is_tailmeshs_unless_the_file_or_a_variant_names_another() {
        assert_eq!(kinds(BASE), [("base".to_owned(), BrokerKind::Tailmesh)]);
        let file = format!("{BASE}[broker]\nkind = \"nats\"\n");
        assert_eq!(kinds(&file), [("base".to_owned(), BrokerKind::Nats)]);
        let variants = format!(
            "{BASE}[[variant]]\nname = \"t\"\n[[variant]]\nname = \"r\"\nset = {{ \"broker.kind\" = \"rabbitmq\" }}\n"
        );
        assert_eq!(
            kinds(&variants),
            [
                ("t".to_owned(), BrokerKind::Tailmesh),
                ("r".to_owned(), BrokerKind::Rabbitmq)
            ]
        );
    }

    #[test]
    fn an_unknown_kind_key_or_path_is_reported_where_it_is_written() {
        let kind = problems(&format!("{BASE}[broker]\nkind = \"kafka\"\n"));
        assert!(
            kind.contains("t.toml:11:8") && kind.contains("\"kafka\""),
            "{kind}"
        );
        let key = problems(&format!("{BASE}[broker]\nport = 1\n"));
        assert!(key.contains("port"), "{key}");
        let path = problems(&format!(
            "{BASE}[[variant]]\nname = \"v\"\nset = {{ \"broker\" = \"nats\" }}\n"
        ));
        assert!(path.contains("must name a key of [broker]"), "{path}");
        let value = problems(&format!(
            "{BASE}[[variant]]\nname = \"v\"\nset = {{ \"broker.kind\" = \"kafka\" }}\n"
        ));
        assert!(
            value.contains("variant \"v\"") && value.contains("kafka"),
            "{value}"
        );
    }
}
