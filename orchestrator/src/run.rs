//! `tailmesh run`: launch each variant's mesh, drive its load, stop it, and
//! hand the measurements to analysis and the writers.

use std::{
    collections::{BTreeMap, HashSet},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use indicatif::{ProgressBar, ProgressStyle};
use opentelemetry_proto::tonic::trace::v1::ResourceSpans;
use tailmesh_proto::pb;
use tailmesh_services::{
    addr::PeerAddr,
    broker::{BrokerClient, TopicStats},
    hop::{Connections, DownstreamConfig, HopConfig, PullTarget, PushPool},
    model::Transport,
    timer::Sleeper,
};
use tokio::sync::watch;

use crate::{
    deploy::{self, Addrs, Naming},
    launcher::{
        AnyLauncher, AttachedLauncher, LaunchError, LocalLauncher, NetnsLauncher, ProcessSpec,
        netns,
    },
    loadgen::{self, LoadOutcome, Target},
    netfault::{self, FaultRecord},
    scenario::{ConnectionMode, Hop, Launcher, LoadMode, NetFault, Scenario, Stop, Variant},
    traces::{collector::Collector, loadgen::LoadTracer},
};

/// How long hops get to finish requests in flight when a variant ends.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// Attached: spans have stopped arriving when none came for this long
/// (hops export every 200 ms).
const SPAN_QUIET: Duration = Duration::from_secs(1);
/// Attached: the longest wait for late spans after a variant.
const SPAN_SETTLE_LIMIT: Duration = Duration::from_secs(15);

/// Errors that stop a run before it measures anything.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A hop or broker process could not be started.
    #[error("variant \"{variant}\": {source}")]
    Launch {
        /// The variant.
        variant: String,
        /// Why.
        source: LaunchError,
    },
    /// A file or folder could not be written.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The entry pool could not be built.
    #[error("variant \"{variant}\": {message}")]
    Setup {
        /// The variant.
        variant: String,
        /// Why.
        message: String,
    },
}

/// What one variant's run produced.
#[derive(Debug)]
pub struct VariantRun {
    /// The variant as run.
    pub variant: Variant,
    /// The load generator's measurements.
    pub load: LoadOutcome,
    /// Things that went wrong while it ran (a hop process that died...).
    pub incidents: Vec<String>,
    /// The broker's per-topic statistics at the end (pull hops only).
    pub broker: Vec<TopicStats>,
    /// The network faults applied, with their mechanism.
    pub faults: Vec<FaultRecord>,
    /// The launcher that ran it: `"local"`, `"netns"` or `"attached"`.
    pub launcher: &'static str,
    /// The variant's spans, all flushed (its processes have exited).
    pub spans: Vec<ResourceSpans>,
    /// The load generator's tracer (which requests were sampled).
    pub tracer: Option<Arc<LoadTracer>>,
}

/// Where the run's spans go.
#[derive(Clone)]
pub struct TraceSetup {
    /// The embedded receiver's store.
    pub collector: Arc<Collector>,
    /// The receiver's `http://127.0.0.1:port`, handed to every process.
    pub endpoint: String,
    /// The share of requests traced, 0.0 to 1.0.
    pub sampling: f64,
}

impl std::fmt::Debug for TraceSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceSetup")
            .field("endpoint", &self.endpoint)
            .field("sampling", &self.sampling)
            .finish()
    }
}

/// Asks a service process to export its spans to the run's receiver.
fn traced(
    spec: ProcessSpec,
    traces: Option<&TraceSetup>,
    service: &str,
    variant: &str,
) -> ProcessSpec {
    match traces {
        None => spec,
        Some(t) => spec
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &t.endpoint)
            .env("OTEL_SERVICE_NAME", service)
            .env("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
            .env("OTEL_TRACES_SAMPLER_ARG", t.sampling.to_string())
            .env(tailmesh_services::telemetry::VARIANT_ENV, variant),
    }
}

