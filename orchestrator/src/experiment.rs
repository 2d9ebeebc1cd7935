//! The whole of `tailmesh run`: read the scenario, make the run folder, run
//! every variant, analyze, write the files, and judge the checks.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use time::{OffsetDateTime, macros::format_description};
use tokio::sync::watch;

use crate::{
    analysis::{
        self, Rebuild, RunFacts, Summary, VariantAccumulator, VariantContext, summary::Environment,
    },
    output::{self, OutputError},
    record::{RecordSink, RequestRecord},
    roles,
    run::{self, RunError, RunOptions, TraceSetup, VariantRun},
    scenario::{self, Scenario, ScenarioErrors, Variant},
    traces::{
        breakdown::{TraceAnalyzer, TraceReport},
        collector::{self, ReceiverError, ReceiverThread},
        jaeger::{KeptFile, KeptTraces},
        loadgen::LoadTracer,
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
    /// What every variant measured, for requests.csv and the report.
    runs: Vec<VariantRun>,
    /// The kept traces, for the Jaeger files.
    kept: Option<KeptFile>,
}

impl Finished {
    /// Whether every check passed (compounding, error share) and every
    /// request was accounted for.
    pub fn passed(&self) -> bool {
        self.summary.check.passed()
    }

    /// Writes the run folder's files, each whole or not at all, summary.json
    /// first, and points `<results>/<scenario>/latest` at the folder.
    /// Returns the files written, in the order written.
    pub fn write(&self) -> Result<Vec<PathBuf>, ExperimentError> {
        let requests: Vec<(&str, &[RequestRecord])> = self
            .runs
            .iter()
            .map(|r| (r.variant.name.as_str(), r.load.records.as_slice()))
            .collect();
        let written = output::write_run(
            &self.dir,
            &self.summary,
            &output::run_files(&self.summary, trace_files(&self.runs, self.kept.as_ref())),
            &output::RunData {
                requests: &requests,
                traces: self.kept.as_ref(),
            },
        );
        if let Some(kept) = &self.kept {
            kept.remove();
        }
        let written = written?;
        link_latest(&self.dir);
        Ok(written)
    }
}

/// Runs the scenario end to end. Blocks; builds its own single-threaded
/// runtime (the fastest load generator on small machines: the hops share
/// the same few cores, and one thread saves wake-ups across threads).
pub fn execute(command: &RunCommand) -> Result<Finished, ExperimentError> {
    let (scenario, source) = scenario::load(&command.scenario)?;
    let exe = std::env::current_exe().map_err(ExperimentError::Exe)?;
    let started_at = OffsetDateTime::now_utc();
    let dir = create_run_dir(&command.results, &scenario.name, started_at)?;
    output::check_writable(&dir)?;
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
    });
    let (runs, mut trace_counts) = runtime.block_on(async {
        let options = RunOptions {
            dir: dir.clone(),
            exe,
            progress: command.progress,
            traces: traces.clone(),
            attach: command.attach.clone(),
        };
        let (interrupt_tx, interrupt) = watch::channel(0u32);
        tokio::spawn(count_interrupts(interrupt_tx));
        let runs = run::run_variants(&scenario, &options, interrupt)
            .await
            .map_err(Box::new)?;
        let counts = match &traces {
            Some(t) => {
                t.collector.finish_forwarding(FORWARD_GRACE).await;
                Some(t.collector.counts())
            }
            None => None,
        };
        Ok::<_, ExperimentError>((runs, counts))
    })?;
    let traced = Traced {
        dir: &dir,
        sampling,
    };
    let (mut reports, kept) = analyze_variants(&scenario, &runs, &traced);
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
        scenario: &scenario,
        origin: &command.scenario,
        source: &source,
        run_id: &run_id,
        started_at,
        environment: Environment::detect(&launchers(&runs)),
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
        interrupted: summary.interrupted,
        dir,
        summary,
        histograms: scenario.report.histogram,
        runs,
        kept,
    })
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

/// Where traced variants' traces go.
struct Traced<'a> {
    /// The run folder (the facts files and the kept traces, hidden).
    dir: &'a Path,
    /// The head-sampling share.
    sampling: f64,
}

