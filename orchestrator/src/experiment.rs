//! The whole of `tailmesh run`: read the scenario, make the run folder, run
//! every variant, analyze, write the files, and judge the checks.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use time::{OffsetDateTime, macros::format_description};
use tokio::sync::watch;

use crate::metrics::{LiveMetrics, MetricsError, MetricsServer};
use crate::{
    analysis::{
        self, ObserverReport, Rebuild, RunFacts, Summary, VariantAccumulator, VariantContext,
        observer::{ObserverInputs, ProcessInputs},
        summary::Environment,
    },
    output::{self, HlogFile, HlogSpool, OutputError, RequestsSpool, RequestsWriter},
    record::{
        RecordSink, RequestRecord,
        behind::{Behind, BehindPanicked, BehindThread},
    },
    roles,
    run::{self, RunError, RunOptions, TraceSetup, VariantRun},
    scenario::{self, Scenario, ScenarioErrors, Variant},
    traces::{
        breakdown::{TraceAnalyzer, TraceReport},
        collector::{self, ReceiverError, ReceiverThread},
        jaeger::{KeptFile, KeptTraces},
        loadgen::LoadTracer,
        observer::{CpuMeter, ReportedTotals, thread_cpu_ns},
        sift::{self, Sift},
        tail::{self, FactsError, FactsFile, TailPolicy, TailSampler},
    },
};

/// What `tailmesh run` was asked to do.
#[derive(Clone, Debug)]
pub struct RunCommand {
    /// The scenario file.
    pub scenario: PathBuf,
    /// Where run folders go: `<results>/<scenario>/<run-id>/`.
    pub results: PathBuf,
    /// Show progress bars.
    pub progress: bool,
    /// Trace nothing, whatever the scenario says.
    pub no_traces: bool,
    /// Forward every span to this OTLP gRPC endpoint (overrides the
    /// scenario's `[telemetry] forward`).
    pub otlp_forward: Option<String>,
    /// Run against a deployed mesh (Docker Compose, Kubernetes) instead of
    /// starting processes; its trace receiver listens on all interfaces.
    pub attach: Option<crate::launcher::Attach>,
    /// Await a variant's load generators at this address (`host:port`)
    /// instead of starting them: they were started elsewhere with
    /// `tailmesh generator --stay`.
    pub generators_at: Option<GeneratorsAt>,
    /// Run one generator's load in a generator process too, as several
    /// run, not in the orchestrator's process.
    pub generator_processes: bool,
    /// Serve live Prometheus metrics at this address (`host:port`;
    /// overrides the scenario's `[telemetry] metrics`).
    pub metrics: Option<String>,
}

impl RunCommand {
    /// A run of `scenario` that is one step of a larger command (a search,
    /// a case): no progress bars, no forwarding, no deployment, no live
    /// metrics; its folder under `results`.
    pub fn step(scenario: PathBuf, results: PathBuf, traces: bool) -> RunCommand {
        RunCommand {
            scenario,
            results,
            progress: false,
            no_traces: !traces,
            otlp_forward: None,
            attach: None,
            generators_at: None,
            generator_processes: false,
            metrics: None,
        }
    }
}

/// Where and how a run awaits load generators started elsewhere.
#[derive(Clone, Debug)]
pub struct GeneratorsAt {
    /// The address to listen at, `host:port`.
    pub addr: String,
    /// The token a generator must show, when the deployment has one.
    pub token: Option<String>,
    /// How long each variant waits for its generators to connect.
    pub patience: std::time::Duration,
}

