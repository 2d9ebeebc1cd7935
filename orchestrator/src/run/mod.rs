//! `tailmesh run`: launch each variant's mesh from its plan, drive its
//! load, stop it, and hand the measurements to analysis and the writers.
//!
//! - `launch`: which launcher a variant gets; its processes started in the
//!   plan's order.
//! - `faults`: the network-fault schedule, through each replica's agent.
//! - `kills`: replicas killed (and restarted) on schedule by the launcher.
//! - `endpoints`: what the push callers saw of the replicas they call,
//!   collected when the load ends.
//! - `progress`: the line shown when a variant starts, and where its
//!   progress goes (a bar on a terminal, a line every 10 s elsewhere).
//! - `service_port`: the port a `[hop.service]` command is told to listen
//!   on, outside the kernel's ephemeral range.
//!
//! Each variant's measured requests go through a [`RecordPipeline`] as
//! they complete; the run keeps none of them.

mod endpoints;
mod faults;
mod kills;
mod launch;
mod processes;
mod progress;
mod service_port;

pub(crate) use launch::{LauncherError, ServiceError, resolve_launcher, wait_for_address};
pub(crate) use progress::describe_load;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use tailmesh_netfault::{
    self as netfault, FaultError, FaultRecord, WindowRecord,
    netns::{self, NetnsError},
    tool,
};
use tailmesh_services::{
    broker::TopicStats,
    hop::{
        DownstreamConfig,
        call::{
            Reach,
            reach::{ReachError, ReachPlan},
        },
    },
    model::{Connection, Transport},
    timer::Sleeper,
};
use tokio::sync::watch;

use crate::{
    launcher::{
        AnyLauncher, Attach, AttachedLauncher, LaunchError, LocalLauncher, NetnsLauncher,
        PeakMemory, brokers::BrokerProcessError, peak_rss_bytes,
    },
    loadgen::{self, LoadClock, LoadOutcome, Target, fleet},
    plan::{Addrs, DRAIN_GRACE, MeshPlan, Naming, SpanHold},
    record::RecordSink,
    scenario::{ConnectionMode, Hop, Launcher, Scenario, Variant},
    traces::{
        collector::{Collector, ReceiverError, ReceiverHandle, Spool},
        loadgen::LoadTracer,
    },
};

/// How long hops get to finish requests in flight when a variant ends:
/// as long as each hop itself drains them.
const STOP_GRACE: Duration = DRAIN_GRACE;
/// How often the hop processes are checked while the load runs.
const CHILD_WATCH_EVERY: Duration = Duration::from_millis(200);

/// How long a sample of the broker's queues may take before it is skipped.
const QUEUE_STATS_PATIENCE: Duration = Duration::from_millis(250);
/// Attached: spans have stopped arriving when none came for this long:
/// twice the longest a process goes between two sends (a holding
/// process that sees few requests sends its kept spans once a second).
const SPAN_QUIET: Duration =
    Duration::from_secs(2 * tailmesh_services::telemetry::export::QUIET_ASK.as_secs());
/// Attached: the longest wait for late spans after a variant.
const SPAN_SETTLE_LIMIT: Duration = Duration::from_secs(15);

