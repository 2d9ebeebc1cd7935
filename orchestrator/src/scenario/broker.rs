//! `[broker]`: which broker pull hops go through, and how many tasks and
//! bytes each pulled hop's queue holds.

use tailmesh_services::{
    limits::MAX_CALL_MESSAGE_BYTES,
    model::{BrokerKind, QueueBounds},
};

use super::error::Problems;
use super::read::Section;

const BROKER_KEYS: &[&str] = &["kind", "queue_capacity", "queue_bytes"];

/// The most tasks `queue_capacity` may name.
pub(super) const MAX_QUEUE_CAPACITY: i64 = 10_000_000;
/// The least bytes `queue_bytes` may name: the largest task tailmesh's
/// broker accepts (a whole hop message, 4 MiB of payload and 64 KiB for
/// the rest), so any task fits an empty queue.
pub(super) const MIN_QUEUE_BYTES: i64 = MAX_CALL_MESSAGE_BYTES as i64;
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
/// `queue_bytes` (5,242,880 to 64 GiB, default 64 MiB).
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
    use tailmesh_services::model::{BrokerKind, QueueBounds};

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

    fn bounds(text: &str) -> Vec<(String, QueueBounds)> {
        let scenario = parse(text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
        scenario
            .variants
            .into_iter()
            .map(|v| (v.name, v.queue_bounds))
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
    fn queue_bounds_default_to_tailmeshs_brokers_and_are_read_and_overridden() {
        let default = QueueBounds {
            capacity: 10_000,
            bytes: 64 * 1024 * 1024,
        };
        assert_eq!(QueueBounds::default(), default);
        assert_eq!(bounds(BASE), [("base".to_owned(), default)]);
        let file = format!(
            "{BASE}[broker]\nkind = \"rabbitmq\"\nqueue_capacity = 5\nqueue_bytes = 6000000\n"
        );
        assert_eq!(
            bounds(&file),
            [(
                "base".to_owned(),
                QueueBounds {
                    capacity: 5,
                    bytes: 6_000_000
                }
            )]
        );
        let variants = format!(
            "{BASE}[broker]\nqueue_capacity = 7\n[[variant]]\nname = \"file\"\n[[variant]]\nname = \"set\"\nset = {{ \"broker.queue_capacity\" = 3, \"broker.queue_bytes\" = 8388608 }}\n[[variant]]\nname = \"unset\"\nunset = [\"broker.queue_capacity\"]\n"
        );
        assert_eq!(
            bounds(&variants),
            [
                (
                    "file".to_owned(),
                    QueueBounds {
                        capacity: 7,
                        ..default
                    }
                ),
                (
                    "set".to_owned(),
                    QueueBounds {
                        capacity: 3,
                        bytes: 8 * 1024 * 1024
                    }
                ),
                ("unset".to_owned(), default),
            ]
        );
    }

    #[test]
    fn zero_absurd_or_mistyped_queue_bounds_are_reported_where_they_are_written() {
        for (line, at) in [
            ("queue_capacity = 0", "t.toml:11:18"),
            ("queue_capacity = 10000001", "t.toml:11:18"),
            ("queue_capacity = -1", "t.toml:11:18"),
            ("queue_bytes = 0", "t.toml:11:15"),
            ("queue_bytes = 5242879", "t.toml:11:15"),
            ("queue_bytes = 68719476737", "t.toml:11:15"),
        ] {
            let problem = problems(&format!("{BASE}[broker]\n{line}\n"));
            let key = line.split(' ').next().unwrap_or_default();
            assert!(
                problem.contains(at) && problem.contains(key) && problem.contains("between"),
                "{line}: {problem}"
            );
        }
        let least = format!("{BASE}[broker]\nqueue_bytes = 5242880\n");
        assert_eq!(bounds(&least)[0].1.bytes, 5_242_880);
        let typed = problems(&format!("{BASE}[broker]\nqueue_capacity = \"5\"\n"));
        assert!(
            typed.contains("t.toml:11:18") && typed.contains("integer"),
            "{typed}"
        );
        let both = problems(&format!(
            "{BASE}[broker]\nqueue_capacity = 0\nqueue_bytes = 1\n"
        ));
        assert!(
            both.contains("t.toml:11:18") && both.contains("t.toml:12:15"),
            "{both}"
        );
        let value = problems(&format!(
            "{BASE}[[variant]]\nname = \"v\"\nset = {{ \"broker.queue_capacity\" = 0 }}\n"
        ));
        assert!(
            value.contains("variant \"v\"") && value.contains("queue_capacity"),
            "{value}"
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
