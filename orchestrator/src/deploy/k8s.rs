//! `tailmesh k8s`: Kubernetes manifests for a scenario, for runs across
//! machines. The same services as the Compose file, as objects:
//!
//! - a Namespace `tailmesh-<scenario>` and a ConfigMap with the scenario;
//! - per hop replica (and the broker) a Deployment of one pod and a
//!   ClusterIP Service of the same name, so callers address replicas one
//!   by one and push balancing and per-replica faults mean what they mean
//!   locally;
//! - Jaeger (Deployment and Service);
//! - the orchestrator as a Job, with a Service for its trace receiver and
//!   a PersistentVolumeClaim for its results;
//! - with `[load] generators` above 1, the load generators as an Indexed
//!   Job of that many pods run in parallel, each taking its index from
//!   the Job and serving every variant for the orchestrator, which
//!   awaits them on its Service's `generators` port.
//!
//! Pods get gRPC readiness probes, resource requests (no CPU limits: CFS
//! throttling would add tail latency of its own), and NET_ADMIN only where
//! a network fault is applied; those pods and the orchestrator read the
//! Control token from the Secret `tailmesh-control`, created by the user.
//!
//! With `[mesh] tls` on, `15-tls.yaml` is a Secret `tailmesh-tls` with the
//! CA's certificate and each TLS pod's certificate and key; each pod sees
//! its own at `/etc/tailmesh/tls` and is probed by `tailmesh health
//! --tls-dir` (exec), the kubelet's gRPC probe being plaintext. The CA is
//! made for this generation, or kept in a CA folder ([`Options::ca_dir`],
//! [`tls::ca_folder`]) so that generating again gives the same Secret and
//! `kubectl apply` replaces no pod; its private key is never in the
//! manifests.

use std::path::{Path, PathBuf};

use super::{
    DeployError, GENERATOR_HUB_PORT, HOP_SERVICE_PORT, HopWorkService, Role, Runtime, SERVICE_PORT,
    Service, TOKEN_DIR, TOKEN_FILE, TOKEN_FILE_ENV, TRACE_PORT, digest, generator_command,
    generator_count, needs_token, orchestrator_command, project_name, services, tls,
    yaml::{Node, flow, map, render, s},
};
use crate::scenario::Scenario;

/// The Secret holding the Control token (key `token`).
pub const TOKEN_SECRET: &str = "tailmesh-control";
/// The Secret holding the TLS material (`ca.crt`, `<service>.crt`,
/// `<service>.key`), written by `tailmesh k8s` when a variant uses TLS.
pub const TLS_SECRET: &str = "tailmesh-tls";
/// The file holding the TLS Secret, which carries private keys.
pub const TLS_FILE: &str = "15-tls.yaml";
/// Where pods mount the scenario ConfigMap.
const SCENARIO_DIR: &str = "/etc/tailmesh";

/// What the manifests may assume.
#[derive(Clone, Debug)]
pub struct Options {
    /// The tailmesh image (push it where the cluster can pull it).
    pub image: String,
    /// Whether pods may get NET_ADMIN (a restricted Pod Security level
    /// forbids it).
    pub net_admin: bool,
    /// The CA folder to sign the TLS Secret's certificates with, made on
    /// the first generation ([`tls::ca_folder`]); without one, each
    /// generation makes a CA of its own, and every apply replaces every
    /// TLS pod.
    pub ca_dir: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            image: super::DEFAULT_IMAGE.to_owned(),
            net_admin: true,
            ca_dir: None,
        }
    }
}

/// Generated manifests.
#[derive(Debug)]
pub struct Manifests {
    /// `(file name, YAML)` in the order `kubectl apply -f <dir>` takes them.
    pub files: Vec<(String, String)>,
    /// What the CA folder held and what was made in it, when one was
    /// given and a variant uses TLS.
    pub ca_folder: Option<tls::FolderReport>,
}

impl Manifests {
    /// Whether a file carries private keys (the TLS Secret).
    pub fn has_keys(&self) -> bool {
        self.files.iter().any(|(name, _)| name == TLS_FILE)
    }
}