/// Errors that stop a run before it measures anything.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The run's CA or a certificate could not be made or written.
    #[error("TLS: {0}")]
    Tls(#[from] tailmesh_services::tls::TlsError),
    /// Attached to a TLS deployment without the orchestrator's certificates.
    #[error(
        "variant \"{variant}\": [mesh] tls = \"{mode}\": attached, the orchestrator needs the \
         deployment's CA and its own certificate: give their folder with --tls-dir (tailmesh \
         compose and tailmesh k8s mount it at {})",
        crate::deploy::tls::TLS_DIR
    )]
    TlsAttached { variant: String, mode: &'static str },
    /// The orchestrator's TLS folder is unusable (attached).
    #[error("TLS: {0}")]
    TlsDir(#[from] Box<crate::deploy::tls::TlsDirError>),
    /// A hop or broker process could not be started.
    #[error("variant \"{variant}\": {source}")]
    Launch {
        variant: String,
        source: Box<LaunchError>,
    },
    /// A file or folder could not be written.
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The variant cannot have the launcher it needs.
    #[error("variant \"{variant}\": {source}")]
    Launcher {
        variant: String,
        source: LauncherError,
    },
    /// The network namespaces of a netns variant could not be built.
    #[error("variant \"{variant}\": {source}")]
    Network { variant: String, source: NetnsError },
    /// A network fault that this kernel and its tools cannot apply.
    #[error("variant \"{variant}\": {source}")]
    Fault { variant: String, source: FaultError },
    /// The trace receiver cannot listen where a netns variant's processes
    /// reach it.
    #[error("variant \"{variant}\": {source}")]
    TraceListener {
        variant: String,
        source: ReceiverError,
    },
    /// A hop replica's configuration could not be encoded.
    #[error("variant \"{variant}\": encode the configuration of {process}: {source}")]
    HopConfig {
        variant: String,
        /// The process (`hop-b-1`).
        process: String,
        source: serde_json::Error,
    },
    /// The address of the variant's RabbitMQ or NATS server is unknown.
    #[error("variant \"{variant}\": {source}")]
    BrokerEndpoint {
        variant: String,
        source: BrokerProcessError,
    },
    /// The variant has no hop to send the load to (a checked scenario
    /// always has one).
    #[error("variant \"{variant}\" has no hop")]
    NoHop { variant: String },
    /// A variant kills a replica, which only a launcher that started it
    /// can do.
    #[error(
        "variant \"{variant}\": hop \"{hop}\" has kill, which needs the local or netns launcher \
         (the processes must be this run's children); it cannot run attached to a deployment"
    )]
    KillAttached { variant: String, hop: String },
    /// A hop replica's service (`[hop.service]`) could not be started or
    /// did not get ready (exit status 2: its command or address is wrong).
    #[error("variant \"{variant}\": hop \"{hop}\" replica {replica}: service: {source}")]
    Service {
        variant: String,
        hop: String,
        replica: u32,
        source: Box<launch::ServiceError>,
    },
    /// A hop replica whose work is a service did not start: commonly its
    /// method or request does not fit the service's schema (its log says).
    #[error(
        "variant \"{variant}\": hop \"{hop}\" replica {replica}, calling the service at \
         {address}, did not start: {source}"
    )]
    ServiceHop {
        variant: String,
        hop: String,
        replica: u32,
        address: String,
        source: Box<LaunchError>,
    },
    /// The load generator processes could not be started or given their
    /// parts.
    #[error("variant \"{variant}\": the load generators: {source}")]
    Generators {
        variant: String,
        source: Box<fleet::FleetError>,
    },
    /// The load generator's reach of an entry hop (its pool of
    /// connections, or its broker) could not be built.
    #[error("variant \"{variant}\": entry hop \"{hop}\": {source}")]
    EntryReach {
        variant: String,
        hop: String,
        source: ReachError,
    },
}

/// The load generator's reach of `entry`: `[load]`'s connections to its
/// replicas (or its service, called directly), or its broker.
async fn entry_reach(plan: &MeshPlan, addrs: &Addrs, entry: &Hop) -> Result<Reach, RunError> {
    let variant = &plan.variant;
    // `connections` channels to each replica, taken in turn, or one per
    // request.
    let (connection, channels) = match variant.load.connection {
        ConnectionMode::Shared { connections } => (Connection::Shared, connections as usize),
        ConnectionMode::PerRequest => (Connection::PerRequest, 1),
    };
    let direct = entry
        .service
        .as_ref()
        .filter(|s| s.direct)
        .map(|s| s.call(String::new()));
    let reach_plan = ReachPlan {
        hop: &entry.name,
        caller: None,
        transport: entry.transport,
        replicas: addrs
            .hops
            .get(&entry.name)
            .map(Vec::as_slice)
            .unwrap_or_default(),
        balance: entry.balance,
        connection,
        channels,
        seed: plan.seed,
        endpoints: &entry.endpoints,
        broker: addrs
            .broker
            .as_ref()
            .map(|b| (variant.broker, variant.queue_bounds, b)),
        service: direct.as_ref(),
    };
    Reach::resolve(
        &reach_plan,
        tailmesh_services::hop::server::SERVICE_PATIENCE,
    )
    .await
    .map_err(|e| match e {
        ReachError::Service(source) => RunError::Service {
            variant: variant.name.clone(),
            hop: entry.name.clone(),
            replica: 0,
            source: Box::new(launch::ServiceError::Resolve(*source)),
        },
        e => RunError::EntryReach {
            variant: variant.name.clone(),
            hop: entry.name.clone(),
            source: e,
        },
    })
}

