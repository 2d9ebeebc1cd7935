//! What a scenario variant becomes, decided once: the [`MeshPlan`] lists
//! every process (each hop replica and the broker) with its role, name,
//! the service name its spans carry and the network fault it gets, in the
//! order they start; it derives each hop's configuration from where the
//! other processes are ([`Addrs`]) and each process's trace environment.
//!
//! Every runtime consumes the same plan: the local and netns launchers
//! (through `run`), the attached launcher and the generated Compose files
//! and Kubernetes manifests (through [`Naming`] and `deploy`), and a
//! deployed hop deriving its own configuration (`tailmesh hop --scenario`).
//!
//! - `naming`: the names services get in a container network or cluster.

mod naming;

use std::{
    collections::{BTreeMap, HashSet},
    sync::Arc,
    time::Duration,
};

use tailmesh_services::{
    addr::PeerAddr,
    discipline::Discipline,
    hop::{DownstreamConfig, HopConfig},
    model::{QueueBounds, Transport},
};

/// The deployment's images must listen where the plan says they do.
#[cfg(test)]
pub(crate) use naming::broker_port;
pub(crate) use naming::{Naming, NamingError};

use crate::scenario::{Hop, NetFault, Scenario, ServiceSource, Variant, Window};
use tailmesh_model::calls::Calls;

/// How long a hop gets to finish the requests in flight when it is told to
/// stop (the launchers wait as long before they kill it).
pub(crate) const DRAIN_GRACE: Duration = Duration::from_secs(3);

/// The broker's role name (and its spans' service name).
pub const BROKER: &str = "broker";

/// The role name of replica `replica` of hop `hop`: `hop-<hop>-<replica>`,
/// its process name under the local and netns launchers and, prefixed per
/// variant, its service name in a deployment.
pub(crate) fn hop_role(hop: &str, replica: u32) -> String {
    format!("hop-{hop}-{replica}")
}

/// Where a service's downstream hops are, for a service that makes its own
/// outbound calls: `TAILMESH_DOWNSTREAM_<HOP>` for each downstream hop of
/// `hop` in `variant` reached by push (its name upper-cased, `-` as `_`),
/// its replicas' addresses (`replicas` of the hop's name: `host:port`
/// each) joined by commas, and `TAILMESH_DOWNSTREAM` the same for the
/// first one. A hop reached by pull has no address of its own (its broker
/// topic does), and one `replicas` does not know is left out.
pub(crate) fn downstream_env(
    hop: &Hop,
    variant: &Variant,
    replicas: impl Fn(&str) -> Option<Vec<String>>,
) -> Vec<(String, String)> {
    let mut env = Vec::new();
    for name in &hop.downstream {
        let push = variant
            .hops
            .iter()
            .any(|h| &h.name == name && h.transport == Transport::Push);
        let Some(value) = replicas(name).filter(|_| push).map(|r| r.join(",")) else {
            continue;
        };
        if env.is_empty() {
            env.push(("TAILMESH_DOWNSTREAM".to_owned(), value.clone()));
        }
        env.push((
            format!(
                "TAILMESH_DOWNSTREAM_{}",
                name.to_ascii_uppercase().replace('-', "_")
            ),
            value,
        ));
    }
    env
}

/// What a process runs.
#[derive(Clone, Debug, PartialEq)]
pub enum Role {
    /// Replica `replica` of `hop`, with everything the hop is (shared by
    /// its replicas): whoever starts it needs nothing else to configure it.
    Hop {
        /// The hop, as the variant has it.
        hop: Arc<Hop>,
        /// The replica index.
        replica: u32,
    },
    /// The broker, serving `topics`.
    Broker {
        /// The hops reached by pull, one topic each.
        topics: Vec<String>,
        /// The topics whose queue discipline is not the default (fifo).
        disciplines: Vec<(String, Discipline)>,
        /// How many tasks and bytes each topic's queue holds.
        bounds: QueueBounds,
    },
}

