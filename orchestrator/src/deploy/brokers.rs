//! The official images of the brokers pull hops may go through, as a
//! deployment's `broker` service (pinned tags), with their health checks.

use tailmesh_services::{broker::rabbitmq, model::BrokerKind};

/// NATS with JetStream: the official image, pinned.
pub const NATS_IMAGE: &str = "nats:2.10.24-alpine";
/// RabbitMQ: the official image, pinned.
pub const RABBITMQ_IMAGE: &str = "rabbitmq:3.13.7-alpine";
/// NATS's monitoring port, where its health check asks.
const NATS_MONITOR_PORT: u16 = 8222;

/// How a deployment runs another broker than tailmesh's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerImage {
    /// The image.
    pub image: &'static str,
    /// Its arguments (the image's entrypoint stays).
    pub args: Vec<String>,
    /// Its environment.
    pub env: Vec<(String, String)>,
    /// The command that exits 0 once it takes work.
    pub health: Vec<String>,
    /// The port clients use.
    pub port: u16,
}

/// The image of `kind`, `None` for tailmesh's own broker (the tailmesh
/// image).
pub fn image(kind: BrokerKind) -> Option<BrokerImage> {
    let strings = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    match kind {
        BrokerKind::Tailmesh => None,
        BrokerKind::Nats => Some(BrokerImage {
            image: NATS_IMAGE,
            args: strings(&["-js", "-sd", "/data", "-m", &NATS_MONITOR_PORT.to_string()]),
            env: Vec::new(),
            health: strings(&[
                "wget",
                "-q",
                "-O",
                "/dev/null",
                &format!("http://127.0.0.1:{NATS_MONITOR_PORT}/healthz?js-enabled-only=true"),
            ]),
            port: 4222,
        }),
        BrokerKind::Rabbitmq => Some(BrokerImage {
            image: RABBITMQ_IMAGE,
            args: Vec::new(),
            env: vec![
                ("RABBITMQ_DEFAULT_USER".into(), rabbitmq::USER.into()),
                ("RABBITMQ_DEFAULT_PASS".into(), rabbitmq::PASSWORD.into()),
            ],
            health: strings(&["rabbitmq-diagnostics", "-q", "check_port_connectivity"]),
            port: 5672,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launcher::brokers::port_of;

    #[test]
    fn images_are_pinned_and_listen_where_the_hops_call_them() {
        for kind in [BrokerKind::Nats, BrokerKind::Rabbitmq] {
            let image = image(kind).expect("an image");
            let (_, tag) = image.image.split_once(':').expect("a tag");
            assert!(
                tag.chars().next().is_some_and(|c| c.is_ascii_digit()),
                "{tag}"
            );
            assert_eq!(Some(image.port), port_of(kind));
        }
        assert_eq!(image(BrokerKind::Tailmesh), None);
    }
}