impl RunError {
    /// Whether the scenario's input is at fault, though only a run could
    /// tell (exit status 2): a service that does not start or get ready, a
    /// method or request the service's schema refuses.
    pub fn is_bad_input(&self) -> bool {
        matches!(self, RunError::Service { .. } | RunError::ServiceHop { .. })
    }
}

/// What one variant's run produced.
#[derive(Debug)]
pub(crate) struct VariantRun {
    /// The variant as run.
    pub variant: Variant,
    /// The load generator's measurements (its requests went through the
    /// run's [`RecordPipeline`]).
    pub load: LoadOutcome,
    /// Things that went wrong while it ran (a hop process that died...).
    pub incidents: Vec<String>,
    /// The broker's per-topic statistics at the end (pull hops only).
    pub broker: Vec<TopicStats>,
    /// The network faults applied, with their mechanism.
    pub faults: Vec<FaultRecord>,
    /// Every fault window, planned and as applied.
    pub fault_windows: Vec<WindowRecord>,
    /// The replicas killed on schedule.
    pub kills: Vec<crate::analysis::KillRecord>,
    /// What the push callers saw of the replicas they call.
    pub endpoints: Vec<crate::analysis::CallerEndpoints>,
    /// The peak resident memory of the variant's processes and of the
    /// orchestrator, read when the load ended.
    pub memory: Vec<PeakMemory>,
    /// Its processes' CPU time and memory, once a second of the load.
    pub processes: Vec<tailmesh_analysis::record::ProcessSample>,
    /// Its broker's topics, sampled with the processes.
    pub queues: Vec<tailmesh_analysis::record::QueueSample>,
    /// How long its processes took to start and get ready.
    pub launch: Duration,
    /// The launcher that ran it: `"local"`, `"netns"` or `"attached"`.
    pub launcher: &'static str,
    /// The variant's spool of spans, sealed once all were flushed (its
    /// processes have exited).
    pub spans: Spool,
    /// The load generator's tracer (which requests were sampled).
    pub tracer: Option<Arc<LoadTracer>>,
    /// How long its processes held their spans for the keep decisions
    /// (`None`: they sent them all).
    pub hold: Option<SpanHold>,
}

/// Where a run's measured requests go, variant after variant: the
/// per-variant record pipeline (analysis, the requests file, the trace
/// sampler), fed one completed request at a time while the load runs.
pub(crate) trait RecordPipeline: RecordSink {
    /// The records that follow belong to `variant`; `tracer` says which of
    /// its requests are traced, when tracing is on.
    fn begin_variant(&mut self, variant: &Variant, tracer: Option<&Arc<LoadTracer>>);
    /// The variant's load has ended; `load` says what the generator's part
    /// of the pipeline held at most.
    fn end_variant(&mut self, load: &LoadOutcome);
}

/// Where the run's spans go.
#[derive(Clone)]
pub(crate) struct TraceSetup {
    /// The embedded receiver's store.
    pub collector: Arc<Collector>,
    /// The receiver's `http://127.0.0.1:port`, handed to every process of
    /// the local launcher (netns variants get their own listener, below).
    pub endpoint: String,
    /// Opens the receiver's listener on a netns variant's host address.
    pub receiver: ReceiverHandle,
    /// The share of requests traced, 0.0 to 1.0.
    pub sampling: f64,
    /// How each variant's processes hold their spans for the tail
    /// sampler's decisions (`None`: they send them all).
    pub hold: Option<HoldRule>,
}

/// When processes hold their spans: whenever the tail sampler keeps less
/// than every trace.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HoldRule {
    pub keep: tailmesh_model::scenario::Keep,
    pub slow_threshold: Duration,
    /// Spans a process holds at most (`[telemetry] hold_spans`).
    pub spans: usize,
    /// Variants in the run (they share the Jaeger file's budget).
    pub variants: usize,
}

/// How long past a request's deadline its spans wait for the decision:
/// two of the exporter's intervals and the record pipeline's delay, with
/// room for a busy machine.
const HOLD_MARGIN: Duration = Duration::from_secs(2);