/// Which launcher a variant gets: `auto` becomes netns when the variant
/// has network faults and the process may build namespaces. Netns without
/// the privilege or the tools fails here, before anything starts; the
/// error says what is needed.
pub fn resolve_launcher(variant: &Variant) -> Result<Launcher, String> {
    let wanted = match variant.launcher {
        Launcher::Auto if variant.has_net_faults() => Launcher::Netns,
        Launcher::Auto => Launcher::Local,
        other => other,
    };
    if wanted != Launcher::Netns {
        return Ok(wanted);
    }
    let why = if variant.has_net_faults() {
        "its network faults need the netns launcher, which"
    } else {
        "launcher = \"netns\""
    };
    if !netns::has_privilege() {
        return Err(format!(
            "{why} needs root or CAP_NET_ADMIN and CAP_SYS_ADMIN (to create network \
             namespaces): run as root (sudo), or remove the net/replica_net faults to run \
             with the local launcher"
        ));
    }
    let missing = netns::missing_tools();
    if !missing.is_empty() {
        let list: Vec<String> = missing
            .iter()
            .map(|(tool, package)| format!("{tool} (Debian package {package})"))
            .collect();
        return Err(format!("{why} needs {}", list.join(", ")));
    }
    Ok(Launcher::Netns)
}

/// Options of a run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The run's folder (`results/<scenario>/<run-id>`).
    pub dir: PathBuf,
    /// The binary to re-execute for every hop (normally `current_exe()`).
    pub exe: PathBuf,
    /// Show a progress bar on variants longer than two seconds.
    pub progress: bool,
    /// Tracing, when on.
    pub traces: Option<TraceSetup>,
    /// Run against services already running (Docker Compose, Kubernetes)
    /// instead of starting processes.
    pub attach: Option<Attach>,
}

/// How `tailmesh run --attach` finds and controls a deployed mesh.
#[derive(Clone, Debug)]
pub struct Attach {
    /// The fault agents' Control token, when the deployment has one.
    pub token: Option<String>,
    /// How long to wait for each service to answer health checks.
    pub ready_timeout: Duration,
}

/// Runs every variant of `scenario` in turn. Ctrl-C (`interrupt` turning
/// true) stops sending, waits for requests in flight, stops the hops and
/// skips the remaining variants; what was measured is still returned.
pub async fn run_variants(
    scenario: &Scenario,
    options: &RunOptions,
    interrupt: watch::Receiver<bool>,
) -> Result<Vec<VariantRun>, RunError> {
    // Every variant's launcher is checked before the first one starts.
    let mut launchers = Vec::with_capacity(scenario.variants.len());
    for variant in &scenario.variants {
        if options.attach.is_some() {
            launchers.push(Launcher::Auto);
            continue;
        }
        match resolve_launcher(variant) {
            Ok(kind) => launchers.push(kind),
            Err(message) => {
                return Err(RunError::Setup {
                    variant: variant.name.clone(),
                    message,
                });
            }
        }
    }
    if launchers.contains(&Launcher::Netns) {
        // Leftovers of runs that crashed (their orchestrator is gone).
        for line in netns::clean() {
            eprintln!("removed leftover {line}");
        }
    }
    let mut runs = Vec::new();
    for (variant, kind) in scenario.variants.iter().zip(launchers) {
        if *interrupt.borrow() {
            break;
        }
        let replicas: u32 = variant.hops.iter().map(|h| h.replicas).sum();
        eprintln!(
            "variant {}: {} hop(s), {replicas} process(es), {}",
            variant.name,
            variant.hops.len(),
            describe_load(&variant.load)
        );
        runs.push(run_variant(scenario, variant, kind, options, interrupt.clone()).await?);
    }
    Ok(runs)
}

