//! The official images of the brokers pull hops may go through, as a
//! deployment's `broker` service (pinned tags), with their health checks.

use tailmesh_services::{
    broker::{nats, rabbitmq},
    model::BrokerKind,
};

/// NATS with JetStream: the official image, pinned.
pub const NATS_IMAGE: &str = "nats:2.10.24-alpine";
/// RabbitMQ: the official image, pinned.
pub const RABBITMQ_IMAGE: &str = "rabbitmq:3.13.7-alpine";
/// NATS's monitoring port, where its health check asks.
const NATS_MONITOR_PORT: u16 = 8222;

/// Where the NATS service writes the configuration it starts with.
const NATS_CONFIG: &str = "/tmp/tailmesh-nats.conf";

/// The NATS service's arguments: nats-server takes `max_payload` only from
/// a configuration file, so the container writes one (the largest message
/// tailmesh sends, [`nats::MAX_PAYLOAD`], instead of the server's 1 MB
/// default) and starts the server with it, JetStream on, storing under
/// /data, monitoring on [`NATS_MONITOR_PORT`]. The image's entrypoint runs
/// a first argument that is not a flag as the command.
fn nats_args() -> Vec<String> {
    let script = format!(
        "printf 'max_payload: {}\\n' > {NATS_CONFIG} && exec nats-server -c {NATS_CONFIG} -js -sd /data -m {NATS_MONITOR_PORT}",
        nats::MAX_PAYLOAD
    );
    vec!["sh".into(), "-c".into(), script]
}

/// How a deployment runs another broker than tailmesh's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerImage {
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
            args: nats_args(),
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
    use crate::plan::broker_port;

    #[test]
    fn images_are_pinned_and_listen_where_the_hops_call_them() {
        for kind in [BrokerKind::Nats, BrokerKind::Rabbitmq] {
            let image = image(kind).expect("an image");
            let (_, tag) = image.image.split_once(':').expect("a tag");
            assert!(
                tag.chars().next().is_some_and(|c| c.is_ascii_digit()),
                "{tag}"
            );
            assert_eq!(Some(image.port), broker_port(kind));
        }
        assert_eq!(image(BrokerKind::Tailmesh), None);
    }

    #[test]
    fn nats_starts_with_tailmeshs_largest_payload_jetstream_and_monitoring() {
        let image = image(BrokerKind::Nats).expect("an image");
        let [shell, dash_c, script] = image.args.as_slice() else {
            panic!("{:?}", image.args);
        };
        assert_eq!((shell.as_str(), dash_c.as_str()), ("sh", "-c"));
        // The file written holds the limit; the server is started with it.
        let (write, start) = script.split_once(" && ").expect("write, then start");
        assert!(
            write.contains(&format!("max_payload: {}", nats::MAX_PAYLOAD))
                && write.ends_with(&format!("> {NATS_CONFIG}")),
            "{write}"
        );
        let start: Vec<&str> = start.split_whitespace().collect();
        assert_eq!(start[..2], ["exec", "nats-server"], "{start:?}");
        for pair in [
            ["-c", NATS_CONFIG],
            ["-sd", "/data"],
            ["-m", &NATS_MONITOR_PORT.to_string()],
        ] {
            assert!(start.windows(2).any(|w| w == pair), "{pair:?} in {start:?}");
        }
        assert!(start.contains(&"-js"), "{start:?}");
        // More than tailmesh's largest payload plus framing, and more than
        // the server's 1 MB default.
        let payload = tailmesh_services::limits::MAX_PAYLOAD_BYTES;
        assert!(nats::MAX_PAYLOAD > payload && nats::MAX_PAYLOAD > 1024 * 1024);
    }

    #[test]
    fn a_deployment_runs_the_brokers_image_with_its_health_check_and_port() {
        let text = r#"
name = "b"
[load]
mode = "closed"
concurrency = 1
requests = 10
[[hop]]
name = "a"
transport = "pull"
[[variant]]
name = "n"
set = { "broker.kind" = "nats" }
[[variant]]
name = "r"
set = { "broker.kind" = "rabbitmq" }
"#;
        let scenario = crate::scenario::parse(text, "b.toml").unwrap_or_else(|e| panic!("{e}"));
        let compose = crate::deploy::compose::generate(&scenario, text, &Default::default())
            .unwrap_or_else(|e| panic!("{e}"));
        for (service, image, health) in [
            ("n-broker:", NATS_IMAGE, "healthz?js-enabled-only=true"),
            ("r-broker:", RABBITMQ_IMAGE, "check_port_connectivity"),
        ] {
            let at = compose.find(service).unwrap_or_else(|| panic!("{compose}"));
            let block = &compose[at..];
            let block = &block[..block[1..]
                .find("\n  n-")
                .or(block[1..].find("\n  r-"))
                .map_or(block.len(), |e| e + 1)];
            assert!(block.contains(image) && block.contains(health), "{block}");
            if image == NATS_IMAGE {
                assert!(block.contains("max_payload: "), "{block}");
            }
            assert!(!block.contains("*tailmesh"), "{block}");
        }
        let manifests = crate::deploy::k8s::generate(&scenario, text, &Default::default())
            .unwrap_or_else(|e| panic!("{e}"));
        let mesh = &manifests
            .files
            .iter()
            .find(|(name, _)| name == "20-mesh.yaml")
            .expect("the mesh")
            .1;
        for needle in [
            NATS_IMAGE,
            RABBITMQ_IMAGE,
            "containerPort: 4222",
            "containerPort: 5672",
            "port: 4222",
            "port: 5672",
            "exec:",
        ] {
            assert!(mesh.contains(needle), "{needle} in\n{mesh}");
        }
    }
}