impl TraceSetup {
    /// How long `variant`'s processes hold their spans; `None` when every
    /// trace is kept anyway.
    pub(crate) fn hold(&self, variant: &Variant) -> Option<SpanHold> {
        self.hold?.hold(variant, self.sampling)
    }
}

impl HoldRule {
    /// The rule of `scenario`'s `[telemetry]` and `[check]`.
    pub(crate) fn of(scenario: &tailmesh_model::scenario::Scenario) -> HoldRule {
        HoldRule {
            keep: scenario.telemetry.keep,
            slow_threshold: scenario.check.slow_threshold,
            spans: scenario.telemetry.hold_spans,
            variants: scenario.variants.len(),
        }
    }

    /// How long `variant`'s processes hold their spans, traced at
    /// `sampling`; `None` when every trace is kept anyway.
    pub(crate) fn hold(&self, variant: &Variant, sampling: f64) -> Option<SpanHold> {
        let policy = crate::traces::tail::TailPolicy::resolve(
            &self.keep,
            variant,
            self.slow_threshold,
            sampling,
            crate::traces::tail::JAEGER_FILE_LIMIT / self.variants.max(1) as u64,
        );
        policy.holds().then(|| SpanHold {
            time: variant.load.timeout + HOLD_MARGIN,
            spans: self.spans,
        })
    }
}

impl std::fmt::Debug for TraceSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceSetup")
            .field("endpoint", &self.endpoint)
            .field("sampling", &self.sampling)
            .finish()
    }
}

/// Options of a run.
#[derive(Clone, Debug)]
pub(crate) struct RunOptions {
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
    /// The run's certificate authority, made when a variant turns TLS on
    /// (`[mesh] tls`); it signs every process's certificate.
    pub tls_ca: Option<Arc<tailmesh_services::tls::Authority>>,
    /// Where load generators started elsewhere connect, when they were
    /// (`tailmesh run --generators-at`); otherwise the run starts its own.
    pub hub: Option<Arc<fleet::Hub>>,
    /// Run one generator's load in a generator process too
    /// (`--generator-processes`).
    pub generator_processes: bool,
    /// The live metrics, when served: the processes' samples go there too.
    pub metrics: Option<Arc<crate::metrics::LiveMetrics>>,
}

/// Runs every variant of `scenario` in turn. Ctrl-C (`interrupt` counting
/// up) stops sending, waits for requests in flight, stops the hops and
/// skips the remaining variants; a second Ctrl-C gives up the requests in
/// flight and stops the hops without a grace period. What was measured is
/// still returned.
pub(crate) async fn run_variants(
    scenario: &Scenario,
    options: &RunOptions,
    interrupt: watch::Receiver<u32>,
    records: &mut dyn RecordPipeline,
) -> Result<Vec<VariantRun>, RunError> {
    let plans: Vec<MeshPlan> = scenario
        .variants
        .iter()
        .map(|variant| MeshPlan::new(scenario, variant))
        .collect();
    if options.attach.as_ref().is_some_and(|a| a.tls_dir.is_none())
        && let Some(v) = scenario.variants.iter().find(|v| v.mesh.tls.is_on())
    {
        return Err(RunError::TlsAttached {
            variant: v.name.clone(),
            mode: v.mesh.tls.as_str(),
        });
    }
    // One CA for the run, made before anything starts (attached, the
    // deployment's CA signed everything already).
    let with_ca;
    let options = if options.attach.is_none()
        && options.tls_ca.is_none()
        && scenario.variants.iter().any(|v| v.mesh.tls.is_on())
    {
        let mut o = options.clone();
        o.tls_ca = Some(Arc::new(tailmesh_services::tls::Authority::new(&format!(
            "tailmesh run CA ({})",
            scenario.name
        ))?));
        with_ca = o;
        &with_ca
    } else {
        options
    };
    // Every variant's launcher is checked before the first one starts.
    let mut launchers = Vec::with_capacity(plans.len());
    for plan in &plans {
        if options.attach.is_some() {
            if let Some(hop) = plan.variant.hops.iter().find(|h| h.kill.is_some()) {
                return Err(RunError::KillAttached {
                    variant: plan.variant.name.clone(),
                    hop: hop.name.clone(),
                });
            }
            launchers.push(Launcher::Auto);
            continue;
        }
        let kind = resolve_launcher(plan).map_err(|source| RunError::Launcher {
            variant: plan.variant.name.clone(),
            source,
        })?;
        launchers.push(kind);
    }
    if launchers.contains(&Launcher::Netns) {
        // Leftovers of runs that crashed (their orchestrator is gone).
        for line in netns::clean() {
            crate::tell!("removed leftover {line}");
        }
    }
    let mut runs = Vec::new();
    for (plan, kind) in plans.iter().zip(launchers) {
        if *interrupt.borrow() >= loadgen::STOP_SENDING {
            break;
        }
        let variant = &plan.variant;
        crate::tell!(
            "variant {}: {} hop(s), {} process(es), {}",
            variant.name,
            variant.hops.len(),
            plan.hops().count(),
            describe_load(&variant.load)
        );
        runs.push(run_variant(scenario, plan, kind, options, interrupt.clone(), records).await?);
    }
    Ok(runs)
}