async fn run_variant(
    scenario: &Scenario,
    variant: &Variant,
    kind: Launcher,
    options: &RunOptions,
    interrupt: watch::Receiver<bool>,
) -> Result<VariantRun, RunError> {
    let log_dir = options.dir.join("logs").join(&variant.name);
    std::fs::create_dir_all(&log_dir).map_err(|source| RunError::Io {
        what: "create",
        path: log_dir.clone(),
        source,
    })?;
    let setup = |message: String| RunError::Setup {
        variant: variant.name.clone(),
        message,
    };
    let mut launcher = if let Some(attach) = &options.attach {
        AnyLauncher::Attached(
            AttachedLauncher::new(Naming::for_variant(scenario, variant), attach.token.clone())
                .with_ready_timeout(attach.ready_timeout),
        )
    } else if kind == Launcher::Netns {
        let netns = NetnsLauncher::new(log_dir.clone()).map_err(|e| setup(e.to_string()))?;
        let net = netns.network();
        eprintln!(
            "variant {}: netns launcher, run {} (namespaces tm{}*)",
            variant.name,
            net.id(),
            net.id()
        );
        // Every fault is checked against the kernel before a process starts;
        // on error the launcher's drop removes the network.
        let netem = netfault::netem_available(&net.hub(), &format!("tm{}u", net.id()));
        let iptables = netns::tool_available("iptables");
        for hop in &variant.hops {
            for replica in 0..hop.replicas {
                if let Some(fault) = hop.net_of(replica) {
                    netfault::check(&hop.name, replica, fault, netem, iptables)
                        .map_err(|e| setup(e.to_string()))?;
                }
            }
        }
        AnyLauncher::Netns(netns)
    } else {
        AnyLauncher::Local(LocalLauncher::new(log_dir.clone()))
    };
    let result = measure(
        scenario,
        variant,
        options,
        &mut launcher,
        &log_dir,
        interrupt,
    )
    .await;
    let stopped = launcher.shutdown(STOP_GRACE).await;
    let mut run = result?;
    if let Some(t) = &options.traces {
        // Stopped processes have flushed their spans; attached services
        // keep running and send their last batches on their exporters'
        // schedule, so wait until those stop coming.
        if options.attach.is_some() {
            let late = t.collector.settle(SPAN_QUIET, SPAN_SETTLE_LIMIT).await;
            if !late.is_empty() {
                run.incidents.push(late);
            }
        }
        run.spans = t.collector.take();
    }
    for child in stopped.iter().filter(|c| c.forced) {
        run.incidents.push(child.to_string());
    }
    Ok(run)
}

