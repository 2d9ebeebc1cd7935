//! `tailmesh compose`: a Docker Compose file for a scenario. One container
//! per hop replica (and the broker), each deriving its configuration from
//! the scenario embedded in the file; Jaeger; an orchestrator container
//! that waits for every hop to be healthy, runs the experiment against
//! them (`tailmesh run --attach`), forwards spans to Jaeger and writes the
//! results to the host. Containers whose replica has a network fault get
//! NET_ADMIN and the Control token, which a one-shot service draws fresh
//! for every deployment. With TLS, each tailmesh container and the
//! orchestrator mount their own folder of the deployment's certificates
//! ([`TlsFolder`], made by [`super::tls::compose_folder`]).

use super::{
    DeployError, GENERATOR_HUB_PORT, HopWorkService, Runtime, SCENARIO_PATH, SERVICE_PORT, Service,
    TOKEN_DIR, TOKEN_FILE, TOKEN_FILE_ENV, digest, generator_command, generator_count, needs_token,
    orchestrator_command, project_name, services,
    tls::{CA_SHA256_ENV, TLS_DIR},
    yaml::{Node, flow, map, render, s},
};
use crate::scenario::Scenario;

/// The Jaeger v2 image: OTLP in, the UI on 16686.
pub const JAEGER_IMAGE: &str = "jaegertracing/jaeger:2.15.0";

/// What the generated file may assume.
#[derive(Clone, Debug)]
pub struct Options {
    /// The tailmesh image.
    pub image: String,
    /// Whether containers may get NET_ADMIN.
    pub net_admin: bool,
    /// The image's build context, relative to the Compose file.
    pub context: String,
    /// The host folder for results, relative to the Compose file.
    pub results: String,
    /// The TLS folder, needed when a variant turns TLS on.
    pub tls: Option<TlsFolder>,
}

/// A deployment's TLS folder ([`super::tls::compose_folder`]): one
/// subfolder per service, mounted at [`TLS_DIR`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFolder {
    /// Its path relative to the Compose file (`./tailmesh-<scenario>-tls`).
    pub path: String,
    /// The SHA-256 of its CA certificate, hex.
    pub ca_sha256: String,
}

/// The TLS folder's name for `scenario`, beside the Compose file.
pub fn tls_folder_name(scenario: &Scenario) -> String {
    format!("{}-tls", project_name(scenario))
}

impl Default for Options {
    fn default() -> Self {
        Self {
            image: super::DEFAULT_IMAGE.to_owned(),
            net_admin: true,
            context: ".".to_owned(),
            results: "./results".to_owned(),
            tls: None,
        }
    }
}

/// What a Compose deployment with `options` allows.
pub fn runtime(options: &Options) -> Runtime {
    Runtime {
        name: "Docker Compose",
        net_admin: options.net_admin,
        pod: false,
    }
}