/// The manifests for `scenario` (file text `text`). With TLS and
/// `options.ca_dir`, the CA folder is made or updated first.
pub fn generate(
    scenario: &Scenario,
    text: &str,
    options: &Options,
) -> Result<Manifests, DeployError> {
    let runtime = Runtime {
        name: "Kubernetes",
        net_admin: options.net_admin,
        pod: true,
    };
    let services = services(scenario, runtime)?;
    let ns = project_name(scenario);
    let generators = generator_count(scenario);
    // Generators show the token to the orchestrator they serve.
    let token = needs_token(&services) || generators > 1;
    let digest = digest(text);
    // The CA (kept in the CA folder, or made for this generation) and
    // every TLS service's certificate, for each name its Service answers
    // to in the cluster.
    let identities = tls::identities(&services, |name| {
        vec![
            name.to_owned(),
            format!("{name}.{ns}"),
            format!("{name}.{ns}.svc"),
            format!("{name}.{ns}.svc.cluster.local"),
        ]
    });
    let mut ca_folder = None;
    let material = match &options.ca_dir {
        _ if identities.is_empty() => None,
        None => {
            Some(tls::issue(&ns, &identities).map_err(|e| DeployError::Tls(Box::new(e.into())))?)
        }
        Some(dir) => {
            let (material, report) =
                tls::ca_folder(dir, &ns, &identities).map_err(|e| DeployError::Tls(Box::new(e)))?;
            ca_folder = Some(report);
            Some(material)
        }
    };
    let ca_sha256 = material.as_ref().map(|m| m.ca_sha256.as_str());
    let meta = |name: &str, component: &str| {
        map([
            ("name", s(name)),
            ("namespace", s(&ns)),
            (
                "labels",
                map([
                    ("app.kubernetes.io/name", s("tailmesh")),
                    ("app.kubernetes.io/component", s(component)),
                    ("tailmesh/service", s(name)),
                ]),
            ),
        ])
    };
    let header = format!(
        "# Generated by `tailmesh k8s` from scenario {:?}; do not edit by hand.\n",
        scenario.name
    );
    let doc = |nodes: Vec<Node>| {
        let body: Vec<String> = nodes.iter().map(render).collect();
        format!("{header}---\n{}", body.join("---\n"))
    };

    let mut files = Vec::new();
    let mut namespace_meta = vec![("name".to_owned(), s(&ns))];
    if token {
        namespace_meta.push((
            "annotations".to_owned(),
            map([(
                "tailmesh/token",
                s(format!(
                    "create the Control token before the pods start: kubectl -n {ns} \
                     create secret generic {TOKEN_SECRET} --from-literal=token=$(od \
                     -An -tx1 -N16 /dev/urandom | tr -d ' \\n')"
                )),
            )]),
        ));
    }
    let namespace = vec![map([
        ("apiVersion", s("v1")),
        ("kind", s("Namespace")),
        ("metadata", Node::Map(namespace_meta)),
    ])];
    files.push(("00-namespace.yaml".to_owned(), doc(namespace)));
    files.push((
        "10-scenario.yaml".to_owned(),
        doc(vec![map([
            ("apiVersion", s("v1")),
            ("kind", s("ConfigMap")),
            ("metadata", meta("scenario", "scenario")),
            (
                "data",
                map([("scenario.toml", Node::Block(text.to_owned()))]),
            ),
        ])]),
    ));

    if let Some(material) = &material {
        let mut data = vec![("ca.crt".to_owned(), Node::Block(material.ca_pem.clone()))];
        for (name, issued) in &material.issued {
            data.push((format!("{name}.crt"), Node::Block(issued.cert_pem.clone())));
            data.push((format!("{name}.key"), Node::Block(issued.key_pem.clone())));
        }
        files.push((
            TLS_FILE.to_owned(),
            doc(vec![map([
                ("apiVersion", s("v1")),
                ("kind", s("Secret")),
                ("metadata", meta(TLS_SECRET, "tls")),
                ("type", s("Opaque")),
                ("stringData", Node::Map(data)),
            ])]),
        ));
    }

    let sampling = scenario.telemetry.sampling;
    let mut mesh = Vec::new();
    for service in &services {
        let component = match service.role {
            Role::Hop { .. } => "hop",
            Role::Broker { .. } => "broker",
        };
        let ca = ca_sha256.filter(|_| service.tls.is_on() && service.broker_image().is_none());
        let pod = mesh_pod(service, options, ca);
        mesh.push(deployment(
            meta(&service.name, component),
            &service.name,
            &digest,
            ca,
            pod,
        ));
        let port = service.broker_image().map_or(SERVICE_PORT, |b| b.port);
        mesh.push(cluster_service(
            meta(&service.name, component),
            &service.name,
            &[(
                if port == SERVICE_PORT {
                    "grpc"
                } else {
                    "broker"
                },
                port,
            )],
        ));
    }
    files.push(("20-mesh.yaml".to_owned(), doc(mesh)));

    let jaeger_pod = map([(
        "containers",
        Node::Seq(vec![map([
            ("name", s("jaeger")),
            ("image", s(super::compose::JAEGER_IMAGE)),
            (
                "ports",
                Node::Seq(vec![port("otlp-grpc", TRACE_PORT), port("ui", 16686)]),
            ),
            ("resources", requests("100m", "256Mi")),
        ])]),
    )]);
    files.push((
        "30-jaeger.yaml".to_owned(),
        doc(vec![
            deployment(
                meta("jaeger", "jaeger"),
                "jaeger",
                &digest,
                None,
                jaeger_pod,
            ),
            cluster_service(
                meta("jaeger", "jaeger"),
                "jaeger",
                &[("otlp-grpc", TRACE_PORT), ("ui", 16686)],
            ),
        ]),
    ));

    files.push((
        "40-orchestrator.yaml".to_owned(),
        doc(vec![
            map([
                ("apiVersion", s("v1")),
                ("kind", s("PersistentVolumeClaim")),
                ("metadata", meta("results", "orchestrator")),
                (
                    "spec",
                    map([
                        ("accessModes", flow(["ReadWriteOnce"])),
                        (
                            "resources",
                            map([("requests", map([("storage", s("1Gi"))]))]),
                        ),
                    ]),
                ),
            ]),
            cluster_service(
                meta("orchestrator", "orchestrator"),
                "orchestrator",
                if generators > 1 {
                    &[
                        ("otlp-grpc", TRACE_PORT),
                        ("generators", GENERATOR_HUB_PORT),
                    ]
                } else {
                    &[("otlp-grpc", TRACE_PORT)]
                },
            ),
            orchestrator_job(
                meta("orchestrator", "orchestrator"),
                &digest,
                options,
                sampling,
                token,
                ca_sha256,
                generators > 1,
            ),
        ]),
    ));
    if generators > 1 {
        files.push((
            "45-generators.yaml".to_owned(),
            doc(vec![generators_job(
                meta("generators", "generator"),
                &digest,
                options,
                generators,
                ca_sha256,
            )]),
        ));
    }
    Ok(Manifests { files, ca_folder })
}