async fn measure(
    scenario: &Scenario,
    variant: &Variant,
    options: &RunOptions,
    launcher: &mut AnyLauncher,
    log_dir: &Path,
    interrupt: watch::Receiver<bool>,
) -> Result<VariantRun, RunError> {
    let setup = |message: String| RunError::Setup {
        variant: variant.name.clone(),
        message,
    };
    let launch_error = |source| RunError::Launch {
        variant: variant.name.clone(),
        source,
    };
    // One broker serves every hop reached by pull; its topics are their names.
    let topics: Vec<&str> = variant
        .hops
        .iter()
        .filter(|h| h.transport == Transport::Pull)
        .map(|h| h.name.as_str())
        .collect();
    let broker = if topics.is_empty() {
        None
    } else {
        let spec = ProcessSpec::new("broker", &options.exe)
            .arg("broker")
            .arg("--topics")
            .arg(topics.join(","));
        let spec = traced(spec, options.traces.as_ref(), "broker", &variant.name);
        Some(launcher.launch(spec).await.map_err(launch_error)?)
    };
    let addrs = launch_hops(
        scenario.seed,
        variant,
        broker.clone(),
        options,
        launcher,
        log_dir,
    )
    .await?;
    let entry = &variant.hops[0];
    let target = match (entry.transport, broker.clone()) {
        (Transport::Pull, Some(broker)) => {
            Target::pull(PullTarget::new(broker, &entry.name), entry.client.clone())
        }
        _ => {
            let connections = match variant.load.connection {
                ConnectionMode::Shared { connections } => Connections::Shared(connections as usize),
                ConnectionMode::PerRequest => Connections::PerRequest,
            };
            let pool = PushPool::new(
                &entry.name,
                addrs
                    .hops
                    .get(&entry.name)
                    .map(Vec::as_slice)
                    .unwrap_or_default(),
                entry.balance,
                connections,
                scenario.seed,
                "loadgen",
            )
            .map_err(|e| setup(e.to_string()))?;
            Target::push(pool, entry.client.clone())
        }
    };
    let mut faults = Faults::plan(variant, launcher, &addrs.hops);
    faults.start(Duration::ZERO).await;
    let progress = options.progress.then(|| progress_bar(variant)).flatten();
    let tracer = options.traces.as_ref().map(|t| {
        Arc::new(LoadTracer::new(
            Arc::clone(&t.collector),
            &variant.name,
            t.sampling,
            scenario.seed ^ run_nonce(&options.dir, &variant.name),
        ))
    });
    let load_tracer = tracer.clone();
    let (done_tx, mut done_rx) = watch::channel(false);
    let generate = async {
        let outcome = loadgen::generate(
            target,
            &variant.load,
            scenario.seed,
            Sleeper::Precise,
            progress,
            interrupt,
            load_tracer,
        )
        .await;
        let _ = done_tx.send(true);
        outcome
    };
    // Watch the hop processes while the load runs: one that dies is named,
    // and its requests are counted as errors by the load generator.
    let load_start = tokio::time::Instant::now();
    let watch_children = async {
        let mut incidents = Vec::new();
        loop {
            tokio::select! {
                _ = done_rx.wait_for(|d| *d) => break,
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
            // Fault schedules advance at this 200 ms granularity.
            faults.start(load_start.elapsed()).await;
            for child in launcher.exited() {
                let line = format!("{child} while the load was running");
                eprintln!("warning: variant {}: {line}", variant.name);
                incidents.push(line);
            }
        }
        incidents
    };
    let (load, mut incidents) = tokio::join!(generate, watch_children);
    let (faults, fault_incidents) = faults.finish().await;
    incidents.extend(fault_incidents);
    let broker = match broker {
        Some(addr) => match broker_stats(&addr).await {
            Ok(stats) => stats,
            Err(e) => {
                incidents.push(format!("broker statistics unavailable: {e}"));
                Vec::new()
            }
        },
        None => Vec::new(),
    };
    Ok(VariantRun {
        variant: variant.clone(),
        load,
        incidents,
        broker,
        faults,
        launcher: launcher.kind(),
        spans: Vec::new(),
        tracer,
    })
}

/// The network faults of a variant: set through each replica's fault
/// agent (its Control API, with the run's token) when their start comes,
/// cleared when their duration ends, and all cleared when the load ends.
struct Faults {
    token: String,
    pending: Vec<PlannedFault>,
    done: Vec<FaultRecord>,
    incidents: Vec<String>,
}

struct PlannedFault {
    addr: PeerAddr,
    /// The connection to the agent, opened before its fault is applied and
    /// kept for clearing it: a new connection across a lossy link can take
    /// longer to set up than the call allows (a SYN lost twice is 3 s).
    channel: Option<tonic::transport::Channel>,
    record: FaultRecord,
    fault: NetFault,
    applied: bool,
}

impl Faults {
    fn plan(
        variant: &Variant,
        launcher: &AnyLauncher,
        addrs: &BTreeMap<String, Vec<PeerAddr>>,
    ) -> Self {
        let mut faults = Self {
            token: String::new(),
            pending: Vec::new(),
            done: Vec::new(),
            incidents: Vec::new(),
        };
        for hop in &variant.hops {
            for replica in 0..hop.replicas {
                let Some(fault) = hop.net_of(replica).filter(|f| f.is_active()) else {
                    continue;
                };
                let role = deploy::hop_role(&hop.name, replica);
                let addr = addrs.get(&hop.name).and_then(|a| a.get(replica as usize));
                let (Some((token, place)), Some(addr)) = (launcher.fault_place(&role), addr) else {
                    faults.incidents.push(format!(
                        "hop \"{}\" replica {replica}: fault not applied: the {} launcher has \
                         no fault agent for it{}",
                        hop.name,
                        launcher.kind(),
                        if launcher.kind() == "attached" {
                            " (the deployment has no Control token: was it generated from this \
                             scenario?)"
                        } else {
                            ""
                        }
                    ));
                    continue;
                };
                faults.token = token.to_owned();
                faults.pending.push(PlannedFault {
                    addr: addr.clone(),
                    channel: None,
                    record: FaultRecord {
                        hop: hop.name.clone(),
                        replica,
                        namespace: place,
                        loss: fault.loss,
                        delay_us: u64::try_from(fault.delay.as_micros()).unwrap_or(u64::MAX),
                        jitter_us: u64::try_from(fault.jitter.as_micros()).unwrap_or(u64::MAX),
                        start_ms: netfault::ms(fault.start),
                        duration_ms: fault.duration.map(netfault::ms),
                        mechanisms: Vec::new(),
                        packets: None,
                    },
                    fault: fault.clone(),
                    applied: false,
                });
            }
        }
        faults
    }

    /// Applies faults whose start has come and clears those whose
    /// duration is over, `now` from the start of the load.
    async fn start(&mut self, now: Duration) {
        let mut i = 0;
        while i < self.pending.len() {
            let planned = &mut self.pending[i];
            if !planned.applied && planned.fault.start <= now {
                let net = pb::NetFault {
                    loss: planned.fault.loss,
                    delay_us: planned.record.delay_us,
                    jitter_us: planned.record.jitter_us,
                };
                match control_call(&planned.addr, &mut planned.channel, &self.token, Some(net))
                    .await
                {
                    Ok(state) => {
                        planned.record.mechanisms = state
                            .mechanisms
                            .iter()
                            .filter_map(|m| netfault::mechanism_of(m))
                            .collect();
                        planned.applied = true;
                    }
                    Err(e) => {
                        let line = format!(
                            "hop \"{}\" replica {}: fault not applied: {}",
                            planned.record.hop,
                            planned.record.replica,
                            e.message()
                        );
                        eprintln!("warning: {line}");
                        self.incidents.push(line);
                        self.pending.remove(i);
                        continue;
                    }
                }
            } else if planned.applied
                && planned
                    .fault
                    .duration
                    .is_some_and(|d| planned.fault.start + d <= now)
            {
                let planned = self.pending.remove(i);
                let record = self.clear(planned).await;
                self.done.push(record);
                continue;
            }
            i += 1;
        }
    }

    async fn clear(&mut self, mut planned: PlannedFault) -> FaultRecord {
        let mut record = planned.record;
        match control_call(&planned.addr, &mut planned.channel, &self.token, None).await {
            Ok(state) => {
                if record
                    .mechanisms
                    .contains(&netfault::Mechanism::NftablesNumgen)
                {
                    record.packets = Some([state.packets_seen, state.packets_dropped]);
                }
            }
            Err(e) => self.incidents.push(format!(
                "hop \"{}\" replica {}: fault not cleared (the namespace removal clears it): {}",
                record.hop,
                record.replica,
                e.message()
            )),
        }
        record
    }

    /// Clears every fault still applied; returns the records and incidents.
    async fn finish(mut self) -> (Vec<FaultRecord>, Vec<String>) {
        let pending = std::mem::take(&mut self.pending);
        for planned in pending {
            if planned.applied {
                let record = self.clear(planned).await;
                self.done.push(record);
            } else {
                self.incidents.push(format!(
                    "hop \"{}\" replica {}: fault never started (the load ended before {} ms)",
                    planned.record.hop, planned.record.replica, planned.record.start_ms
                ));
            }
        }
        (self.done, self.incidents)
    }
}

/// SetFaults (`Some`) or ClearFaults (`None`) on the agent at `addr`,
/// over `channel`, connected first if it is not yet.
async fn control_call(
    addr: &PeerAddr,
    channel: &mut Option<tonic::transport::Channel>,
    token: &str,
    net: Option<pb::NetFault>,
) -> Result<pb::FaultState, tonic::Status> {
    let channel = match channel {
        Some(channel) => channel.clone(),
        None => {
            let connected = tonic::transport::Endpoint::from_shared(addr.uri())
                .map_err(|e| tonic::Status::internal(e.to_string()))?
                .connect_timeout(Duration::from_secs(10))
                .timeout(Duration::from_secs(10))
                .connect()
                .await
                .map_err(|e| tonic::Status::unavailable(format!("connect {addr}: {e}")))?;
            channel.insert(connected).clone()
        }
    };
    let mut client = pb::control_client::ControlClient::new(channel);
    let bearer: tonic::metadata::MetadataValue<_> = format!("Bearer {token}")
        .parse()
        .map_err(|_| tonic::Status::internal("the token is not valid metadata"))?;
    let reply = match net {
        Some(net) => {
            let mut request = tonic::Request::new(pb::SetFaultsRequest {
                net: Some(net),
                slow: None,
            });
            request.metadata_mut().insert("authorization", bearer);
            client.set_faults(request).await?
        }
        None => {
            let mut request = tonic::Request::new(pb::ClearFaultsRequest {});
            request.metadata_mut().insert("authorization", bearer);
            client.clear_faults(request).await?
        }
    };
    Ok(reply.into_inner())
}

/// Keeps trace ids of different runs and variants apart.
fn run_nonce(dir: &Path, variant: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    dir.hash(&mut h);
    variant.hash(&mut h);
    h.finish()
}

async fn broker_stats(addr: &PeerAddr) -> Result<Vec<TopicStats>, String> {
    let mut client = BrokerClient::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    client
        .stats(None)
        .await
        .map_err(|s| s.message().to_string())
}

/// The configuration of replica `replica` of `hop`: its behavior, and the
/// addresses of the broker and of the hops it calls. The local launchers
/// and a deployed hop (`tailmesh hop --scenario`) both build it here.
pub fn hop_config(
    seed: u64,
    variant: &Variant,
    hop: &Hop,
    replica: u32,
    addrs: &Addrs,
) -> HopConfig {
    let downstream = hop
        .downstream
        .iter()
        .filter_map(|name| variant.hops.iter().find(|h| &h.name == name))
        .map(|d| DownstreamConfig {
            hop: d.name.clone(),
            transport: d.transport,
            balance: d.balance,
            replicas: addrs.hops.get(&d.name).cloned().unwrap_or_default(),
            policy: d.client.clone(),
        })
        .collect();
    HopConfig {
        behavior: hop.behavior(seed),
        replica,
        transport: hop.transport,
        downstream,
        broker: addrs.broker.clone(),
        concurrency: hop.concurrency,
        drain_grace: STOP_GRACE,
        precise_timer: true,
        idle_timeout: tailmesh_services::incoming::DEFAULT_IDLE_TIMEOUT,
    }
}

/// Starts every replica of every hop, leaves first, so each hop is handed
/// the addresses of the hops it calls. Returns where everything is.
async fn launch_hops(
    seed: u64,
    variant: &Variant,
    broker: Option<PeerAddr>,
    options: &RunOptions,
    launcher: &mut AnyLauncher,
    log_dir: &Path,
) -> Result<Addrs, RunError> {
    let mut addrs = Addrs {
        broker,
        hops: BTreeMap::new(),
    };
    for hop in launch_order(&variant.hops) {
        let mut replicas = Vec::with_capacity(hop.replicas as usize);
        for replica in 0..hop.replicas {
            let name = deploy::hop_role(&hop.name, replica);
            let spec = if matches!(launcher, AnyLauncher::Attached(_)) {
                // Deployed hops read their configuration from the scenario.
                ProcessSpec::new(name, &options.exe)
            } else {
                let config = hop_config(seed, variant, hop, replica, &addrs);
                let config_path = log_dir.join(format!("{name}.json"));
                let json = serde_json::to_string_pretty(&config).map_err(|e| RunError::Setup {
                    variant: variant.name.clone(),
                    message: format!("encode {name} config: {e}"),
                })?;
                std::fs::write(&config_path, json).map_err(|source| RunError::Io {
                    what: "write",
                    path: config_path.clone(),
                    source,
                })?;
                let spec = ProcessSpec::new(name, &options.exe)
                    .arg("hop")
                    .arg("--config")
                    .arg(config_path);
                traced(
                    spec,
                    options.traces.as_ref(),
                    &format!("hop-{}", hop.name),
                    &variant.name,
                )
            };
            let addr = launcher
                .launch(spec)
                .await
                .map_err(|source| RunError::Launch {
                    variant: variant.name.clone(),
                    source,
                })?;
            replicas.push(addr);
        }
        addrs.hops.insert(hop.name.clone(), replicas);
    }
    Ok(addrs)
}

/// Hops in an order where every hop comes after all the hops it calls.
pub fn launch_order(hops: &[Hop]) -> Vec<&Hop> {
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

/// "open loop, 400/s poisson, 20s (+2s warmup)" and the like.
pub fn describe_load(load: &crate::scenario::Load) -> String {
    let mode = match &load.mode {
        LoadMode::Open { rate, arrivals } => {
            format!("open loop, {rate}/s {arrivals:?}").to_lowercase()
        }
        LoadMode::Closed { concurrency } => format!("closed loop, {concurrency} in flight"),
    };
    let stop = match load.stop {
        Stop::Duration(d) => humantime::format_duration(d).to_string(),
        Stop::Requests(n) => format!("{n} requests"),
    };
    if load.warmup.is_zero() {
        format!("{mode}, {stop}")
    } else {
        format!(
            "{mode}, {stop} (+{} warmup)",
            humantime::format_duration(load.warmup)
        )
    }
}

fn progress_bar(variant: &Variant) -> Option<ProgressBar> {
    let load = &variant.load;
    let (len, unit) = match (load.stop, &load.mode) {
        (Stop::Duration(d), _) => (u64::try_from(d.as_millis()).unwrap_or(u64::MAX), "ms"),
        (Stop::Requests(n), _) => (n, "requests"),
    };
    let expected = match (load.stop, &load.mode) {
        (Stop::Duration(d), _) => d,
        (Stop::Requests(n), LoadMode::Open { rate, .. }) => {
            Duration::from_secs_f64(n as f64 / rate)
        }
        // Closed loop with a request count: the length is unknown up front.
        (Stop::Requests(_), LoadMode::Closed { .. }) => Duration::from_secs(3),
    } + load.warmup;
    if expected <= Duration::from_secs(2) {
        return None;
    }
    let bar = ProgressBar::new(len);
    let template = format!("{{prefix}} [{{bar:40}}] {{pos}}/{{len}} {unit} ({{elapsed}})");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(variant.name.clone());
    Some(bar)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::analysis::testing::{hop, variant};

    #[test]
    fn auto_without_network_faults_is_local_and_with_them_netns_or_a_clear_error() {
        let mut v = variant("v", vec![hop("a", None)]);
        v.launcher = Launcher::Auto;
        assert_eq!(resolve_launcher(&v), Ok(Launcher::Local));
        v.launcher = Launcher::Local;
        assert_eq!(resolve_launcher(&v), Ok(Launcher::Local));

        v.launcher = Launcher::Auto;
        v.hops[0].net = Some(NetFault {
            loss: 0.01,
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            start: Duration::ZERO,
            duration: None,
        });
        match resolve_launcher(&v) {
            Ok(kind) => {
                assert_eq!(kind, Launcher::Netns);
                assert!(netns::has_privilege());
            }
            Err(message) => {
                // Without root (or the tools) the message says what is needed.
                assert!(
                    message.contains("needs root or CAP_NET_ADMIN") || message.contains("needs "),
                    "{message}"
                );
            }
        }
    }
}