async fn run_variant(
    scenario: &Scenario,
    plan: &MeshPlan,
    kind: Launcher,
    options: &RunOptions,
    interrupt: watch::Receiver<u32>,
    records: &mut dyn RecordPipeline,
) -> Result<VariantRun, RunError> {
    let variant = &plan.variant;
    let log_dir = options.dir.join("logs").join(&variant.name);
    std::fs::create_dir_all(&log_dir).map_err(|source| RunError::Io {
        what: "create",
        path: log_dir.clone(),
        source,
    })?;
    let mut launcher = if let Some(attach) = &options.attach {
        AnyLauncher::Attached(
            AttachedLauncher::new(
                Naming::for_variant(scenario, variant, crate::deploy::SERVICE_PORT),
                attach.token.clone(),
            )
            .with_ready_timeout(attach.ready_timeout),
        )
    } else if kind == Launcher::Netns {
        let netns = NetnsLauncher::new(log_dir.clone()).map_err(|source| RunError::Network {
            variant: variant.name.clone(),
            source,
        })?;
        let net = netns.network();
        crate::tell!(
            "variant {}: netns launcher, run {} (namespaces tm{}*)",
            variant.name,
            net.id(),
            net.id()
        );
        // Every fault is checked against the kernel before a process starts;
        // on error the launcher's drop removes the network.
        let netem = netfault::netem_available(&net.hub(), &format!("tm{}u", net.id()));
        let iptables = tool::tool_available("iptables");
        let hops = plan
            .net_faults()
            .into_iter()
            .map(|(_, hop, replica, fault)| {
                (format!("hop \"{}\" replica {replica}", hop.name), fault)
            });
        let generators = plan
            .generator_net_faults()
            .into_iter()
            .map(|(k, fault)| (format!("load generator {k}"), fault));
        for (link, fault) in hops.chain(generators) {
            netfault::check(&link, &crate::scenario::fault_spec(fault), netem, iptables).map_err(
                |source| RunError::Fault {
                    variant: variant.name.clone(),
                    source,
                },
            )?;
        }
        AnyLauncher::Netns(netns)
    } else {
        // Windows of application-level faults are set, and the endpoint
        // events read, through each hop's Control service.
        AnyLauncher::Local(LocalLauncher::new(log_dir.clone()).with_control())
    };
    // Processes in namespaces cannot reach the host's loopback, where the
    // trace receiver listens: they get a listener of their own on the host
    // side of their network (.254 on `tm<id>h`, reachable only from the
    // run's namespaces), kept until they have stopped and flushed.
    let mut netns_options = None;
    let _trace_listener = match (&launcher, &options.traces) {
        (AnyLauncher::Netns(netns), Some(t)) => {
            let ip = std::net::IpAddr::V4(netns.network().host_addr());
            let listener = t
                .receiver
                .listen_on(ip)
                .map_err(|source| RunError::TraceListener {
                    variant: variant.name.clone(),
                    source,
                })?;
            let mut o = options.clone();
            o.traces = Some(TraceSetup {
                endpoint: listener.endpoint.clone(),
                ..t.clone()
            });
            netns_options = Some(o);
            Some(listener)
        }
        _ => None,
    };
    let options = netns_options.as_ref().unwrap_or(options);
    let result = measure(plan, options, &mut launcher, interrupt.clone(), records).await;
    // Abandoned requests may still be at the hops: no grace for them.
    let grace = if *interrupt.borrow() >= loadgen::ABANDON {
        Duration::ZERO
    } else {
        STOP_GRACE
    };
    let stopped = launcher.shutdown(grace).await;
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
        run.spans = t.collector.seal();
    }
    for child in stopped.iter().filter(|c| c.forced) {
        run.incidents.push(child.to_string());
    }
    Ok(run)
}