/// Writes the files into `dir` (created if missing); the TLS Secret's
/// file is readable by its owner only ([`super::write_private`]).
pub fn write_dir(dir: &Path, files: &[(String, String)]) -> Result<(), DeployError> {
    std::fs::create_dir_all(dir).map_err(|source| DeployError::Io {
        what: "create",
        path: dir.to_path_buf(),
        source,
    })?;
    for (name, body) in files {
        let path = dir.join(name);
        if name == TLS_FILE {
            super::write_private(&path, body)?;
            continue;
        }
        std::fs::write(&path, body).map_err(|source| DeployError::Io {
            what: "write",
            path: path.clone(),
            source,
        })?;
    }
    Ok(())
}

fn port(name: &str, number: u16) -> Node {
    map([
        ("name", s(name)),
        ("containerPort", Node::Raw(number.to_string())),
    ])
}

fn requests(cpu: &str, memory: &str) -> Node {
    map([("requests", map([("cpu", s(cpu)), ("memory", s(memory))]))])
}

/// A Deployment of one pod, labelled to match its Service, annotated with
/// the scenario's digest (and its CA's, with TLS) so a changed scenario or
/// new certificates roll the pod.
fn deployment(metadata: Node, name: &str, digest: &str, ca: Option<&str>, pod: Node) -> Node {
    let selector = map([("tailmesh/service", s(name))]);
    map([
        ("apiVersion", s("apps/v1")),
        ("kind", s("Deployment")),
        ("metadata", metadata),
        (
            "spec",
            map([
                ("replicas", Node::Raw("1".into())),
                ("selector", map([("matchLabels", selector.clone())])),
                ("template", pod_template(name, digest, ca, pod)),
            ]),
        ),
    ])
}