/// The Compose file for `scenario`, whose file text is `text` (embedded,
/// so the containers run exactly what was generated from). A variant with
/// TLS on needs `options.tls`, the folder of the certificates.
pub fn generate(scenario: &Scenario, text: &str, options: &Options) -> Result<String, DeployError> {
    let runtime = runtime(options);
    let services = services(scenario, runtime)?;
    let generators = generator_count(scenario);
    // Generators show the token to the orchestrator they serve.
    let token = needs_token(&services) || generators > 1;
    let sampling = scenario.telemetry.sampling;
    let tls = match &options.tls {
        _ if !services.iter().any(|s| s.tls.is_on()) => None,
        Some(folder) => Some(folder),
        None => {
            return Err(DeployError::Undeployable {
                scenario: scenario.name.clone(),
                runtime: runtime.name,
                problems: vec![format!(
                    "[mesh] tls is on: the certificates are written to a folder beside the \
                     Compose file ({}/), so give the file's path: tailmesh compose -o FILE",
                    tls_folder_name(scenario)
                )],
            });
        }
    };
    let scenario_sha256 = digest(text);

    let mut entries: Vec<(String, Node)> = Vec::new();
    if token {
        entries.push((
            "control-token".into(),
            map([
                ("<<", Node::Raw("*tailmesh".into())),
                ("command", flow(["token", TOKEN_FILE])),
                ("healthcheck", map([("disable", Node::Raw("true".into()))])),
                (
                    "volumes",
                    Node::Seq(vec![s(format!("control-token:{TOKEN_DIR}"))]),
                ),
            ]),
        ));
    }
    for service in &services {
        let tls = tls.filter(|_| service.tls.is_on());
        entries.push((
            service.name.clone(),
            mesh_service(service, tls, &scenario_sha256),
        ));
        if let Some(work) = &service.work {
            entries.push((work.name.clone(), work_service(work, &scenario_sha256)));
        }
    }
    let generator_names: Vec<String> = (0..generators)
        .filter(|_| generators > 1)
        .map(|k| format!("generator-{k}"))
        .collect();
    for (k, name) in (0u32..).zip(&generator_names) {
        entries.push((name.clone(), generator(k, tls, &scenario_sha256)));
    }
    entries.push((
        "orchestrator".into(),
        orchestrator(
            &services,
            &generator_names,
            sampling,
            token,
            options,
            tls,
            &scenario_sha256,
        ),
    ));
    entries.push((
        "jaeger".into(),
        map([
            ("image", s(JAEGER_IMAGE)),
            ("ports", Node::Seq(vec![s("16686:16686")])),
        ]),
    ));

    let mut top = vec![
        ("name".to_owned(), s(project_name(scenario))),
        (
            "x-tailmesh".to_owned(),
            Node::Anchored(
                "tailmesh".into(),
                vec![
                    ("image".into(), s(&options.image)),
                    (
                        "build".into(),
                        map([
                            ("context", s(&options.context)),
                            ("dockerfile", s("deploy/docker/Dockerfile")),
                        ]),
                    ),
                    (
                        "configs".into(),
                        Node::Seq(vec![map([
                            ("source", s("scenario")),
                            ("target", s(SCENARIO_PATH)),
                        ])]),
                    ),
                    (
                        "labels".into(),
                        map([("tailmesh.scenario-sha256", s(&scenario_sha256))]),
                    ),
                    (
                        "healthcheck".into(),
                        map([
                            (
                                "test",
                                flow([
                                    "CMD",
                                    "tailmesh",
                                    "health",
                                    &format!("127.0.0.1:{SERVICE_PORT}"),
                                ]),
                            ),
                            ("interval", s("1s")),
                            ("timeout", s("3s")),
                            ("retries", Node::Raw("60".into())),
                        ]),
                    ),
                ],
            ),
        ),
        ("services".to_owned(), Node::Map(entries)),
        (
            "configs".to_owned(),
            // Compose interpolates `$` everywhere, configs included.
            map([(
                "scenario",
                map([("content", Node::Block(text.replace('$', "$$")))]),
            )]),
        ),
    ];
    if token {
        top.push((
            "volumes".to_owned(),
            map([("control-token", Node::Map(Vec::new()))]),
        ));
    }
    Ok(format!(
        "{}{}",
        header(scenario, options),
        render(&Node::Map(top))
    ))
}

fn header(scenario: &Scenario, options: &Options) -> String {
    format!(
        "# Generated by `tailmesh compose` from scenario {:?}; do not edit by hand:\n\
         # change the scenario and generate again (a test keeps the committed\n\
         # docker-compose.yml in sync with scenarios/default.toml).\n\
         #\n\
         #   docker compose up     build the image, start the mesh and Jaeger, run the\n\
         #                         experiment; results go to {}\n\
         #   http://localhost:16686  Jaeger: service \"loadgen\", one trace per request\n\
         #   docker compose down -v  remove every container, network and volume\n",
        scenario.name, options.results
    )
}