/// Who sends a variant's load.
enum Sender {
    /// Generator processes, started and given their parts.
    Fleet(fleet::Fleet),
    /// This process, over its own reach of the entry hops.
    Here(Target),
}

async fn measure(
    plan: &MeshPlan,
    options: &RunOptions,
    launcher: &mut AnyLauncher,
    interrupt: watch::Receiver<u32>,
    records: &mut dyn RecordPipeline,
) -> Result<VariantRun, RunError> {
    let variant = &plan.variant;
    // The load generator, the readiness probes and the Control client all
    // open their connections with this.
    tailmesh_services::tls::install_client(launch::client_tls(plan, options)?);
    let launching = std::time::Instant::now();
    let addrs = launch::launch_mesh(plan, options, launcher).await?;
    let launched = launching.elapsed();
    crate::tell!(
        "variant {}: ready in {}",
        variant.name,
        tailmesh_units::duration(launched)
    );
    let broker = addrs.broker.clone();
    let topics: Vec<String> = variant
        .hops
        .iter()
        .filter(|h| h.transport == Transport::Pull)
        .map(|h| h.name.clone())
        .collect();
    let entries = plan.entries();
    if entries.is_empty() {
        return Err(RunError::NoHop {
            variant: variant.name.clone(),
        });
    }
    let traced = options
        .traces
        .as_ref()
        .filter(|_| variant.load.traces_requests());
    let tracer = traced.map(|t| {
        let hold = t.hold(variant);
        // Spans of processes that do not hold their own (a real service's
        // SDK) wait at the receiver, under the same limits.
        t.collector.hold_spans(
            hold.map(|h| tailmesh_services::telemetry::held::HoldLimits {
                hold: h.time,
                max_spans: h.spans,
            }),
        );
        Arc::new(
            LoadTracer::new(
                Arc::clone(&t.collector),
                &variant.name,
                t.sampling,
                plan.seed ^ run_nonce(&options.dir, &variant.name),
            )
            .holding(hold.is_some()),
        )
    });
    // Generator processes (several, one whose link carries a fault, or one
    // by `--generator-processes`): started, each given its part (traced as
    // `tracer` traces), their clocks measured, before the load's clock
    // starts; else this process reaches the entry hops and sends the load
    // itself.
    let mut sender = if plan.generator_processes() || options.generator_processes {
        let n = variant.load.generators.max(1);
        Sender::Fleet(start_fleet(plan, options, &addrs, n, tracer.as_deref(), launcher).await?)
    } else {
        let mut reaches = Vec::with_capacity(entries.len());
        for (entry, share) in entries {
            let reach = entry_reach(plan, &addrs, entry).await?;
            reaches.push((reach, entry.client.clone(), share));
        }
        Sender::Here(Target::new(reaches, plan.seed))
    };
    // The pools this process sends the load through, or how a kill asks
    // the generator processes about theirs while the load runs (they
    // report what theirs saw when they are done).
    let (entry_pools, generators) = match &mut sender {
        Sender::Here(target) => (target.push_pools(), None),
        Sender::Fleet(fleet) => (Vec::new(), Some(fleet.picks_asker())),
    };
    let mut faults = faults::Faults::plan(plan, launcher, &addrs, &options.exe);
    let mut kills = kills::Kills::plan(plan, launcher, &addrs, entry_pools.clone(), generators);
    // Windows that start at 0 are applied before the load starts.
    faults.advance(Duration::ZERO).await;
    let progress = options.progress.then(|| progress::view(variant)).flatten();
    let load_tracer = tracer.clone();
    records.begin_variant(variant, tracer.as_ref());
    let (done_tx, mut done_rx) = watch::channel(false);
    // One origin for the load generator and the fault schedule.
    let clock = match sender {
        Sender::Fleet(_) => LoadClock::starting_in(fleet::START_LEAD, variant.load.warmup),
        Sender::Here(_) => LoadClock::start(variant.load.warmup),
    };
    let generate = async {
        let outcome = match sender {
            Sender::Fleet(fleet) => {
                fleet
                    .generate(clock, progress, interrupt, load_tracer, records)
                    .await
            }
            Sender::Here(target) => {
                loadgen::generate(
                    target,
                    &variant.load,
                    clock,
                    plan.seed,
                    Sleeper::Precise,
                    progress,
                    interrupt,
                    loadgen::Tracing::spans(load_tracer),
                    loadgen::Part::WHOLE,
                    records,
                )
                .await
            }
        };
        let _ = done_tx.send(true);
        outcome
    };
    // Watch the hop processes while the load runs: one that dies is named,
    // and its requests are counted as errors by the load generator. The
    // fault schedule wakes at its next change, so a window opens within a
    // few milliseconds (plus the Control call) of its planned time.
    let mut processes = processes::ProcessWatch::new(variant.load.warmup);
    let mut queue_reader = launch::QueueReader::of(variant.broker, broker.as_ref());
    let watch_children = async {
        let mut incidents = Vec::new();
        loop {
            let now = tokio::time::Instant::now();
            let mut wake = (now + CHILD_WATCH_EVERY).min(clock.origin + processes.next_change());
            if let Some(next) = faults.next_change() {
                wake = wake.min(clock.origin + next);
            }
            if let Some(next) = kills.next_change() {
                wake = wake.min(clock.origin + next);
            }
            tokio::select! {
                _ = done_rx.wait_for(|d| *d) => break,
                () = tokio::time::sleep_until(wake) => {}
            }
            faults
                .advance(clock.since_origin(tokio::time::Instant::now()))
                .await;
            // Before the exited children are read: a replica killed on
            // schedule is reaped by the kill, never reported as exited.
            kills
                .advance(clock.since_origin(tokio::time::Instant::now()), launcher)
                .await;
            if let Some(t_s) = processes.due(clock.since_origin(tokio::time::Instant::now())) {
                let samples = processes.sample(t_s, launcher);
                if let Some(m) = &options.metrics {
                    m.processes(samples);
                }
                // The queues too, when the broker answers promptly (a miss
                // leaves a gap in queues.csv, nothing else).
                if let Some(reader) = &mut queue_reader
                    && let Ok(Some(stats)) =
                        tokio::time::timeout(QUEUE_STATS_PATIENCE, reader.read()).await
                {
                    let samples = processes.queues(t_s, &stats);
                    if let Some(m) = &options.metrics {
                        m.queues(samples);
                    }
                }
            }
            for child in launcher.exited() {
                let line = format!("{child} while the load was running");
                crate::tell!("warning: variant {}: {line}", variant.name);
                incidents.push(line);
            }
        }
        incidents
    };
    let (load, mut incidents) = tokio::join!(generate, watch_children);
    incidents.extend(load.generators.iter().filter_map(|g| {
        g.stopped.as_ref().map(|why| {
            format!(
                "load generator {} stopped before its part was done: {why}; {} of its requests, \
                 sent and not reported, were lost with it",
                g.index, g.lost_in_flight
            )
        })
    }));
    records.end_variant(&load);
    let (kills, kill_incidents) = kills.finish(&clock, &load.endpoints).await;
    incidents.extend(kill_incidents);
    let endpoints = endpoints::collect(
        plan,
        launcher,
        &addrs,
        &clock,
        &entry_pools,
        &load.endpoints,
    )
    .await;
    let (faults, fault_windows, fault_incidents) = faults.finish(&clock).await;
    incidents.extend(fault_incidents);
    let broker = match broker {
        Some(addr) => {
            match launch::broker_stats(variant.broker, &addr, variant.queue_bounds, &topics).await {
                Ok(stats) => stats,
                Err(e) => {
                    incidents.push(format!("broker statistics unavailable: {e}"));
                    Vec::new()
                }
            }
        }
        None => Vec::new(),
    };
    let (processes, queues) = processes.finish();
    let mut memory = launcher.peak_memory();
    memory.extend(
        peak_rss_bytes("/proc/self/status").map(|peak_rss_bytes| PeakMemory {
            process: "orchestrator".to_owned(),
            peak_rss_bytes,
        }),
    );
    Ok(VariantRun {
        variant: variant.clone(),
        load,
        incidents,
        broker,
        faults,
        fault_windows,
        kills,
        endpoints,
        memory,
        processes,
        queues,
        launch: launched,
        launcher: launcher.kind(),
        spans: Spool::default(),
        tracer,
        hold: options.traces.as_ref().and_then(|t| t.hold(variant)),
    })
}