/// The pod template of `name`: labelled to match its Service, annotated
/// with the scenario's digest and its CA's (`ca`, with TLS) so a changed
/// scenario or new certificates replace the pod.
fn pod_template(name: &str, digest: &str, ca: Option<&str>, spec: Node) -> Node {
    let mut annotations = vec![("tailmesh/scenario-sha256".to_owned(), s(digest))];
    if let Some(ca) = ca {
        annotations.push(("tailmesh/tls-ca-sha256".to_owned(), s(ca)));
    }
    map([
        (
            "metadata",
            map([
                ("labels", map([("tailmesh/service", s(name))])),
                ("annotations", Node::Map(annotations)),
            ]),
        ),
        ("spec", spec),
    ])
}

/// A ClusterIP Service over the pod of `name`; ports are `(name, number)`,
/// gRPC unless named `ui` (HTTP) or `generators` (the load generators'
/// own TCP protocol).
fn cluster_service(metadata: Node, name: &str, ports: &[(&str, u16)]) -> Node {
    map([
        ("apiVersion", s("v1")),
        ("kind", s("Service")),
        ("metadata", metadata),
        (
            "spec",
            map([
                ("selector", map([("tailmesh/service", s(name))])),
                (
                    "ports",
                    Node::Seq(
                        ports
                            .iter()
                            .map(|(port_name, number)| {
                                map([
                                    ("name", s(*port_name)),
                                    ("port", Node::Raw(number.to_string())),
                                    ("targetPort", Node::Raw(number.to_string())),
                                    (
                                        "appProtocol",
                                        s(match *port_name {
                                            "ui" => "http",
                                            // Length-prefixed JSON over TCP.
                                            "generators" => "tcp",
                                            _ => "grpc",
                                        }),
                                    ),
                                ])
                            })
                            .collect(),
                    ),
                ),
            ]),
        ),
    ])
}

fn env_var(name: &str, value: impl Into<String>) -> Node {
    map([("name", s(name)), ("value", s(value))])
}

/// The volumes (scenario, token when `token`) and their mounts. With
/// `tls` (the identity whose certificate the pod holds), the scenario's
/// volume also projects the TLS Secret's CA and that identity's
/// certificate and key into `tls/` ([`tls::TLS_DIR`] in the pod), so no
/// volume is mounted inside another.
fn volumes(token: bool, tls: Option<&str>) -> (Vec<Node>, Vec<Node>) {
    let scenario = match tls {
        None => map([
            ("name", s("scenario")),
            ("configMap", map([("name", s("scenario"))])),
        ]),
        Some(identity) => {
            let item = |key: String, file: &str| {
                map([("key", s(key)), ("path", s(format!("tls/{file}")))])
            };
            map([
                ("name", s("scenario")),
                (
                    "projected",
                    map([(
                        "sources",
                        Node::Seq(vec![
                            map([("configMap", map([("name", s("scenario"))]))]),
                            map([(
                                "secret",
                                map([
                                    ("name", s(TLS_SECRET)),
                                    (
                                        "items",
                                        Node::Seq(vec![
                                            item("ca.crt".to_owned(), tls::CA_FILE),
                                            item(format!("{identity}.crt"), tls::CERT_FILE),
                                            item(format!("{identity}.key"), tls::KEY_FILE),
                                        ]),
                                    ),
                                ]),
                            )]),
                        ]),
                    )]),
                ),
            ])
        }
    };
    let mut volumes = vec![scenario];
    let mut mounts = vec![map([
        ("name", s("scenario")),
        ("mountPath", s(SCENARIO_DIR)),
        ("readOnly", Node::Raw("true".into())),
    ])];
    if token {
        volumes.push(map([
            ("name", s("control-token")),
            ("secret", map([("secretName", s(TOKEN_SECRET))])),
        ]));
        mounts.push(map([
            ("name", s("control-token")),
            ("mountPath", s(TOKEN_DIR)),
            ("readOnly", Node::Raw("true".into())),
        ]));
    }
    (volumes, mounts)
}