/// The `tailmesh` arguments that start the broker of `topics`, up to
/// (not including) where it listens.
pub(crate) fn broker_args(
    topics: &[String],
    disciplines: &[(String, Discipline)],
    bounds: QueueBounds,
) -> Vec<String> {
    let mut args = vec![
        "broker".to_owned(),
        "--topics".to_owned(),
        topics.join(","),
        "--queue-capacity".to_owned(),
        bounds.capacity.to_string(),
        "--queue-bytes".to_owned(),
        bounds.bytes.to_string(),
    ];
    if !disciplines.is_empty() {
        let per_topic: Vec<String> = disciplines
            .iter()
            .map(|(topic, d)| format!("{topic}={d}"))
            .collect();
        args.extend(["--discipline".to_owned(), per_topic.join(",")]);
    }
    args
}

/// One process of a variant's mesh.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Process {
    /// What it runs.
    pub role: Role,
    /// Its role name: `hop-<hop>-<replica>` or `broker`.
    pub name: String,
    /// The `OTEL_SERVICE_NAME` of its spans: `hop-<hop>` or `broker`.
    pub otel_name: String,
    /// The network fault its fault agent applies, when it has one that
    /// does something.
    pub net_fault: Option<NetFault>,
}

/// Where a variant's broker and hop replicas are reached.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Addrs {
    /// The broker, when some hop is reached by pull.
    pub broker: Option<PeerAddr>,
    /// Each hop's replicas, replica `i` at index `i`.
    pub hops: BTreeMap<String, Vec<PeerAddr>>,
    /// The service each hop replica with `[hop.service]` calls, by the
    /// replica's role name (`hop-b-0`): `host:port`.
    pub services: BTreeMap<String, String>,
}

/// A variant of a scenario as the processes that run it.
#[derive(Clone, Debug)]
pub(crate) struct MeshPlan {
    /// The scenario's seed, which every hop's draws are keyed on.
    pub seed: u64,
    pub variant: Variant,
    /// Every process, in start order: the broker first (when a hop is
    /// reached by pull), then the hops, each after every hop it calls, so
    /// each is handed the addresses of the ones it calls.
    pub processes: Vec<Process>,
}

impl MeshPlan {
    /// The plan of `variant` of `scenario`.
    pub(crate) fn new(scenario: &Scenario, variant: &Variant) -> MeshPlan {
        let mut processes = Vec::new();
        let pulled = || {
            variant
                .hops
                .iter()
                .filter(|h| h.transport == Transport::Pull)
        };
        let topics: Vec<String> = pulled().map(|h| h.name.clone()).collect();
        let disciplines = pulled()
            .filter(|h| h.discipline != Discipline::Fifo)
            .map(|h| (h.name.clone(), h.discipline))
            .collect();
        if !topics.is_empty() {
            processes.push(Process {
                role: Role::Broker {
                    topics,
                    disciplines,
                    bounds: variant.queue_bounds,
                },
                name: BROKER.to_owned(),
                otel_name: BROKER.to_owned(),
                net_fault: None,
            });
        }
        for hop in launch_order(&variant.hops) {
            let shared = Arc::new(hop.clone());
            for replica in 0..hop.replicas {
                processes.push(Process {
                    role: Role::Hop {
                        hop: Arc::clone(&shared),
                        replica,
                    },
                    name: hop_role(&hop.name, replica),
                    otel_name: format!("hop-{}", hop.name),
                    net_fault: hop.net_of(replica).filter(|f| f.is_active()).cloned(),
                });
            }
        }
        MeshPlan {
            seed: scenario.seed,
            variant: variant.clone(),
            processes,
        }
    }

    /// The broker process, when some hop is reached by pull.
    pub(crate) fn broker(&self) -> Option<&Process> {
        self.processes
            .iter()
            .find(|p| matches!(p.role, Role::Broker { .. }))
    }

    /// The hop replicas, in start order.
    pub(crate) fn hops(&self) -> impl Iterator<Item = (&Process, &Hop, u32)> {
        self.processes.iter().filter_map(|p| match &p.role {
            Role::Hop { hop, replica } => Some((p, hop.as_ref(), *replica)),
            Role::Broker { .. } => None,
        })
    }