/// Adds a TLS service's parts: its folder mounted read-only at
/// [`TLS_DIR`] to `volumes`, the CA's digest to `env` (where its
/// certificates are checked against it) and, as a label, to `entries`
/// (with the scenario's, which a service's own `labels` would otherwise
/// hide).
fn add_tls(
    name: &str,
    tls: &TlsFolder,
    scenario_sha256: &str,
    volumes: &mut Vec<Node>,
    env: &mut Vec<(String, Node)>,
    entries: &mut Vec<(String, Node)>,
) {
    volumes.push(s(format!("{}/{name}:{TLS_DIR}:ro", tls.path)));
    env.push((CA_SHA256_ENV.to_owned(), s(&tls.ca_sha256)));
    entries.push((
        "labels".to_owned(),
        map([
            ("tailmesh.scenario-sha256", s(scenario_sha256)),
            ("tailmesh.tls-ca-sha256", s(&tls.ca_sha256)),
        ]),
    ));
}

fn mesh_service(service: &Service, tls: Option<&TlsFolder>, scenario_sha256: &str) -> Node {
    if let Some(broker) = service.broker_image() {
        let mut health = vec!["CMD".to_owned()];
        health.extend(broker.health);
        let mut entries = vec![("image".to_owned(), s(broker.image))];
        if !broker.args.is_empty() {
            entries.push(("command".to_owned(), flow(broker.args)));
        }
        if !broker.env.is_empty() {
            entries.push((
                "environment".to_owned(),
                Node::Map(broker.env.into_iter().map(|(k, v)| (k, s(v))).collect()),
            ));
        }
        entries.push((
            "healthcheck".to_owned(),
            map([
                ("test", flow(health)),
                ("interval", s("2s")),
                ("timeout", s("5s")),
                ("retries", Node::Raw("60".into())),
            ]),
        ));
        return Node::Map(entries);
    }
    let mut env: Vec<(String, Node)> = service.env().into_iter().map(|(k, v)| (k, s(v))).collect();
    let mut volumes = Vec::new();
    if service.control {
        volumes.push(s(format!("control-token:{TOKEN_DIR}:ro")));
    }
    let mut entries = vec![
        ("<<".to_owned(), Node::Raw("*tailmesh".into())),
        ("command".to_owned(), flow(service.command())),
    ];
    if let Some(tls) = tls {
        add_tls(
            &service.name,
            tls,
            scenario_sha256,
            &mut volumes,
            &mut env,
            &mut entries,
        );
        entries.push((
            "healthcheck".to_owned(),
            healthcheck(&service.health_command(), service.work.as_ref()),
        ));
    } else if let Some(work) = &service.work {
        entries.push((
            "healthcheck".to_owned(),
            healthcheck(&service.health_command(), Some(work)),
        ));
    }
    entries.push(("environment".to_owned(), Node::Map(env)));
    if service.net_faults {
        entries.push(("cap_add".to_owned(), flow(["NET_ADMIN"])));
    }
    if !volumes.is_empty() {
        entries.push(("volumes".to_owned(), Node::Seq(volumes)));
    }
    let mut depends = Vec::new();
    if service.control {
        depends.push((
            "control-token".to_owned(),
            map([("condition", s("service_completed_successfully"))]),
        ));
    }
    if let Some(work) = &service.work {
        // Started, not healthy: the service's image need not have a tool
        // to check it with; the sidecar waits for it before it serves.
        depends.push((
            work.name.clone(),
            map([("condition", s("service_started"))]),
        ));
    }
    if !depends.is_empty() {
        entries.push(("depends_on".to_owned(), Node::Map(depends)));
    }
    Node::Map(entries)
}

/// A hop replica's own service: the scenario's command in its image (the
/// whole command line, as `entrypoint`), with the environment the local
/// launcher gives a service it starts, and no health check of its own
/// (its sidecar waits for it, and is healthy only once it serves).
fn work_service(work: &HopWorkService, scenario_sha256: &str) -> Node {
    map([
        ("image", s(&work.image)),
        // Compose interpolates `$` in both.
        (
            "entrypoint",
            flow(work.command.iter().map(|w| w.replace('$', "$$"))),
        ),
        (
            "environment",
            Node::Map(
                work.env
                    .iter()
                    .map(|(k, v)| (k.clone(), s(v.replace('$', "$$"))))
                    .collect(),
            ),
        ),
        (
            "labels",
            map([("tailmesh.scenario-sha256", s(scenario_sha256))]),
        ),
    ])
}