fn mesh_pod(service: &Service, options: &Options, ca: Option<&str>) -> Node {
    if let Some(broker) = service.broker_image() {
        let env = broker
            .env
            .into_iter()
            .map(|(k, v)| env_var(&k, v))
            .collect();
        let mut container = vec![
            ("name".to_owned(), s("broker")),
            ("image".to_owned(), s(broker.image)),
            ("imagePullPolicy".to_owned(), s("IfNotPresent")),
        ];
        if !broker.args.is_empty() {
            container.push(("args".to_owned(), flow(broker.args)));
        }
        container.extend([
            ("env".to_owned(), Node::Seq(env)),
            (
                "ports".to_owned(),
                Node::Seq(vec![port("broker", broker.port)]),
            ),
            (
                "readinessProbe".to_owned(),
                map([
                    ("exec", map([("command", flow(broker.health))])),
                    ("periodSeconds", Node::Raw("2".into())),
                    ("timeoutSeconds", Node::Raw("5".into())),
                ]),
            ),
            ("resources".to_owned(), requests("250m", "256Mi")),
        ]);
        return map([("containers", Node::Seq(vec![Node::Map(container)]))]);
    }
    let mut env: Vec<Node> = service
        .env()
        .into_iter()
        .map(|(k, v)| env_var(&k, v))
        .collect();
    if let Some(ca) = ca {
        env.push(env_var(tls::CA_SHA256_ENV, ca));
    }
    let (volumes, mounts) = volumes(service.control, ca.map(|_| service.name.as_str()));
    // The kubelet's gRPC probe speaks plaintext: a TLS pod is probed by
    // `tailmesh health` over TLS, with its own certificate.
    let probe = match ca {
        None => map([
            ("grpc", map([("port", Node::Raw(SERVICE_PORT.to_string()))])),
            ("periodSeconds", Node::Raw("2".into())),
        ]),
        Some(_) => map([
            ("exec", map([("command", flow(service.health_command()))])),
            ("periodSeconds", Node::Raw("2".into())),
            ("timeoutSeconds", Node::Raw("5".into())),
        ]),
    };
    let mut container = vec![
        ("name".to_owned(), s("tailmesh")),
        ("image".to_owned(), s(&options.image)),
        ("imagePullPolicy".to_owned(), s("IfNotPresent")),
        ("args".to_owned(), flow(service.command())),
        ("env".to_owned(), Node::Seq(env)),
        (
            "ports".to_owned(),
            Node::Seq(vec![port("grpc", SERVICE_PORT)]),
        ),
        ("readinessProbe".to_owned(), probe),
        ("resources".to_owned(), requests("250m", "64Mi")),
        ("volumeMounts".to_owned(), Node::Seq(mounts)),
    ];
    if service.net_faults {
        container.push((
            "securityContext".to_owned(),
            map([("capabilities", map([("add", flow(["NET_ADMIN"]))]))]),
        ));
    }
    let mut containers = vec![Node::Map(container)];
    if let Some(work) = &service.work {
        containers.push(work_container(work));
    }
    map([
        ("containers", Node::Seq(containers)),
        ("volumes", Node::Seq(volumes)),
    ])
}

/// A hop replica's own service, the pod's second container: the
/// scenario's command in its image, with the environment the local
/// launcher gives a service it starts, ready once its port accepts
/// connections (a probe that needs no tool in its image; the sidecar
/// waits for it too, and checks gRPC health where it is served).
fn work_container(work: &HopWorkService) -> Node {
    map([
        ("name", s("service")),
        ("image", s(&work.image)),
        ("imagePullPolicy", s("IfNotPresent")),
        ("command", flow(work.command.iter().map(String::as_str))),
        (
            "env",
            Node::Seq(work.env.iter().map(|(k, v)| env_var(k, v)).collect()),
        ),
        ("ports", Node::Seq(vec![port("service", HOP_SERVICE_PORT)])),
        (
            "readinessProbe",
            map([
                (
                    "tcpSocket",
                    map([("port", Node::Raw(HOP_SERVICE_PORT.to_string()))]),
                ),
                ("periodSeconds", Node::Raw("2".into())),
            ]),
        ),
        ("resources", requests("250m", "128Mi")),
    ])
}

/// The load generators: an Indexed Job of `count` pods at once, each
/// reaching the orchestrator by its Service, showing the token, and with
/// TLS the orchestrator's certificate (it calls the entry hops as the
/// orchestrator would).
fn generators_job(
    metadata: Node,
    digest: &str,
    options: &Options,
    count: u32,
    ca: Option<&str>,
) -> Node {
    let hub = format!("orchestrator:{GENERATOR_HUB_PORT}");
    load_side_job(
        metadata,
        digest,
        options,
        ca,
        LoadSide {
            pod: "generator",
            args: generator_command(&hub, None),
            token: true,
            ports: Vec::new(),
            extra: Vec::new(),
            indexed: Some(count),
        },
    )
}