/// Why a run could not produce results.
#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    /// The scenario file is not valid (exit status 2).
    #[error("{0}")]
    Scenario(#[from] ScenarioErrors),
    /// Launching or running failed.
    #[error(transparent)]
    Run(#[from] Box<RunError>),
    /// A result file could not be written or read back.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// `[load] net` or `generator_net` with generators the run does not
    /// start (exit status 2, like a scenario error).
    #[error(
        "variant \"{variant}\": [load] net and generator_net shape the links of the load \
         generators the netns launcher starts, each in a namespace of its own; {whose} have \
         none: run it without {flag}"
    )]
    GeneratorLinks {
        variant: String,
        whose: &'static str,
        flag: &'static str,
    },
    /// The live metrics could not be served.
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    /// The thread the measured records went to stopped (a bug): what it
    /// held is lost.
    #[error(transparent)]
    Records(#[from] BehindPanicked),
    /// The path of this executable (every hop process runs it).
    #[error("find the tailmesh binary: {0}")]
    Exe(#[source] std::io::Error),
    /// The load generator's runtime could not be built.
    #[error(transparent)]
    Runtime(#[from] roles::RuntimeError),
    /// The embedded trace receiver could not start.
    #[error(transparent)]
    TraceReceiver(#[from] ReceiverError),
    /// The run id could not be made from the start time.
    #[error("format the run id: {0}")]
    RunId(#[source] time::error::Format),
    /// A folder could not be made or a file read.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done: "create", "read".
        what: &'static str,
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A run folder's summary.json is not one tailmesh wrote.
    #[error("read {}: {source}", path.display())]
    ReadRun {
        /// The summary.json.
        path: PathBuf,
        /// The JSON error, with its line and column.
        source: serde_json::Error,
    },
    /// A run folder's requests.csv names a variant its summary.json lacks.
    #[error(
        "{}: requests.csv names variant \"{variant}\", which summary.json does not have",
        dir.display()
    )]
    UnknownVariant {
        /// The run folder.
        dir: PathBuf,
        /// The variant named.
        variant: String,
    },
    /// `--generators-at` could not be listened at.
    #[error("--generators-at {addr}: {source}")]
    GeneratorHub {
        /// The address given.
        addr: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// Every run folder name for this second is taken.
    #[error("no free run folder under {}", parent.display())]
    NoFreeRunDir {
        /// The scenario's results folder.
        parent: PathBuf,
    },
}

/// A run that has been measured and analyzed, its files not yet written
/// (so that its summary can be shown first, whatever the disk does).
pub struct Finished {
    /// The run folder.
    pub dir: PathBuf,
    /// What summary.json holds.
    pub summary: Summary,
    /// Whether Ctrl-C cut it short.
    pub interrupted: bool,
    /// Whether the scenario asks for terminal histograms.
    pub histograms: bool,
    /// What every variant measured, for the report.
    runs: Vec<VariantRun>,
    /// requests.csv, written while the run went, renamed into place by
    /// [`Finished::write`] (or why it was lost).
    requests: Option<Result<RequestsWriter, OutputError>>,
    /// Each variant's `.hlog`, written while the run went, renamed into
    /// place by [`Finished::write`].
    interval_logs: Vec<HlogFile>,
    /// The kept traces, for the Jaeger files.
    kept: Option<KeptFile>,
    /// The live metrics' listener and how long it stays after the run.
    metrics: Option<(MetricsServer, Duration)>,
}

impl Finished {
    /// Keeps the live metrics up for their grace period, so the last
    /// scrape sees the final counts, then stops them (at once when there
    /// are none).
    pub fn finish_metrics(&mut self) {
        if let Some((server, grace)) = self.metrics.take() {
            crate::tell!(
                "tailmesh: the final counts stay at http://{}/metrics for {}",
                server.addr(),
                tailmesh_units::duration(grace)
            );
            server.finish(grace);
        }
    }

    /// Whether every check passed (compounding, error share) and every
    /// request was accounted for.
    pub fn passed(&self) -> bool {
        self.summary.check.passed()
    }

    /// Writes the run folder's files, each whole or not at all, summary.json
    /// first (requests.csv, written during the run, is renamed into place
    /// in its turn), and points `<results>/<scenario>/latest` at the folder.
    /// Returns the files written, in the order written. A requests file the
    /// disk could not take during the run is this error, after the other
    /// files are written. Once only: a second call writes nothing.
    pub fn write(&mut self) -> Result<Vec<PathBuf>, ExperimentError> {
        let Some(requests) = self.requests.take() else {
            return Ok(Vec::new());
        };
        let written = output::write_run(
            &self.dir,
            &self.summary,
            &output::run_files(&self.summary, trace_files(&self.runs, self.kept.as_ref())),
            output::RunData {
                requests,
                traces: self.kept.as_ref(),
                interval_logs: std::mem::take(&mut self.interval_logs),
                processes: self
                    .runs
                    .iter()
                    .map(|r| (r.variant.name.as_str(), r.processes.as_slice()))
                    .collect(),
                queues: self
                    .runs
                    .iter()
                    .map(|r| (r.variant.name.as_str(), r.queues.as_slice()))
                    .collect(),
            },
        );
        if let Some(kept) = &self.kept {
            kept.remove();
        }
        link_latest(&self.dir);
        Ok(written?)
    }
}

/// A fault on a generator's link is applied to the namespace the run
/// gives it: generators started elsewhere have none.
fn generators_of_the_run(scenario: &Scenario, command: &RunCommand) -> Result<(), ExperimentError> {
    let elsewhere = if command.generators_at.is_some() {
        Some(("generators started elsewhere", "--generators-at"))
    } else if command.attach.is_some() {
        Some(("a deployment's generators", "--attach"))
    } else {
        None
    };
    let (Some((whose, flag)), Some(variant)) = (
        elsewhere,
        scenario.variants.iter().find(|v| v.load.has_net_faults()),
    ) else {
        return Ok(());
    };
    Err(ExperimentError::GeneratorLinks {
        variant: variant.name.clone(),
        whose,
        flag,
    })
}

/// Runs the scenario end to end. Blocks; builds its own single-threaded
/// runtime (the fastest load generator on small machines: the hops share
/// the same few cores, and one thread saves wake-ups across threads).
pub fn execute(command: &RunCommand) -> Result<Finished, ExperimentError> {
    let (scenario, source) = scenario::load(&command.scenario)?;
    execute_scenario(&scenario, &source, command)
}

/// [`execute`] for a scenario already read (and perhaps changed, as the
/// steps of `tailmesh search` are): `source` is the text summary.json
/// echoes, `command.scenario` where it came from.
pub fn execute_scenario(
    scenario: &Scenario,
    source: &str,
    command: &RunCommand,
) -> Result<Finished, ExperimentError> {
    generators_of_the_run(scenario, command)?;
    let exe = std::env::current_exe().map_err(ExperimentError::Exe)?;
    let started_at = OffsetDateTime::now_utc();
    let dir = create_run_dir(&command.results, &scenario.name, started_at)?;
    output::check_writable(&dir)?;
    output::check_room(&dir, &estimate_output(scenario, !command.no_traces))?;
    let run_id = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let sampling = if command.no_traces {
        0.0
    } else {
        scenario.telemetry.sampling
    };
    let forward = command
        .otlp_forward
        .clone()
        .or_else(|| scenario.telemetry.forward.clone());

    // Generators started elsewhere connect here, from before the first
    // variant to the last.
    let hub = match &command.generators_at {
        Some(at) => {
            let hub = crate::loadgen::fleet::Hub::bind(&at.addr, at.token.clone(), at.patience)
                .map_err(|source| ExperimentError::GeneratorHub {
                    addr: at.addr.clone(),
                    source,
                })?;
            if let Ok(addr) = hub.local_addr() {
                crate::tell!("tailmesh: awaiting load generators at {addr}");
            }
            Some(Arc::new(hub))
        }
        None => None,
    };
    let metrics = match command
        .metrics
        .as_ref()
        .or(scenario.telemetry.metrics.as_ref())
    {
        Some(addr) => {
            let live = Arc::new(LiveMetrics::new(&run_id));
            let server = MetricsServer::start(addr, Arc::clone(&live))?;
            crate::tell!("tailmesh: metrics at http://{}/metrics", server.addr());
            Some((live, server))
        }
        None => None,
    };
    let runtime = roles::runtime(1)?;
    let receiver = if sampling > 0.0 {
        Some(ReceiverThread::start(
            collector::DEFAULT_CAPACITY,
            forward.as_deref(),
            if command.attach.is_some() {
                std::net::SocketAddr::from(([0, 0, 0, 0], crate::deploy::TRACE_PORT))
            } else {
                // Loopback only: local processes reach it here; a netns
                // variant opens one more listener on its own network's host
                // address (run::run_variant), no other host interface.
                std::net::SocketAddr::from(([127, 0, 0, 1], 0))
            },
            &dir,
        )?)
    } else {
        None
    };
    let traces = receiver.as_ref().map(|r| TraceSetup {
        collector: Arc::clone(&r.collector),
        endpoint: r.endpoint.clone(),
        receiver: r.handle(),
        sampling,
        hold: Some(run::HoldRule::of(scenario)),
    });
    let (interrupt_tx, interrupt) = watch::channel(0u32);
    let lost = Arc::new(Mutex::new(Vec::new()));
    let requests =
        RequestsWriter::create(&dir.join("requests.csv"), scenario.check.slow_threshold)?;
    let behind = Records {
        scenario: scenario.clone(),
        dir: dir.clone(),
        sampling,
        requests: RequestsSpool::start(
            requests,
            stop_on_lost(interrupt_tx.clone(), Arc::clone(&lost), "requests.csv"),
        )?,
        interval_logs: HlogSpool::start(stop_on_lost(
            interrupt_tx.clone(),
            Arc::clone(&lost),
            "its .hlog",
        ))?,
        variants: Vec::new(),
        warnings: Vec::new(),
    };
    let mut records = RunRecords {
        behind: BehindThread::start("records", behind).map_err(|source| ExperimentError::Io {
            what: "start the records thread for",
            path: dir.clone(),
            source,
        })?,
        metrics: metrics.as_ref().map(|(live, _)| Arc::clone(live)),
    };
    let (runs, mut trace_counts) = runtime.block_on(async {
        let options = RunOptions {
            dir: dir.clone(),
            exe,
            progress: command.progress,
            traces: traces.clone(),
            attach: command.attach.clone(),
            tls_ca: None,
            hub: hub.clone(),
            generator_processes: command.generator_processes,
            metrics: metrics.as_ref().map(|(live, _)| Arc::clone(live)),
        };
        tokio::spawn(count_interrupts(interrupt_tx));
        let runs = run::run_variants(scenario, &options, interrupt, &mut records).await;
        if let Some(hub) = &hub {
            // One generator runs inside the orchestrator: none to dismiss.
            let most = crate::deploy::generator_count(scenario);
            hub.dismiss(if most > 1 { most } else { 0 }, DISMISS_GRACE)
                .await;
        }
        let runs = runs.map_err(Box::new)?;
        let counts = match &traces {
            Some(t) => {
                t.collector.finish_forwarding(FORWARD_GRACE).await;
                Some(t.collector.counts())
            }
            None => None,
        };
        Ok::<_, ExperimentError>((runs, counts))
    })?;
    let Records {
        requests,
        interval_logs,
        variants,
        warnings,
        ..
    } = records.behind.finish()?;
    // Every row queued is written before the requests file is judged.
    let requests = requests.finish();
    let interval_logs = interval_logs.finish().unwrap_or_else(|e| {
        crate::tell!("warning: the variants' .hlog files are absent: {e}");
        Vec::new()
    });
    let lost = lost
        .lock()
        .map(|mut l| std::mem::take(&mut *l))
        .unwrap_or_default();
    for line in &warnings {
        crate::tell!("warning: {line}");
    }
    let (mut reports, kept) = analyze_variants(&dir, &runs, variants, &lost);
    if let Some(r) = &receiver {
        // Spans after the last variant (none from processes that stopped).
        r.collector.seal().remove();
    }
    if let (Some(c), Some(r)) = (&mut trace_counts, &receiver) {
        // The pass over the spools counted batches that did not decode.
        *c = r.collector.counts();
    }
    drop(receiver);
    if let Some(c) = &trace_counts {
        if c.forward_dropped > 0 {
            crate::tell!(
                "warning: {} of {} span(s) could not be forwarded to {}",
                c.forward_dropped,
                c.forwarded + c.forward_dropped,
                forward.as_deref().unwrap_or("-")
            );
        }
        if c.dropped > 0 || c.rejected_batches > 0 {
            crate::tell!(
                "warning: trace receiver dropped {} span(s) (spool full or not writable) and rejected {} malformed batch(es)",
                c.dropped,
                c.rejected_batches
            );
        }
    }
    let facts = RunFacts {
        scenario,
        origin: &command.scenario,
        source,
        run_id: &run_id,
        started_at,
        environment: detect_environment(&launchers(&runs)),
        traces: trace_counts,
    };
    let files = trace_files(&runs, kept.as_ref());
    for t in reports.iter_mut().filter_map(|r| r.traces.as_mut()) {
        if let Some(s) = &mut t.sampling {
            s.files = files as u64;
        }
    }
    let mut summary = analysis::summarize_run(facts, reports);
    summary.files = output::describe(&output::run_files(&summary, files));
    Ok(Finished {
        metrics: metrics.map(|(_, server)| (server, scenario.telemetry.metrics_grace)),
        interrupted: summary.interrupted,
        dir,
        summary,
        histograms: scenario.report.histogram,
        runs,
        requests: Some(requests),
        interval_logs,
        kept,
    })
}

/// What the thread of a file written during the run (requests.csv, the
/// `.hlog`s) does when the disk cannot take it: says so at once, stops the
/// load as a first Ctrl-C does (the requests in flight are finished, the
/// remaining variants skipped), and notes the variant and the incident
/// (`file` is absent) in `lost`.
fn stop_on_lost(
    halt: watch::Sender<u32>,
    lost: Arc<Mutex<Vec<(usize, String)>>>,
    file: &'static str,
) -> impl FnOnce(usize, OutputError) + Send + 'static {
    move |variants, e| {
        crate::tell!(
            "\ntailmesh: {e}: the results disk is full (or the file too large); \
             stopping the load, finishing the requests in flight, then writing what fits"
        );
        if let Ok(mut lost) = lost.lock() {
            lost.push((
                variants.saturating_sub(1),
                format!("{e}: the results disk filled; sending stopped early, {file} is absent"),
            ));
        }
        halt.send_if_modified(|n| {
            let raise = *n < crate::loadgen::STOP_SENDING;
            if raise {
                *n = crate::loadgen::STOP_SENDING;
            }
            raise
        });
    }
}

/// The run's record pipeline: each measured request, as it completes, is
/// handed to the thread behind the load generator's
/// ([`crate::record::behind`]), which gives it to its variant's analysis,
/// to the tail sampler's slot, and to requests.csv (written on a thread of
/// its own, through a bounded queue); none is kept. The load generator's
/// thread itself feeds only the live metrics.
struct RunRecords {
    behind: BehindThread<Records>,
    /// The live metrics, when served.
    metrics: Option<Arc<LiveMetrics>>,
}

/// What the thread behind the load generator's does with the records. The
/// latency intervals the analysis closes go to the `.hlog` writer (another
/// thread, another bounded queue) and their histograms come back from it
/// for reuse. A file the disk cannot take stops the load (see
/// [`stop_on_lost`]) so the run ends cleanly with what it measured.
struct Records {
    scenario: Scenario,
    /// The run folder (the tail samplers' facts files, hidden).
    dir: PathBuf,
    /// The head-sampling share.
    sampling: f64,
    requests: RequestsSpool,
    interval_logs: HlogSpool,
    /// One per variant begun, the current one last.
    variants: Vec<VariantRecords>,
    /// What could not be set up (a facts file the disk refused), told once
    /// the load is over.
    warnings: Vec<String>,
}

/// What the load generator's side tells the thread behind, in order with
/// the records.
enum RecordsMessage {
    /// The wall-clock time of the measured clock's 0.
    MeasuringFrom(std::time::SystemTime),
    /// The records that follow are `variant`'s, traced by `tracer`.
    Begin {
        variant: Box<Variant>,
        tracer: Option<Arc<LoadTracer>>,
    },
    /// The variant's load ended.
    End(LoadEnded),
}

/// How a variant's load ended, as the thread behind needs it.
struct LoadEnded {
    measured: Duration,
    interrupted: bool,
    pipeline: crate::record::PipelineStats,
    /// The most records that waited for the thread behind at once.
    peak_behind: usize,
}

/// Where one variant's records go besides requests.csv.
struct VariantRecords {
    /// Its analysis.
    analysis: VariantAccumulator,
    /// Its tail sampler when traced, which decides as each request ends
    /// whether its trace is kept.
    sampler: Option<TailSampler>,
    /// The sampler's CPU, part of the observer's cost.
    sampling: CpuMeter,
    /// Its load generator's spans: those the sampler keeps go on when the
    /// load ends.
    tracer: Option<Arc<LoadTracer>>,
}

impl RecordSink for RunRecords {
    fn record(&mut self, record: RequestRecord) {
        if let Some(m) = &self.metrics {
            m.record(&record);
        }
        self.behind.record(record);
    }

    fn measuring_from(&mut self, at: std::time::SystemTime) {
        self.behind.send(RecordsMessage::MeasuringFrom(at));
        if let Some(m) = &self.metrics {
            m.measuring_from(at);
        }
    }

    fn sent(&mut self, measured: u64) {
        if let Some(m) = &self.metrics {
            m.sent(measured);
        }
    }
}

impl run::RecordPipeline for RunRecords {
    fn begin_variant(&mut self, variant: &scenario::Variant, tracer: Option<&Arc<LoadTracer>>) {
        // The peak is counted from here.
        self.behind.take_peak();
        self.behind.send(RecordsMessage::Begin {
            variant: Box::new(variant.clone()),
            tracer: tracer.cloned(),
        });
        if let Some(m) = &self.metrics {
            m.begin_variant(variant);
        }
    }

    fn end_variant(&mut self, load: &crate::loadgen::LoadOutcome) {
        self.behind.send(RecordsMessage::End(LoadEnded {
            measured: load.measured,
            interrupted: load.interrupted,
            pipeline: load.pipeline,
            peak_behind: self.behind.take_peak(),
        }));
        // Every decision made and every kept client span handed on before
        // the variant's processes stop and its spans are gathered.
        self.behind.settle();
        if let Some(m) = &self.metrics {
            m.end_variant();
        }
    }
}

impl Behind for Records {
    type Message = RecordsMessage;

    fn record(&mut self, record: RequestRecord) {
        if let Some(v) = self.variants.last_mut() {
            v.analysis.record(&record);
            v.hand_on_intervals(&self.interval_logs);
            if let Some(sampler) = &mut v.sampler {
                v.sampling.measure(|| sampler.record(&record));
            }
        }
        self.requests.write(record);
    }

    fn message(&mut self, message: RecordsMessage) {
        match message {
            RecordsMessage::MeasuringFrom(at) => {
                if let Some(tracer) = self.variants.last().and_then(|v| v.tracer.as_ref()) {
                    // The spans of the kept requests are made from their
                    // records, whose times count from `at`.
                    tracer.measuring_from(at);
                }
                self.interval_logs.measuring_from(at);
            }
            RecordsMessage::Begin { variant, tracer } => self.begin_variant(&variant, tracer),
            RecordsMessage::End(ended) => self.end_variant(&ended),
        }
    }
}

impl Records {
    fn begin_variant(&mut self, variant: &scenario::Variant, tracer: Option<Arc<LoadTracer>>) {
        let index = (self.variants.len(), self.scenario.variants.len());
        let sampler = tracer.clone().and_then(|tracer| {
            tail_sampler(
                &self.scenario,
                variant,
                index,
                &self.dir,
                self.sampling,
                tracer,
            )
            .map_err(|e| {
                self.warnings
                    .push(format!("variant {}: no traces: {e}", variant.name))
            })
            .ok()
        });
        let mut analysis =
            VariantAccumulator::new(variant, &self.scenario.check, self.scenario.report.interval);
        analysis.export_intervals();
        self.variants.push(VariantRecords {
            analysis,
            sampler,
            sampling: CpuMeter::sampled(),
            tracer,
        });
        self.requests.begin_variant(&variant.name);
        self.interval_logs.begin_variant(
            &self.dir.join(output::hlog::file_name(&variant.name)),
            &variant.name,
            variant.hops.iter().map(|h| h.name.clone()).collect(),
        );
    }

    fn end_variant(&mut self, ended: &LoadEnded) {
        let stats = &ended.pipeline;
        if let Some(v) = self.variants.last_mut() {
            v.analysis.end_load(ended.measured, ended.interrupted);
            v.hand_on_intervals(&self.interval_logs);
            if let Some(tracer) = &v.tracer {
                // The spans its last decisions kept.
                tracer.flush();
            }
        }
        self.interval_logs.end_variant();
        tracing::info!(
            target: "tailmesh::records",
            records = stats.records,
            peak_in_flight = stats.peak_in_flight,
            peak_held = stats.peak_held,
            peak_behind = ended.peak_behind,
            peak_queued_rows = self.requests.peak_queued(),
            peak_buffered_bytes = self.requests.peak_buffered(),
            peak_id_ranges = self
                .variants
                .last()
                .map_or(0, |v| v.analysis.peak_id_ranges()),
            "record pipeline"
        );
    }
}

impl VariantRecords {
    /// Sends the latency intervals the analysis closed to the `.hlog`
    /// writer, and takes back the histograms it is done with.
    fn hand_on_intervals(&mut self, logs: &HlogSpool) {
        while let Some(hists) = logs.returned() {
            self.analysis.give_back(hists);
        }
        while let Some(closed) = self.analysis.closed_interval() {
            logs.write(closed);
        }
    }
}

/// Bytes of a requests.csv row before its path: variant, id, four times,
/// status, attempts (the generator's one attempt timed), flags, about.
const ROW_BASE_BYTES: u64 = 130;
/// Bytes each path record adds to a row (`path` and `hops` entries, and
/// the call that reached it, one attempt, in `calls`; names aside), about.
const ROW_HOP_BYTES: u64 = 100;
/// Bytes of traces per hop of a traced request (a Jaeger span or two),
/// about, and per traced request besides (the generator's span).
const TRACE_HOP_BYTES: u64 = 1_200;
const TRACE_REQUEST_BYTES: u64 = 600;
/// The files whose size does not follow the request count: summary.json,
/// the .hgrm files, report.html, the logs.
const FIXED_BYTES: u64 = 2_000_000;

/// What `scenario` will write, from its request count: each variant's
/// requests (rate x duration, or the count asked for; a closed loop that
/// stops by time has no count known up front and is left out) times its
/// row size, plus traces when `traced`.
fn estimate_output(scenario: &scenario::Scenario, traced: bool) -> output::OutputEstimate {
    let mut estimate = output::OutputEstimate {
        bytes: FIXED_BYTES,
        ..Default::default()
    };
    let sampling = if traced {
        scenario.telemetry.sampling.clamp(0.0, 1.0)
    } else {
        0.0
    };
    for variant in &scenario.variants {
        let load = &variant.load;
        let requests = load.planned_requests().map_or(0, |n| n as u64);
        let hops = variant.hops.len() as u64;
        // A hop's name in `path`, as a parent in `hops`, as a callee in `calls`.
        let names: u64 = variant.hops.iter().map(|h| 3 * h.name.len() as u64).sum();
        let row = ROW_BASE_BYTES + variant.name.len() as u64 + hops * ROW_HOP_BYTES + names;
        let trace =
            (requests as f64 * sampling) as u64 * (TRACE_REQUEST_BYTES + hops * TRACE_HOP_BYTES);
        estimate.requests = estimate.requests.saturating_add(requests);
        estimate.row_bytes = estimate.row_bytes.max(row);
        estimate.trace_bytes = estimate.trace_bytes.saturating_add(trace);
        estimate.bytes = estimate
            .bytes
            .saturating_add(requests.saturating_mul(row))
            .saturating_add(trace);
    }
    estimate
}

/// Counts Ctrl-C and SIGTERM into `interrupts`: the first stops sending,
/// finishes what is in flight, stops the hops and still writes what was
/// measured; the second gives up the requests in flight (each counted as
/// cancelled) and stops the hops at once; the third exits on the spot
/// (the hops follow: their standard input closes).
async fn count_interrupts(interrupts: watch::Sender<u32>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        crate::tell!("warning: Ctrl-C cannot be caught; it will stop tailmesh without results");
        return;
    };
    for n in 1u32.. {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        match n {
            crate::loadgen::STOP_SENDING => crate::tell!(
                "\ninterrupted: finishing requests in flight, stopping the hops, writing results \
                 (Ctrl-C again to give up the requests in flight)"
            ),
            crate::loadgen::ABANDON => crate::tell!(
                "\ninterrupted again: giving up the requests in flight (counted as cancelled), \
                 stopping the hops, writing results (Ctrl-C again to exit at once, without results)"
            ),
            _ => {
                crate::tell!("\ninterrupted three times: exiting without results");
                std::process::exit(130);
            }
        }
        let _ = interrupts.send(n);
    }
}

/// Finishes each variant's analysis (`variants`, fed while it ran, with
/// its tail sampler when traced) into its report, printing analysis's
/// warnings; the traced variants' spools are read once each, into their
/// traces' breakdown and the kept traces, and what tracing cost them is
/// added up. `lost`: the variants during which a file written as the run
/// went (requests.csv, a `.hlog`) could not be, with the incident.
fn analyze_variants(
    dir: &Path,
    runs: &[VariantRun],
    variants: Vec<VariantRecords>,
    lost: &[(usize, String)],
) -> (Vec<analysis::VariantReport>, Option<KeptFile>) {
    let mut kept = runs
        .iter()
        .any(|r| r.tracer.is_some())
        .then(|| KeptTraces::create(&dir.join(".traces.kept"), tail::JAEGER_FILE_LIMIT));
    let mut reports = Vec::with_capacity(runs.len());
    for (i, (run, records)) in runs.iter().zip(variants).enumerate() {
        let VariantRecords {
            analysis: variant,
            sampler,
            sampling,
            ..
        } = records;
        let mut warnings = Vec::new();
        let mut incidents = run.incidents.clone();
        incidents.extend(
            lost.iter()
                .filter(|(at, _)| *at == i)
                .map(|(_, line)| line.clone()),
        );
        let pass_started = thread_cpu_ns();
        let (mut traces, processes) = match (sampler, kept.as_mut()) {
            (Some(sampler), Some(kept)) => trace_report(run, sampler, kept, &mut warnings),
            _ => {
                // Untraced, or its sampler could not start: its spool goes.
                run.spans.remove();
                (None, None)
            }
        };
        if let (Some(t), Some(hold)) = (traces.as_mut(), run.hold) {
            // The processes' holding and the receiver's (for those that
            // do not hold their own).
            let mut c = processes.as_ref().map(|p| p.counters).unwrap_or_default();
            if let Some(r) = &run.spans.held {
                c.evicted += r.evicted_spans;
                c.lost_traces += r.lost_traces;
                c.lost_delay_ns = c.lost_delay_ns.max(tailmesh_units::nanos(r.lost_delay));
                c.forgotten += r.forgotten_decisions;
            }
            t.lost = c.lost_traces;
            t.held = Some(tailmesh_analysis::traces::HeldTraces {
                hold_ms: hold.time.as_secs_f64() * 1e3,
                evicted_spans: c.evicted,
                evicted_at_receiver: run.spans.held.map_or(0, |r| r.evicted_spans),
                lost_delay_ms: c.lost_delay_ns as f64 / 1e6,
                forgotten_decisions: c.forgotten,
            });
            if c.lost_traces > 0 || c.forgotten > 0 {
                warnings.push(format!(
                    "variant {}: {} kept trace(s) lost: the processes had evicted their spans \
                     before the decision came (up to {} after the trace began; held {}, at most \
                     {} spans per process){}",
                    run.variant.name,
                    c.lost_traces,
                    tailmesh_units::duration(std::time::Duration::from_nanos(c.lost_delay_ns)),
                    tailmesh_units::duration(hold.time),
                    hold.spans,
                    if c.forgotten > 0 {
                        format!("; {} decision(s) asked for too late", c.forgotten)
                    } else {
                        String::new()
                    }
                ));
            }
        }
        let observed = run.tracer.as_ref().map(|tracer| ObserverInputs {
            traced_requests: tracer.traced(),
            spans: traces.as_ref().map_or(0, |t| t.spans),
            processes: processes.map(|p: ReportedTotals| ProcessInputs {
                processes: p.processes,
                spans: p.counters.spans,
                dropped: p.counters.dropped,
                received: p.received,
                record_ns: p.counters.record_ns,
                export_cpu_ns: p.counters.export_cpu_ns,
            }),
            receiver_ns: run.spans.cost.receiver_ns,
            spool_ns: run.spans.cost.spool_ns,
            sampling_ns: sampling.read().total_ns(),
            loadgen_spans_ns: tracer.cost().total_ns(),
            analysis_ns: pass_started
                .zip(thread_cpu_ns())
                .map(|(a, b)| b.saturating_sub(a)),
        });
        let mut analyzed = variant.finish(VariantContext {
            measured: run.load.measured,
            warmup: run.load.warmup,
            interrupted: run.load.interrupted,
            generator_links: run.load.links,
            generators: (!run.load.generators.is_empty()).then(|| analysis::record::Generators {
                count: u32::try_from(run.load.generators.len()).unwrap_or(u32::MAX),
                start_skew_us: run.load.start_skew_us,
                start_skew_bound_us: run.load.start_skew_bound_us,
                each: run.load.generators.clone(),
            }),
            streams: run
                .load
                .streams
                .as_ref()
                .map(crate::loadgen::StreamTally::report),
            incidents,
            broker: run
                .broker
                .iter()
                .cloned()
                .map(crate::wire::broker_topic_stats)
                .collect(),
            peak_memory: run.memory.clone(),
            launch: Some(run.launch),
            faults: run.faults.clone(),
            fault_windows: run.fault_windows.clone(),
            kills: run.kills.clone(),
            endpoints: run.endpoints.clone(),
            machine: run.load.instrument.clone(),
            traces,
        });
        let mut observer = match &observed {
            Some(m) => ObserverReport::assess(m, &analyzed.report),
            None => ObserverReport::off(),
        };
        if run.launcher == "attached" {
            // The services are not this process's children: the load
            // window's CPU would be the orchestrator's alone.
            observer.share_of_cpu = None;
        }
        analyzed.report.observer = Some(observer);
        for line in warnings.iter().chain(&analyzed.warnings) {
            crate::tell!("warning: {line}");
        }
        reports.push(analyzed.report);
    }
    (reports, kept.map(KeptTraces::finish))
}

/// The tail sampler of variant `index.0` of `index.1`, whose load generator
/// traces with `tracer`: the [`RecordSink`] that sees each of its measured
/// requests as it ends.
fn tail_sampler(
    scenario: &Scenario,
    variant: &Variant,
    index: (usize, usize),
    dir: &Path,
    sampling: f64,
    tracer: Arc<LoadTracer>,
) -> Result<TailSampler, FactsError> {
    let policy = TailPolicy::resolve(
        &scenario.telemetry.keep,
        variant,
        scenario.check.slow_threshold,
        sampling,
        tail::JAEGER_FILE_LIMIT / index.1.max(1) as u64,
    );
    let hops = variant.hops.iter().map(|h| h.name.clone()).collect();
    let facts = FactsFile::create(
        &dir.join(format!(".facts-{}", index.0)),
        hops,
        variant.most_visits(),
    )?;
    let sampler = TailSampler::new(
        policy,
        scenario.seed,
        Box::new({
            let tracer = Arc::clone(&tracer);
            move |id| tracer.sampled(id)
        }),
        facts,
    )
    .with_paths(crate::traces::breakdown::PathTimes::new(variant));
    // The processes hold their spans by the same policy
    // (`run::TraceSetup::hold`).
    Ok(if policy.holds() {
        sampler.holding(Box::new(move |record, kept| tracer.decide(record, kept)))
    } else {
        sampler
    })
}

/// The traces' breakdown of `run` from one pass over its spool, the kept
/// traces set aside into `kept`, and the counters its processes reported;
/// removes the spool and the facts file.
fn trace_report(
    run: &VariantRun,
    sampler: TailSampler,
    kept: &mut KeptTraces,
    warnings: &mut Vec<String>,
) -> (Option<TraceReport>, Option<ReportedTotals>) {
    let name = &run.variant.name;
    let mut analyzer = TraceAnalyzer::new();
    let (facts, mut counts, facts_warning) = sampler.finish(&mut analyzer);
    warnings.extend(facts_warning.map(|w| format!("variant {name}: {w}")));
    if let Some(e) = &run.spans.error {
        warnings.push(format!("variant {name}: some spans were lost: {e}"));
    }
    let sifted = sift::sift(
        &run.spans,
        Sift {
            variant: name,
            horizon: Sift::horizon_for(run.variant.load.timeout),
            keep_unmeasured: counts.keep_share >= 1.0,
        },
        Some(&facts),
        &mut analyzer,
        kept,
    );
    facts.remove();
    run.spans.remove();
    match sifted {
        Ok(sifted) => {
            counts.written = sifted.written;
            let mut report = analyzer.finish();
            report.sampling = Some(counts);
            (Some(report), sifted.processes.totals())
        }
        Err(e) => {
            warnings.push(format!("variant {name}: no traces breakdown: {e}"));
            (None, None)
        }
    }
}

/// How many Jaeger files the run writes: those the kept traces fill, and
/// one (empty) when traced variants kept none.
fn trace_files(runs: &[VariantRun], kept: Option<&KeptFile>) -> usize {
    let traced = runs.iter().any(|r| r.tracer.is_some());
    match kept {
        Some(k) => k.files().max(1),
        None => usize::from(traced),
    }
}

/// The launchers that ran the variants: "local", "netns", or both
/// ("local+netns") when variants differ.
fn launchers(runs: &[VariantRun]) -> String {
    let mut kinds: Vec<&str> = runs.iter().map(|r| r.launcher).collect();
    kinds.sort_unstable();
    kinds.dedup();
    if kinds.is_empty() {
        "local".to_owned()
    } else {
        kinds.join("+")
    }
}

/// Reads a run folder's summary.json back, with each variant's latency
/// histogram and requests over time rebuilt from requests.csv, read one
/// row at a time (no request is kept).
pub fn read_run(dir: &Path) -> Result<Summary, ExperimentError> {
    let path = dir.join("summary.json");
    let text = std::fs::read_to_string(&path).map_err(|source| ExperimentError::Io {
        what: "read",
        path: path.clone(),
        source,
    })?;
    let mut summary: Summary =
        serde_json::from_str(&text).map_err(|source| ExperimentError::ReadRun { path, source })?;
    let mut rebuilds: Vec<Rebuild> = summary.variants.iter().map(Rebuild::new).collect();
    let mut unknown = None;
    // Rows come variant after variant: look up a name only when it changes.
    let mut current: Option<(String, usize)> = None;
    output::for_each_request(&dir.join("requests.csv"), |variant, record| {
        let index = match &current {
            Some((name, i)) if name == variant => Some(*i),
            _ => summary.variants.iter().position(|v| v.name == variant),
        };
        match index {
            Some(i) => {
                if current.as_ref().is_none_or(|(name, _)| name != variant) {
                    current = Some((variant.to_owned(), i));
                }
                rebuilds[i].record(&record);
            }
            None => {
                unknown.get_or_insert_with(|| variant.to_owned());
            }
        }
    })?;
    if let Some(variant) = unknown {
        return Err(ExperimentError::UnknownVariant {
            dir: dir.to_owned(),
            variant,
        });
    }
    for (report, rebuild) in summary.variants.iter_mut().zip(rebuilds) {
        rebuild.finish(report);
    }
    Ok(summary)
}

/// `tailmesh report <run-folder>`: redraws report.html from the folder's
/// files; returns the report's path.
pub fn regenerate_report(dir: &Path) -> Result<PathBuf, ExperimentError> {
    let summary = read_run(dir)?;
    let path = dir.join("report.html");
    output::write_report(&path, &summary)?;
    Ok(path)
}

/// How long queued spans get to reach the forward target at the end.
const FORWARD_GRACE: Duration = Duration::from_secs(3);

/// How long a run that awaited its load generators waits, at its end, for
/// them to come back and be told to exit.
const DISMISS_GRACE: Duration = Duration::from_secs(5);

fn create_run_dir(
    results: &Path,
    scenario: &str,
    at: OffsetDateTime,
) -> Result<PathBuf, ExperimentError> {
    let stamp = at
        .format(format_description!(
            "[year][month][day]T[hour][minute][second]Z"
        ))
        .map_err(ExperimentError::RunId)?;
    let parent = results.join(scenario);
    std::fs::create_dir_all(&parent).map_err(|source| ExperimentError::Io {
        what: "create",
        path: parent.clone(),
        source,
    })?;
    for n in 1..1000 {
        let id = if n == 1 {
            stamp.clone()
        } else {
            format!("{stamp}-{n}")
        };
        let dir = parent.join(id);
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(source) => {
                return Err(ExperimentError::Io {
                    what: "create",
                    path: dir,
                    source,
                });
            }
        }
    }
    Err(ExperimentError::NoFreeRunDir { parent })
}

