//! `[broker]`: which broker pull hops go through, and how many tasks and
//! bytes each pulled hop's queue holds.

use tailmesh_services::model::{BrokerKind, QueueBounds};

use super::error::Problems;
use super::read::Section;

const BROKER_KEYS: &[&str] = &["kind", "queue_capacity", "queue_bytes"];

/// The most tasks `queue_capacity` may name.
pub(super) const MAX_QUEUE_CAPACITY: i64 = 10_000_000;
/// The least bytes `queue_bytes` may name: tailmesh's broker's largest
/// payload (4 MiB), so any payload it accepts fits an empty queue.
pub(super) const MIN_QUEUE_BYTES: i64 = 4 * 1024 * 1024;
/// The most bytes `queue_bytes` may name: 64 GiB, more than a broker
/// holding its queues in memory should be given.
pub(super) const MAX_QUEUE_BYTES: i64 = 64 * 1024 * 1024 * 1024;

/// `[broker]` as read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Broker {
    /// Which broker pull hops go through.
    pub(super) kind: BrokerKind,
    /// How much each pulled hop's queue holds, whichever the broker.
    pub(super) bounds: QueueBounds,
}

/// Reads `[broker]`: `kind` = `"tailmesh"` (the default) | `"rabbitmq"` |
/// `"nats"`; `queue_capacity` (tasks, 1 to 10,000,000, default 10,000) and
/// `queue_bytes` (4 MiB to 64 GiB, default 64 MiB).
pub(super) fn broker(s: &Section<'_>, p: &mut Problems) -> Option<Broker> {
    s.unknown_keys(p, BROKER_KEYS);
    let capacity = match s.get("queue_capacity") {
        None => Some(QueueBounds::DEFAULT_CAPACITY),
        Some(_) => s
            .int_in(p, "queue_capacity", 1, MAX_QUEUE_CAPACITY)
            .and_then(|c| u32::try_from(c).ok()),
    };
    let bytes = match s.get("queue_bytes") {
        None => Some(QueueBounds::DEFAULT_BYTES),
        Some(_) => s
            .int_in(p, "queue_bytes", MIN_QUEUE_BYTES, MAX_QUEUE_BYTES)
            .and_then(|b| u64::try_from(b).ok()),
    };
    let kind = match s.get("kind") {
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
    };
    Some(Broker {
        kind: kind?,
        bounds: QueueBounds {
            capacity: capacity?,
            bytes: bytes?,
        },
    })
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