/// A tailmesh container's health check running `command`; a sidecar
/// (`work`) waits up to its service's `ready_timeout` before it serves,
/// which its health check's start period allows for.
fn healthcheck(command: &[String], work: Option<&HopWorkService>) -> Node {
    let mut test = vec!["CMD".to_owned()];
    test.extend(command.iter().cloned());
    let mut entries = vec![
        ("test".to_owned(), flow(test)),
        ("interval".to_owned(), s("1s")),
        ("timeout".to_owned(), s("3s")),
        ("retries".to_owned(), Node::Raw("60".into())),
    ];
    if let Some(work) = work {
        entries.push((
            "start_period".to_owned(),
            s(format!("{}s", work.ready_timeout.as_secs() + 10)),
        ));
    }
    Node::Map(entries)
}

/// Load generator `index` of a scenario with `[load] generators` above 1:
/// it waits for the orchestrator, serves every variant and exits when the
/// run is over. It shows the deployment's token, and with TLS mounts the
/// orchestrator's certificates (it calls the entry hops as the
/// orchestrator would).
fn generator(index: u32, tls: Option<&TlsFolder>, scenario_sha256: &str) -> Node {
    let hub = format!("orchestrator:{GENERATOR_HUB_PORT}");
    load_side(
        generator_command(&hub, Some(index)),
        true,
        Vec::new(),
        Vec::new(),
        tls,
        scenario_sha256,
    )
}

fn orchestrator(
    services: &[Service],
    generators: &[String],
    sampling: f64,
    token: bool,
    options: &Options,
    tls: Option<&TlsFolder>,
    scenario_sha256: &str,
) -> Node {
    let mut depends: Vec<(String, Node)> = services
        .iter()
        .map(|svc| (svc.name.clone(), map([("condition", s("service_healthy"))])))
        .collect();
    // Started: they wait for the orchestrator, which waits for them.
    depends.extend(
        generators
            .iter()
            .map(|g| (g.clone(), map([("condition", s("service_started"))]))),
    );
    load_side(
        orchestrator_command(sampling, None, tls.is_some(), !generators.is_empty()),
        token,
        vec![s(format!("{}:/results", options.results))],
        depends,
        tls,
        scenario_sha256,
    )
}

/// A service of the load's side (the orchestrator, a load generator): the
/// tailmesh image running `command`, with no health check (it serves
/// nothing to check), `volumes` and `depends` of its own, then the Control
/// token when `token`, and with TLS the orchestrator's certificates.
fn load_side(
    command: Vec<String>,
    token: bool,
    mut volumes: Vec<Node>,
    mut depends: Vec<(String, Node)>,
    tls: Option<&TlsFolder>,
    scenario_sha256: &str,
) -> Node {
    let mut env = Vec::new();
    if token {
        depends.insert(
            0,
            (
                "control-token".to_owned(),
                map([("condition", s("service_completed_successfully"))]),
            ),
        );
        volumes.push(s(format!("control-token:{TOKEN_DIR}:ro")));
        env.push((TOKEN_FILE_ENV.to_owned(), s(TOKEN_FILE)));
    }
    let mut entries = vec![
        ("<<".to_owned(), Node::Raw("*tailmesh".into())),
        ("command".to_owned(), flow(command)),
        (
            "healthcheck".to_owned(),
            map([("disable", Node::Raw("true".into()))]),
        ),
    ];
    if let Some(tls) = tls {
        add_tls(
            super::tls::ORCHESTRATOR,
            tls,
            scenario_sha256,
            &mut volumes,
            &mut env,
            &mut entries,
        );
    }
    if !env.is_empty() {
        entries.push(("environment".to_owned(), Node::Map(env)));
    }
    entries.push(("volumes".to_owned(), Node::Seq(volumes)));
    if !depends.is_empty() {
        entries.push(("depends_on".to_owned(), Node::Map(depends)));
    }
    Node::Map(entries)
}