/// Points `<results>/<scenario>/latest` at this run (best effort).
fn link_latest(dir: &Path) {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return;
    };
    let link = parent.join("latest");
    let _ = std::fs::remove_file(&link);
    let _ = std::os::unix::fs::symlink(name, &link);
}

/// The host's facts for summary.json: the kernel release from
/// /proc/sys/kernel/osrelease (else `uname -r`), the host name from
/// /proc/sys/kernel/hostname (else `uname -n`). Facts that cannot be read
/// are `None`, never an error.
fn detect_environment(launcher: &str) -> Environment {
    Environment {
        tailmesh_version: env!("CARGO_PKG_VERSION").to_string(),
        os: std::env::consts::OS.to_string(),
        arch: std::env::consts::ARCH.to_string(),
        kernel: read_fact("/proc/sys/kernel/osrelease", "-r"),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        hostname: read_fact("/proc/sys/kernel/hostname", "-n"),
        launcher: launcher.to_string(),
    }
}

/// The trimmed content of `file`, else the output of `uname <flag>`.
fn read_fact(file: &str, uname_flag: &str) -> Option<String> {
    let text = std::fs::read_to_string(file).ok().or_else(|| {
        let out = std::process::Command::new("uname")
            .arg(uname_flag)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    })?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_knows_this_host() {
        let e = detect_environment("local");
        assert_eq!(e.launcher, "local");
        assert_eq!(e.tailmesh_version, env!("CARGO_PKG_VERSION"));
        assert!(e.cpus >= 1);
        if cfg!(target_os = "linux") {
            assert!(e.kernel.is_some());
        }
    }
}