fn orchestrator_job(
    metadata: Node,
    digest: &str,
    options: &Options,
    sampling: f64,
    token: bool,
    ca: Option<&str>,
    generators: bool,
) -> Node {
    let mut ports = vec![port("otlp-grpc", TRACE_PORT)];
    if generators {
        ports.push(port("generators", GENERATOR_HUB_PORT));
    }
    load_side_job(
        metadata,
        digest,
        options,
        ca,
        LoadSide {
            pod: "orchestrator",
            // Pods may wait for image pulls and scheduling: wait longer
            // than Compose, whose orchestrator starts once the hops are
            // healthy.
            args: orchestrator_command(sampling, Some("10m"), ca.is_some(), generators),
            token,
            ports,
            extra: vec![(
                map([
                    ("name", s("results")),
                    ("persistentVolumeClaim", map([("claimName", s("results"))])),
                ]),
                map([("name", s("results")), ("mountPath", s("/results"))]),
            )],
            indexed: None,
        },
    )
}

/// What a Job of the load's side runs.
struct LoadSide {
    /// Its pods' name.
    pod: &'static str,
    args: Vec<String>,
    /// Whether it reads the Control token.
    token: bool,
    ports: Vec<Node>,
    /// Volumes of its own, with their mounts.
    extra: Vec<(Node, Node)>,
    /// An Indexed Job of this many pods at once, rather than one pod.
    indexed: Option<u32>,
}