/// Analyzes the variants into their reports, printing analysis's warnings;
/// the traced ones' spools are read once each, into their traces' breakdown
/// and the kept traces.
fn analyze_variants(
    scenario: &Scenario,
    runs: &[VariantRun],
    traced: &Traced<'_>,
) -> (Vec<analysis::VariantReport>, Option<KeptFile>) {
    let mut kept = runs
        .iter()
        .any(|r| r.tracer.is_some())
        .then(|| KeptTraces::create(&traced.dir.join(".traces.kept"), tail::JAEGER_FILE_LIMIT));
    let mut reports = Vec::with_capacity(runs.len());
    for (i, run) in runs.iter().enumerate() {
        let mut variant = VariantAccumulator::new(&run.variant, &scenario.check);
        let mut warnings = Vec::new();
        let mut sampler = run.tracer.clone().and_then(|tracer| {
            let sampler = tail_sampler(scenario, &run.variant, (i, runs.len()), traced, tracer);
            sampler
                .map_err(|e| warnings.push(format!("variant {}: no traces: {e}", run.variant.name)))
                .ok()
        });
        for record in &run.load.records {
            variant.record(record);
            if let Some(s) = &mut sampler {
                s.record(record);
            }
        }
        let traces = match (sampler, kept.as_mut()) {
            (Some(sampler), Some(kept)) => trace_report(run, sampler, kept, &mut warnings),
            _ => None,
        };
        let analyzed = variant.finish(VariantContext {
            measured: run.load.measured,
            warmup: run.load.warmup,
            interrupted: run.load.interrupted,
            generator_links: run.load.links,
            incidents: run.incidents.clone(),
            broker: run.broker.iter().cloned().map(Into::into).collect(),
            peak_memory: run.memory.clone(),
            faults: run.faults.clone(),
            machine: run.load.instrument.clone(),
            traces,
        });
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
    traced: &Traced<'_>,
    tracer: Arc<LoadTracer>,
) -> Result<TailSampler, FactsError> {
    let policy = TailPolicy::resolve(
        &scenario.telemetry.keep,
        variant,
        scenario.check.slow_threshold,
        traced.sampling,
        tail::JAEGER_FILE_LIMIT / index.1.max(1) as u64,
    );
    let hops = variant.hops.iter().map(|h| h.name.clone()).collect();
    let facts = FactsFile::create(&traced.dir.join(format!(".facts-{}", index.0)), hops)?;
    Ok(TailSampler::new(
        policy,
        scenario.seed,
        Box::new(move |id| tracer.sampled(id)),
        facts,
    ))
}

/// The traces' breakdown of `run` from one pass over its spool, the kept
/// traces set aside into `kept`; removes the spool and the facts file.
fn trace_report(
    run: &VariantRun,
    sampler: TailSampler,
    kept: &mut KeptTraces,
    warnings: &mut Vec<String>,
) -> Option<TraceReport> {
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
            Some(report)
        }
        Err(e) => {
            warnings.push(format!("variant {name}: no traces breakdown: {e}"));
            None
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

/// Each variant's name and its requests, in the summary's order.
pub type VariantRecords = Vec<(String, Vec<RequestRecord>)>;

/// Reads a run folder's summary.json and requests.csv back, with each
/// variant's latency histogram rebuilt from the requests.
pub fn read_run(dir: &Path) -> Result<(Summary, VariantRecords), ExperimentError> {
    let path = dir.join("summary.json");
    let text = std::fs::read_to_string(&path).map_err(|source| ExperimentError::Io {
        what: "read",
        path: path.clone(),
        source,
    })?;
    let mut summary: Summary =
        serde_json::from_str(&text).map_err(|source| ExperimentError::ReadRun { path, source })?;
    let mut records: Vec<(String, Vec<RequestRecord>)> = summary
        .variants
        .iter()
        .map(|v| (v.name.clone(), Vec::new()))
        .collect();
    for (variant, record) in output::read_requests_csv(&dir.join("requests.csv"))? {
        match records.iter_mut().find(|(name, _)| *name == variant) {
            Some((_, list)) => list.push(record),
            None => {
                return Err(ExperimentError::UnknownVariant {
                    dir: dir.to_owned(),
                    variant,
                });
            }
        }
    }
    for (report, (_, list)) in summary.variants.iter_mut().zip(&records) {
        let mut rebuild = Rebuild::new();
        for r in list {
            rebuild.record(r);
        }
        rebuild.finish(report);
    }
    Ok((summary, records))
}

/// `tailmesh report <run-folder>`: redraws report.html from the folder's
/// files; returns the report's path.
pub fn regenerate_report(dir: &Path) -> Result<PathBuf, ExperimentError> {
    let (summary, _) = read_run(dir)?;
    let path = dir.join("report.html");
    output::write_report(&path, &summary)?;
    Ok(path)
}

/// How long queued spans get to reach the forward target at the end.
const FORWARD_GRACE: Duration = Duration::from_secs(3);

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
