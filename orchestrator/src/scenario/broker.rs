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