    /// The application-level faults with a window (a start or a
    /// duration), set at runtime through each replica's Control service:
    /// `slow` and `error` on every replica of their hop, `replica_slow` on
    /// its replica only; in the scenario's order of hops and replicas.
    pub(crate) fn windowed_faults(&self) -> Vec<(&Process, &Hop, u32, AppFault, Window)> {
        let mut faults = Vec::new();
        for (process, hop, replica) in self.hops() {
            if let (Some(slow), true) = (&hop.slow, hop.windows.slow.is_scheduled()) {
                faults.push((
                    process,
                    hop,
                    replica,
                    AppFault::Slow(slow.clone()),
                    hop.windows.slow,
                ));
            }
            if let (Some(rs), true) = (&hop.replica_slow, hop.windows.replica_slow.is_scheduled())
                && rs.replica == replica
            {
                faults.push((
                    process,
                    hop,
                    replica,
                    AppFault::WorkFactor(rs.factor),
                    hop.windows.replica_slow,
                ));
            }
            if let (Some(error), true) = (&hop.error, hop.windows.error.is_scheduled()) {
                faults.push((
                    process,
                    hop,
                    replica,
                    AppFault::Error(error.clone()),
                    hop.windows.error,
                ));
            }
        }
        faults.sort_by_key(|(_, hop, replica, _, _)| {
            let order = self.variant.hops.iter().position(|h| h.name == hop.name);
            (order, *replica)
        });
        faults
    }

    /// The hop replicas with a network fault that does something, as
    /// `(process, hop, replica, fault)`, in the scenario's order of hops
    /// and replicas (as summary.json lists the faults).
    pub(crate) fn net_faults(&self) -> Vec<(&Process, &Hop, u32, &NetFault)> {
        let mut faulty: Vec<_> = self
            .hops()
            .filter_map(|(p, hop, replica)| Some((p, hop, replica, p.net_fault.as_ref()?)))
            .collect();
        faulty.sort_by_key(|(_, hop, replica, _)| {
            let order = self.variant.hops.iter().position(|h| h.name == hop.name);
            (order, *replica)
        });
        faulty
    }

    /// The load generators whose link has a network fault that does
    /// something, as `(generator, fault)`, in order.
    pub(crate) fn generator_net_faults(&self) -> Vec<(u32, &NetFault)> {
        let load = &self.variant.load;
        (0..load.generators)
            .filter_map(|k| Some((k, load.net_of(k).filter(|f| f.is_active())?)))
            .collect()
    }

    /// Whether the load runs in generator processes of their own: several
    /// of them, or one whose link carries a fault (it needs a namespace).
    pub(crate) fn generator_processes(&self) -> bool {
        let load = &self.variant.load;
        load.generators > 1 || load.has_net_faults()
    }

    /// The hops the load generator calls, each with its share of the
    /// requests.
    pub(crate) fn entries(&self) -> Vec<(&Hop, f64)> {
        self.variant
            .entries()
            .into_iter()
            .filter_map(|(i, share)| Some((self.variant.hops.get(i)?, share)))
            .collect()
    }

    /// The configuration of replica `replica` of `hop`: its behavior, and
    /// the addresses of the broker and of the hops it calls.
    pub(crate) fn hop_config(&self, hop: &Hop, replica: u32, addrs: &Addrs) -> HopConfig {
        let downstream = hop
            .downstream
            .iter()
            .filter_map(|name| self.variant.hops.iter().find(|h| &h.name == name))
            .map(|d| DownstreamConfig {
                hop: d.name.clone(),
                transport: d.transport,
                balance: d.balance,
                replicas: addrs.hops.get(&d.name).cloned().unwrap_or_default(),
                policy: d.client.clone(),
                endpoints: d.endpoints.clone(),
                connection: d.connection,
                service: d
                    .service
                    .as_ref()
                    .filter(|s| s.direct)
                    .map(|s| s.call(String::new())),
                streaming: d.streaming != crate::scenario::Streaming::Unary,
            })
            .collect();
        HopConfig {
            behavior: hop.behavior(self.seed),
            replica,
            transport: hop.transport,
            downstream,
            // A fixed path needs no plan: every downstream hop once.
            calls: if hop.calls.is_fixed() {
                Calls::default()
            } else {
                hop.calls.clone()
            },
            broker: addrs.broker.clone(),
            broker_kind: self.variant.broker,
            queue_bounds: self.variant.queue_bounds,
            concurrency: hop.concurrency,
            queue_limit: hop.queue_limit,
            discipline: hop.discipline,
            drain_grace: DRAIN_GRACE,
            idle_timeout: tailmesh_services::incoming::DEFAULT_IDLE_TIMEOUT,
            worker_ping: hop.worker_ping,
            precise_timer: true,
            // The launcher adds the files it wrote (see `run::launch`).
            tls: None,
            // A direct service has no hop of its own: its callers call it.
            service: hop
                .service
                .as_ref()
                .filter(|s| !s.direct)
                .and_then(|service| {
                    let address = match &service.source {
                        ServiceSource::Address(address) => address.clone(),
                        ServiceSource::Command(_) => {
                            addrs.services.get(&hop_role(&hop.name, replica))?.clone()
                        }
                    };
                    Some(service.call(address))
                }),
        }
    }
}