/// A Job of the load's side (the orchestrator, the load generators): the
/// tailmesh image running `side.args` with a whole core (each is a
/// measuring instrument), the Control token when `side.token`, and with
/// TLS (`ca`) the orchestrator's certificates.
fn load_side_job(
    metadata: Node,
    digest: &str,
    options: &Options,
    ca: Option<&str>,
    side: LoadSide,
) -> Node {
    let (mut volumes, mut mounts) = volumes(side.token, ca.map(|_| tls::ORCHESTRATOR));
    for (volume, mount) in side.extra {
        volumes.push(volume);
        mounts.push(mount);
    }
    let mut env = Vec::new();
    if side.token {
        env.push(env_var(TOKEN_FILE_ENV, TOKEN_FILE));
    }
    if let Some(ca) = ca {
        env.push(env_var(tls::CA_SHA256_ENV, ca));
    }
    let mut container = vec![
        ("name".to_owned(), s(side.pod)),
        ("image".to_owned(), s(&options.image)),
        ("imagePullPolicy".to_owned(), s("IfNotPresent")),
        ("args".to_owned(), flow(side.args)),
    ];
    if !env.is_empty() {
        container.push(("env".to_owned(), Node::Seq(env)));
    }
    if !side.ports.is_empty() {
        container.push(("ports".to_owned(), Node::Seq(side.ports)));
    }
    container.extend([
        ("resources".to_owned(), requests("1", "256Mi")),
        ("volumeMounts".to_owned(), Node::Seq(mounts)),
    ]);
    let mut spec = Vec::new();
    if let Some(count) = side.indexed {
        let count = Node::Raw(count.to_string());
        spec.extend([
            ("completionMode".to_owned(), s("Indexed")),
            ("completions".to_owned(), count.clone()),
            ("parallelism".to_owned(), count),
        ]);
    }
    spec.extend([
        ("backoffLimit".to_owned(), Node::Raw("0".into())),
        (
            "template".to_owned(),
            pod_template(
                side.pod,
                digest,
                ca,
                map([
                    ("restartPolicy", s("Never")),
                    ("containers", Node::Seq(vec![Node::Map(container)])),
                    ("volumes", Node::Seq(volumes)),
                ]),
            ),
        ),
    ]);
    map([
        ("apiVersion", s("batch/v1")),
        ("kind", s("Job")),
        ("metadata", metadata),
        ("spec", Node::Map(spec)),
    ])
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// Two hops under mutual TLS.
    const MTLS: &str = "name = \"sec\"\n[load]\nmode = \"open\"\nrate = 10\nrequests = 10\n\
        [mesh]\ntls = \"mtls\"\n[[hop]]\nname = \"a\"\n[[hop]]\nname = \"b\"\n";

    fn generate_in(text: &str, ca_dir: &Path) -> Manifests {
        let scenario = crate::scenario::parse(text, "s.toml").unwrap_or_else(|e| panic!("{e}"));
        let options = Options {
            ca_dir: Some(ca_dir.to_path_buf()),
            ..Options::default()
        };
        generate(&scenario, text, &options).unwrap_or_else(|e| panic!("{e}"))
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .permissions()
            .mode()
            & 0o777
    }

    #[test]
    fn a_ca_folder_gives_the_same_secret_on_every_generation_without_its_key() {
        let scratch = tempfile::tempdir().expect("a temp dir");
        let ca_dir = scratch.path().join("ca");
        let first = generate_in(MTLS, &ca_dir);
        assert!(first.has_keys());
        let report = first.ca_folder.as_ref().expect("the CA folder's report");
        assert!(!report.ca_kept && report.issued.len() == 3, "{report}");
        assert_eq!(mode(&ca_dir.join(tls::CA_KEY_FILE)), 0o600);

        // The CA's key is in its folder, in no manifest; its certificate is
        // the Secret's ca.crt.
        let key = std::fs::read_to_string(ca_dir.join(tls::CA_KEY_FILE)).expect("ca.key");
        let ca = std::fs::read_to_string(ca_dir.join(tls::CA_FILE)).expect("ca.crt");
        let body = |line: &str| line.trim().to_owned();
        let key_lines: Vec<String> = key
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .map(body)
            .collect();
        assert!(!key_lines.is_empty());
        let all: String = first.files.iter().map(|(_, text)| text.as_str()).collect();
        for line in &key_lines {
            assert!(
                !all.contains(line.as_str()),
                "the CA key's {line} in the manifests"
            );
        }
        let secret = &first
            .files
            .iter()
            .find(|(name, _)| name == TLS_FILE)
            .expect("the Secret")
            .1;
        let ca_body = ca.lines().nth(1).expect("a line of the CA certificate");
        assert!(secret.contains(ca_body), "{secret}");

        // Again: every file the same, to the byte, so applying it again
        // replaces no pod.
        let second = generate_in(MTLS, &ca_dir);
        let report = second.ca_folder.as_ref().expect("the CA folder's report");
        assert!(report.ca_kept && report.issued.is_empty(), "{report}");
        assert_eq!(report.kept.len(), 3);
        assert_eq!(second.files, first.files);

        // A hop added: the same CA, the others' certificates and keys as
        // they were, one more in the Secret.
        let grown = generate_in(&format!("{MTLS}[[hop]]\nname = \"c\"\n"), &ca_dir);
        let report = grown.ca_folder.as_ref().expect("the CA folder's report");
        assert_eq!(report.issued, [("hop-c-0".to_owned(), None)]);
        let grown_secret = &grown
            .files
            .iter()
            .find(|(name, _)| name == TLS_FILE)
            .expect("the Secret")
            .1;
        assert!(grown_secret.contains("hop-c-0.key: |"), "{grown_secret}");
        let keys = |text: &str| text.lines().filter(|l| l.contains(".key: |")).count();
        assert_eq!(keys(grown_secret), keys(secret) + 1);
        for line in secret.lines().filter(|l| l.starts_with("    ")) {
            assert!(grown_secret.contains(line), "{line} kept");
        }

        // Written to a folder, the Secret's file is its owner's only.
        let out = scratch.path().join("manifests");
        write_dir(&out, &second.files).expect("written");
        assert_eq!(mode(&out.join(TLS_FILE)), 0o600);
        assert_eq!(mode(&out.join("20-mesh.yaml")) & 0o600, 0o600);
        std::fs::set_permissions(out.join(TLS_FILE), std::fs::Permissions::from_mode(0o644))
            .expect("chmod");
        write_dir(&out, &second.files).expect("written again");
        assert_eq!(mode(&out.join(TLS_FILE)), 0o600, "made private again");
    }

    #[test]
    fn without_tls_a_ca_folder_is_neither_made_nor_named() {
        let scratch = tempfile::tempdir().expect("a temp dir");
        let ca_dir = scratch.path().join("ca");
        let plain = MTLS.replace("tls = \"mtls\"", "");
        let manifests = generate_in(&plain, &ca_dir);
        assert!(!manifests.has_keys());
        assert!(manifests.ca_folder.is_none());
        assert!(!ca_dir.exists());
    }
}