/// Starts the variant's `n` load generator processes and gives each its
/// part: the entry hops as a caller reaches them, and what it needs to
/// reach them as the orchestrator would.
async fn start_fleet(
    plan: &MeshPlan,
    options: &RunOptions,
    addrs: &Addrs,
    n: u32,
    tracer: Option<&LoadTracer>,
    launcher: &mut AnyLauncher,
) -> Result<fleet::Fleet, RunError> {
    let variant = &plan.variant;
    let fleet_error = |source| RunError::Generators {
        variant: variant.name.clone(),
        source: Box::new(source),
    };
    let (connection, channels) = match variant.load.connection {
        ConnectionMode::Shared { connections } => (Connection::Shared, connections as usize),
        ConnectionMode::PerRequest => (Connection::PerRequest, 1),
    };
    let entries: Vec<(DownstreamConfig, f64)> = plan
        .entries()
        .into_iter()
        .map(|(entry, share)| {
            let config = DownstreamConfig {
                hop: entry.name.clone(),
                transport: entry.transport,
                balance: entry.balance,
                replicas: addrs.hops.get(&entry.name).cloned().unwrap_or_default(),
                policy: entry.client.clone(),
                endpoints: entry.endpoints.clone(),
                connection,
                service: entry
                    .service
                    .as_ref()
                    .filter(|s| s.direct)
                    .map(|s| s.call(String::new())),
                streaming: entry.streaming != crate::scenario::Streaming::Unary,
            };
            (config, share)
        })
        .collect();
    let tls = launch::generator_tls(plan, options)?;
    let log_dir = options.dir.join("logs").join(&variant.name);
    let mut fleet = match (&options.hub, launcher) {
        (Some(hub), _) => fleet::Fleet::attach(hub, n).await,
        // Under the netns launcher each generator has a namespace and an
        // address of its own, as a hop does.
        (None, AnyLauncher::Netns(netns)) => {
            let mut namespaces = Vec::with_capacity(n as usize);
            for k in 0..n {
                let member = netns
                    .member(&crate::launcher::netns::generator_member(k))
                    .map_err(|source| RunError::Network {
                        variant: variant.name.clone(),
                        source,
                    })?;
                namespaces.push(member.ns);
            }
            let places = fleet::Places::Namespaces {
                host: std::net::IpAddr::V4(netns.network().host_addr()),
                namespaces,
                ip: tailmesh_netfault::tool::find_in_path("ip").unwrap_or_else(|| "ip".into()),
            };
            fleet::Fleet::launch(&options.exe, n, &places, &log_dir).await
        }
        (None, _) => {
            fleet::Fleet::launch(&options.exe, n, &fleet::Places::Loopback, &log_dir).await
        }
    }
    .map_err(fleet_error)?;
    if options.hub.is_none() && options.attach.is_none() {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        if let Some(line) = fleet::shared_cores_warning(n, plan.processes.len(), cpus) {
            crate::tell!("warning: variant {}: {line}", variant.name);
        }
    }
    let (trace, held) = (
        tracer.map(LoadTracer::ids),
        tracer.is_some_and(LoadTracer::holds),
    );
    fleet
        .assign(|part| fleet::frame::Job {
            part,
            load: variant.load.clone(),
            entries: entries.clone(),
            channels,
            seed: plan.seed,
            broker: addrs
                .broker
                .clone()
                .map(|b| (variant.broker, variant.queue_bounds, b)),
            tls: tls.clone(),
            trace,
            held,
        })
        .await
        .map_err(fleet_error)?;
    Ok(fleet)
}

/// Keeps trace ids of different runs and variants apart.
fn run_nonce(dir: &Path, variant: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    dir.hash(&mut h);
    variant.hash(&mut h);
    h.finish()
}