/// How long, and how many spans, a process holds for the run's keep
/// decisions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SpanHold {
    pub time: Duration,
    pub spans: usize,
}

impl Process {
    /// Its environment for tracing: where its spans go (`endpoint`, an OTLP
    /// gRPC URL), under which service name, sampled how, its variant, and
    /// how long it holds its spans for the run's keep decisions (`None`:
    /// it sends them all). Empty when nothing is traced.
    pub(crate) fn trace_env(
        &self,
        endpoint: &str,
        sampling: f64,
        variant: &str,
        hold: Option<SpanHold>,
    ) -> Vec<(String, String)> {
        if sampling <= 0.0 {
            return Vec::new();
        }
        let hold = hold.into_iter().flat_map(|h| {
            [
                (
                    tailmesh_services::telemetry::export::HOLD_ENV,
                    h.time.as_millis().max(1).to_string(),
                ),
                (
                    tailmesh_services::telemetry::export::HOLD_SPANS_ENV,
                    h.spans.to_string(),
                ),
            ]
        });
        [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.to_owned()),
            ("OTEL_SERVICE_NAME", self.otel_name.clone()),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio".to_owned()),
            ("OTEL_TRACES_SAMPLER_ARG", sampling.to_string()),
            (
                tailmesh_services::telemetry::VARIANT_ENV,
                variant.to_owned(),
            ),
        ]
        .into_iter()
        .chain(hold)
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }
}

/// Hops in an order where every hop comes after all the hops it calls.
pub(crate) fn launch_order(hops: &[Hop]) -> Vec<&Hop> {
    fn visit<'a>(
        hop: &'a Hop,
        hops: &'a [Hop],
        seen: &mut HashSet<&'a str>,
        out: &mut Vec<&'a Hop>,
    ) {
        if !seen.insert(hop.name.as_str()) {
            return;
        }
        for name in &hop.downstream {
            if let Some(d) = hops.iter().find(|h| &h.name == name) {
                visit(d, hops, seen, out);
            }
        }
        out.push(hop);
    }
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(hops.len());
    for hop in hops {
        visit(hop, hops, &mut seen, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tailmesh_services::model::Connection;

    /// a calls b (two replicas), b calls c (pulled).
    const CHAIN: &str = r#"
name = "s"
seed = 9
[load]
mode = "open"
rate = 10
requests = 10
[[hop]]
name = "a"
downstream = ["b"]
[[hop]]
name = "b"
replicas = 2
downstream = ["c"]
[[hop]]
name = "c"
transport = "pull"
replica_net = { replica = 0, loss = 0.1 }
"#;

    fn plan() -> MeshPlan {
        let scenario =
            crate::scenario::parse(CHAIN, "chain.toml").unwrap_or_else(|e| panic!("{e}"));
        MeshPlan::new(&scenario, &scenario.variants[0])
    }

    #[test]
    fn processes_start_broker_first_then_callees_before_callers() {
        let plan = plan();
        let names: Vec<&str> = plan.processes.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            ["broker", "hop-c-0", "hop-b-0", "hop-b-1", "hop-a-0"]
        );
        assert_eq!(
            plan.broker().map(|b| &b.role),
            Some(&Role::Broker {
                topics: vec!["c".into()],
                disciplines: Vec::new(),
                bounds: QueueBounds::default(),
            })
        );
        let otel: Vec<&str> = plan.hops().map(|(p, _, _)| p.otel_name.as_str()).collect();
        assert_eq!(otel, ["hop-c", "hop-b", "hop-b", "hop-a"]);
        let faulty: Vec<&str> = plan
            .processes
            .iter()
            .filter(|p| p.net_fault.is_some())
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(faulty, ["hop-c-0"]);
        let faults: Vec<(&str, u32, f64)> = plan
            .net_faults()
            .into_iter()
            .map(|(p, hop, replica, fault)| {
                assert_eq!(p.name, hop_role(&hop.name, replica));
                (hop.name.as_str(), replica, fault.loss)
            })
            .collect();
        assert_eq!(faults, [("c", 0, 0.1)]);
    }

    #[test]
    fn disciplines_reach_the_broker_per_topic_and_push_hops_in_their_config() {
        let text = CHAIN
            .replace(
                "name = \"c\"\n",
                "name = \"c\"\ndiscipline = \"adaptive\"\n",
            )
            .replace(
                "replicas = 2\n",
                "replicas = 2\nconcurrency = 1\ndiscipline = \"lifo\"\n",
            );
        let scenario =
            crate::scenario::parse(&text, "chain.toml").unwrap_or_else(|e| panic!("{e}"));
        let plan = MeshPlan::new(&scenario, &scenario.variants[0]);
        assert_eq!(
            broker_args_of(&plan).0,
            [
                "broker",
                "--topics",
                "c",
                "--queue-capacity",
                "10000",
                "--queue-bytes",
                "67108864",
                "--discipline",
                "c=adaptive"
            ]
        );
        let b = &plan.variant.hops[1];
        let config = plan.hop_config(b, 1, &Addrs::default());
        assert_eq!(config.discipline, Discipline::Lifo);
    }

    /// The plan's broker's command-line arguments and queue bounds.
    fn broker_args_of(plan: &MeshPlan) -> (Vec<String>, QueueBounds) {
        let Some(Role::Broker {
            topics,
            disciplines,
            bounds,
        }) = plan.broker().map(|b| &b.role)
        else {
            panic!("a broker");
        };
        (broker_args(topics, disciplines, *bounds), *bounds)
    }

    #[test]
    fn queue_bounds_reach_the_brokers_arguments_and_every_hops_config() {
        let text = format!(
            "{CHAIN}[broker]\nkind = \"nats\"\nqueue_capacity = 5\nqueue_bytes = 8388608\n"
        );
        let scenario =
            crate::scenario::parse(&text, "chain.toml").unwrap_or_else(|e| panic!("{e}"));
        let plan = MeshPlan::new(&scenario, &scenario.variants[0]);
        let small = QueueBounds {
            capacity: 5,
            bytes: 8 * 1024 * 1024,
        };
        let (args, bounds) = broker_args_of(&plan);
        assert_eq!(bounds, small);
        let value = |flag: &str| {
            let at = args.iter().position(|a| a == flag);
            at.and_then(|i| args.get(i + 1)).map(String::as_str)
        };
        assert_eq!(value("--queue-capacity"), Some("5"), "{args:?}");
        assert_eq!(value("--queue-bytes"), Some("8388608"), "{args:?}");
        // Every replica declares the external broker's queues it uses
        // (as producer or worker) with the same bounds, through its config.
        for (_, hop, replica) in plan.hops() {
            let config = plan.hop_config(hop, replica, &Addrs::default());
            assert_eq!(config.queue_bounds, small, "{}", hop.name);
            let json = serde_json::to_string(&config).unwrap_or_else(|e| panic!("{e}"));
            let back: HopConfig = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(back.queue_bounds, small);
        }
    }

    #[test]
    fn a_service_hop_config_calls_its_replicas_own_service() {
        let text = "name = \"s\"\n[load]\nmode = \"closed\"\nconcurrency = 1\nrequests = 5\n\
                    [[hop]]\nname = \"b\"\nreplicas = 2\n[hop.service]\ncommand = [\"srv\", \"{port}\"]\n\
                    method = \"p.S/M\"\nrequest = { a = 1 }\nproto = [\"x.proto\"]\nmetadata = { k = \"v\" }\n";
        let mut scenario = crate::scenario::parse(text, "s.toml").unwrap_or_else(|e| panic!("{e}"));
        if let Some(service) = &mut scenario.variants[0].hops[0].service {
            service.dir = "/scenarios".into();
        }
        let plan = MeshPlan::new(&scenario, &scenario.variants[0]);
        let b = &plan.variant.hops[0];
        let addrs = Addrs {
            services: [("hop-b-1".to_owned(), "127.0.0.1:4001".to_owned())].into(),
            ..Addrs::default()
        };
        let call = plan
            .hop_config(b, 1, &addrs)
            .service
            .expect("replica 1 calls its service");
        assert_eq!(call.address, "127.0.0.1:4001");
        assert_eq!(call.method, "p.S/M");
        assert_eq!(call.request, "{\"a\":1}".into());
        assert_eq!(call.proto, [std::path::PathBuf::from("/scenarios/x.proto")]);
        assert_eq!(call.metadata, [("k".to_owned(), "v".to_owned())]);
        // Replica 0's service was not started: no call at all.
        assert_eq!(plan.hop_config(b, 0, &addrs).service, None);
    }

    #[test]
    fn a_hop_config_names_the_replicas_it_calls_and_the_broker() {
        let plan = plan();
        let addr = |p: u16| PeerAddr::new("127.0.0.1", p).unwrap_or_else(|e| panic!("{e}"));
        let addrs = Addrs {
            broker: Some(addr(1)),
            hops: [("b".to_owned(), vec![addr(2), addr(3)])].into(),
            services: BTreeMap::new(),
        };
        let a = &plan.variant.hops[0];
        let config = plan.hop_config(a, 0, &addrs);
        assert_eq!(config.downstream.len(), 1);
        assert_eq!(config.downstream[0].replicas, vec![addr(2), addr(3)]);
        assert_eq!(config.broker, Some(addr(1)));
        assert_eq!(config.behavior, a.behavior(9));
        assert_eq!(config.drain_grace, DRAIN_GRACE);
    }

    #[test]
    fn a_hops_connection_reaches_its_callers_config_and_older_configs_read_shared() {
        let text = CHAIN.replace(
            "transport = \"pull\"\n",
            "transport = \"pull\"\nconnection = \"per_request\"\n",
        );
        let scenario =
            crate::scenario::parse(&text, "chain.toml").unwrap_or_else(|e| panic!("{e}"));
        let plan = MeshPlan::new(&scenario, &scenario.variants[0]);
        let config = |hop: usize| plan.hop_config(&plan.variant.hops[hop], 0, &Addrs::default());
        // a calls b (shared), b calls c (per request).
        let (a, b) = (config(0), config(1));
        assert_eq!(a.downstream[0].connection, Connection::Shared);
        assert_eq!(b.downstream[0].connection, Connection::PerRequest);
        let json = serde_json::to_value(&b).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(json["downstream"][0]["connection"], "per_request");
        // A config written before the key existed reads as shared.
        let mut old = json;
        let removed = old["downstream"][0]
            .as_object_mut()
            .and_then(|d| d.remove("connection"));
        assert!(removed.is_some());
        let back: HopConfig = serde_json::from_value(old).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back.downstream[0].connection, Connection::Shared);
    }

    #[test]
    fn trace_env_is_empty_without_sampling_and_complete_with_it() {
        let plan = plan();
        let p = &plan.processes[1];
        assert!(p.trace_env("http://x:1", 0.0, "v", None).is_empty());
        let env: BTreeMap<String, String> = p
            .trace_env("http://x:1", 0.5, "v", None)
            .into_iter()
            .collect();
        assert_eq!(env["OTEL_EXPORTER_OTLP_ENDPOINT"], "http://x:1");
        assert_eq!(env["OTEL_SERVICE_NAME"], "hop-c");
        assert_eq!(env["OTEL_TRACES_SAMPLER_ARG"], "0.5");
        assert_eq!(env[tailmesh_services::telemetry::VARIANT_ENV], "v");
    }
}

/// An application-level fault set at runtime on one replica.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum AppFault {
    /// `slow`.
    Slow(tailmesh_services::model::Slowness),
    /// `replica_slow`'s factor.
    WorkFactor(f64),
    /// `error`.
    Error(tailmesh_services::model::ErrorInjection),
}
