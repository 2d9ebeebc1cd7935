//! One generator process of several (`tailmesh generator`): it connects to
//! the orchestrator, takes its job (its part of a variant's load), answers
//! clock probes, starts at the instant it is told, and streams each
//! measured request back as it ends, with a beat every 100 ms. When the
//! orchestrator's connection closes, it gives its requests in flight up.
//! Started by the orchestrator, it then exits: nothing outlives the run. A
//! generator that stays (`--stay`, started by a deployment beside the
//! orchestrator) connects again for the next variant, until the
//! orchestrator says the run is over.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tailmesh_analysis::{instrument, stats};
use tailmesh_services::{
    hop::{
        call::{Reach, reach::ReachPlan},
        server::SERVICE_PATIENCE,
    },
    timer::Sleeper,
};
use tokio::{
    io::{AsyncWrite, BufReader},
    net::{TcpStream, tcp::OwnedReadHalf},
    sync::{mpsc, watch},
    time::Instant,
};

use super::frame::{
    self, ClientSpan, FromGenerator, GeneratorOutcome, Job, ToGenerator, unix_ns_now,
};
use crate::{
    loadgen::{ABANDON, ClientSpans, LoadClock, Target, Tracing, generate},
    record::{RecordSink, RequestRecord},
    traces::loadgen::{Ended, RequestTrace},
};

/// How often a generator says it is alive while its load runs.
pub(crate) const BEAT_EVERY: Duration = Duration::from_millis(100);
/// How long a generator started by the orchestrator tries to reach it.
const CONNECT_PATIENCE: Duration = Duration::from_secs(10);
/// How long a generator that stays tries to reach the orchestrator: the
/// orchestrator may wait minutes for the mesh's containers or pods first,
/// and sets up each variant's hops between variants.
pub const STAY_PATIENCE: Duration = Duration::from_secs(600);
/// A generator that stays, told its index is not needed this variant,
/// waits this long before it asks again.
const SKIPPED_PAUSE: Duration = Duration::from_millis(200);
/// Records (or spans) sent on in one frame at most.
const BATCH: usize = 1024;

/// Why a generator process stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum GeneratorError {
    #[error("generator {index}: reach the orchestrator at {hub} (tried for {}): {source}",
        tailmesh_units::duration(*patience))]
    Connect {
        index: u32,
        hub: String,
        patience: Duration,
        source: std::io::Error,
    },
    #[error("generator {index}: the orchestrator's connection: {source}")]
    Hub {
        index: u32,
        source: frame::FrameError,
    },
    #[error("generator {index}: {message}")]
    Job { index: u32, message: String },
    #[error("generator {index}: {source}")]
    Prepare { index: u32, source: PrepareError },
}

/// Why a generator could not get ready for its job.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("the mesh's TLS files: {0}")]
    Tls(#[source] tailmesh_services::tls::TlsError),
    #[error("reach entry hop {hop:?}: {source}")]
    Reach {
        hop: String,
        source: tailmesh_services::hop::call::reach::ReachError,
    },
}

/// Who a generator is and whom it serves.
#[derive(Clone, Debug)]
pub struct Joining {
    /// The orchestrator's address, `host:port` (a name is resolved).
    pub hub: String,
    /// Which generator it is, from 0.
    pub index: u32,
    /// Stay for every variant of the run (a deployment's generator), not
    /// only the one it was started for.
    pub stay: bool,
    /// The deployment's token, shown to the orchestrator.
    pub token: Option<String>,
}

/// What one connection to the orchestrator came to.
enum Served {
    /// Its part of a variant, sent (or given up when told).
    Variant,
    /// No part for it this variant.
    Skipped,
    /// The run is over.
    Bye,
}

/// Runs generator `joining.index` for the orchestrator at `joining.hub`:
/// one variant, or, staying, every variant until the orchestrator says
/// the run is over.
pub async fn serve(joining: Joining) -> Result<(), GeneratorError> {
    let patience = if joining.stay {
        STAY_PATIENCE
    } else {
        CONNECT_PATIENCE
    };
    loop {
        let stream = connect(&joining, patience).await?;
        match serve_one(stream, &joining).await? {
            Served::Variant if joining.stay => {}
            Served::Variant | Served::Bye => return Ok(()),
            Served::Skipped => tokio::time::sleep(SKIPPED_PAUSE).await,
        }
    }
}

/// Serves one connection: hello, a job, the load.
async fn serve_one(stream: TcpStream, joining: &Joining) -> Result<Served, GeneratorError> {
    let index = joining.index;
    let _ = stream.set_nodelay(true);
    let (reader, mut writer) = stream.into_split();
    let mut reader = BufReader::new(reader);
    let hub_error = |source| GeneratorError::Hub { index, source };
    frame::write(
        &mut writer,
        &FromGenerator::Hello {
            index,
            pid: std::process::id(),
            token: joining.token.clone(),
        },
    )
    .await
    .map_err(hub_error)?;
    let job = match frame::read(&mut reader).await.map_err(hub_error)? {
        ToGenerator::Job(job) => job,
        ToGenerator::Skip => return Ok(Served::Skipped),
        ToGenerator::Bye => return Ok(Served::Bye),
        other => {
            return Err(GeneratorError::Job {
                index,
                message: format!("expected a job first, got {other:?}"),
            });
        }
    };
    let prepared = match prepare(&job).await {
        Ok(prepared) => prepared,
        Err(source) => {
            // The orchestrator hears why, as text: the wire carries no types.
            let error = source.to_string();
            let _ = frame::write(&mut writer, &FromGenerator::Failed { error }).await;
            return Err(GeneratorError::Prepare { index, source });
        }
    };
    frame::write(&mut writer, &FromGenerator::Ready)
        .await
        .map_err(hub_error)?;
    // Clock probes until the start.
    let at_unix_ns = loop {
        match frame::read(&mut reader).await.map_err(hub_error)? {
            ToGenerator::Ping { seq } => {
                frame::write(
                    &mut writer,
                    &FromGenerator::Pong {
                        seq,
                        unix_ns: unix_ns_now(),
                    },
                )
                .await
                .map_err(hub_error)?;
            }
            ToGenerator::Start { at_unix_ns } => break at_unix_ns,
            ToGenerator::Stop { .. } => return Ok(Served::Variant),
            other @ (ToGenerator::Job(_)
            | ToGenerator::Skip
            | ToGenerator::Bye
            | ToGenerator::Picks { .. }) => {
                return Err(GeneratorError::Job {
                    index,
                    message: format!("expected clock probes or the start, got {other:?}"),
                });
            }
        }
    };
    run(job, prepared, at_unix_ns, reader, writer)
        .await
        .map_err(hub_error)?;
    Ok(Served::Variant)
}

async fn connect(joining: &Joining, patience: Duration) -> Result<TcpStream, GeneratorError> {
    let deadline = Instant::now() + patience;
    loop {
        match TcpStream::connect(joining.hub.as_str()).await {
            Ok(stream) => return Ok(stream),
            Err(source) if Instant::now() >= deadline => {
                return Err(GeneratorError::Connect {
                    index: joining.index,
                    hub: joining.hub.clone(),
                    patience,
                    source,
                });
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The job read: the variant's load and its entries, reached.
struct Prepared {
    load: crate::scenario::Load,
    target: Target,
}

async fn prepare(job: &Job) -> Result<Prepared, PrepareError> {
    if let Some(files) = &job.tls {
        let tls = files.load().map_err(PrepareError::Tls)?;
        tailmesh_services::tls::install_client(Some(tls.client));
    }
    let mut reaches = Vec::with_capacity(job.entries.len());
    for (entry, share) in &job.entries {
        let plan = ReachPlan {
            hop: &entry.hop,
            caller: None,
            transport: entry.transport,
            replicas: &entry.replicas,
            balance: entry.balance,
            connection: entry.connection,
            channels: job.channels,
            seed: job.seed,
            endpoints: &entry.endpoints,
            broker: job
                .broker
                .as_ref()
                .map(|(kind, bounds, addr)| (*kind, *bounds, addr)),
            service: entry.service.as_ref(),
        };
        let reach = Reach::resolve(&plan, SERVICE_PATIENCE)
            .await
            .map_err(|source| PrepareError::Reach {
                hop: entry.hop.clone(),
                source,
            })?;
        reaches.push((reach, entry.policy.clone(), *share));
    }
    Ok(Prepared {
        load: job.load.clone(),
        target: Target::new(reaches, job.seed),
    })
}

/// Hands each traced request's span to the writer, for the orchestrator
/// to record.
struct ForwardedSpans(mpsc::UnboundedSender<ClientSpan>);

impl ClientSpans for ForwardedSpans {
    fn record(&self, _: RequestTrace, id: u64, ended: &dyn Fn() -> Ended) {
        let ended = ended();
        let _ = self.0.send(ClientSpan {
            id,
            ended_unix_ns: tailmesh_units::unix_nanos_at(ended.ended),
            latency: ended.latency,
            error: ended.error,
            stream: ended.stream,
        });
    }

    fn flush(&self) {}
}

/// When the run holds its traces: counts the traced requests and
/// forwards nothing (the orchestrator makes the kept ones' spans from
/// their records).
#[derive(Default)]
struct CountedSpans(AtomicU64);

impl ClientSpans for CountedSpans {
    fn record(&self, _: RequestTrace, _: u64, _: &dyn Fn() -> Ended) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    fn flush(&self) {}
}

/// Hands each measured record to the writer as it ends, and counts what
/// the beats and the self-watch's judgement need.
struct Streamed {
    records: mpsc::UnboundedSender<RequestRecord>,
    sent: watch::Sender<(u64, u64)>,
    ended: u64,
    lateness: hdrhistogram::Histogram<u64>,
}

impl RecordSink for Streamed {
    fn record(&mut self, r: RequestRecord) {
        self.ended += 1;
        let late = r.start.saturating_sub(r.intended);
        self.lateness.saturating_record(stats::micros(late));
        let ended = self.ended;
        self.sent.send_modify(|(_, e)| *e = ended);
        // The writer only goes when the connection does, and then the run
        // is over for this generator.
        let _ = self.records.send(r);
    }

    fn sent(&mut self, measured: u64) {
        self.sent.send_modify(|(s, _)| *s = measured);
    }
}

async fn run(
    job: Box<Job>,
    prepared: Prepared,
    at_unix_ns: u64,
    mut reader: BufReader<OwnedReadHalf>,
    mut writer: impl AsyncWrite + Unpin + Send + 'static,
) -> Result<(), frame::FrameError> {
    // The origin on this process's monotonic clock.
    let now_ns = unix_ns_now();
    let now = Instant::now();
    let origin = if at_unix_ns >= now_ns {
        now + Duration::from_nanos(at_unix_ns - now_ns)
    } else {
        now.checked_sub(Duration::from_nanos(now_ns - at_unix_ns))
            .unwrap_or(now)
    };
    let clock = LoadClock {
        origin,
        warmup: prepared.load.warmup,
    };
    let origin_unix_ns = unix_ns_now().saturating_add_signed(
        i64::try_from(nanos_between(Instant::now(), origin)).unwrap_or(i64::MAX),
    );
    frame::write(&mut writer, &FromGenerator::Started { origin_unix_ns }).await?;

    let (records_tx, mut records_rx) = mpsc::unbounded_channel::<RequestRecord>();
    let (spans_tx, mut spans_rx) = mpsc::unbounded_channel::<ClientSpan>();
    let (sent_tx, sent_rx) = watch::channel((0u64, 0u64));
    let (stop_tx, stop_rx) = watch::channel(0u32);
    // A kill's questions about the entry pools, answered by the writer.
    let (answers_tx, mut answers_rx) = mpsc::unbounded_channel::<FromGenerator>();
    let pools = prepared.target.push_pools();
    // The writer: records and spans gathered until the next beat, every
    // BEAT_EVERY (or until BATCH of them), and written just before it: the
    // process wakes for its beat anyway, and the orchestrator reads one
    // frame of each a beat instead of one a request. It ends once every
    // record is written.
    let writer_task = tokio::spawn(async move {
        let mut beat = tokio::time::interval(BEAT_EVERY);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut batch = Vec::with_capacity(BATCH);
        let mut spans = Vec::new();
        let mut spans_open = true;
        let mut answers_open = true;
        loop {
            // At least 1: a full batch is written at once.
            let room = BATCH - batch.len();
            tokio::select! {
                got = records_rx.recv_many(&mut batch, room) => {
                    if got == 0 || batch.len() >= BATCH {
                        write_batches(&mut writer, &mut batch, &mut spans).await?;
                    }
                    if got == 0 {
                        break;
                    }
                }
                got = spans_rx.recv_many(&mut spans, BATCH), if spans_open && spans.len() < BATCH => {
                    spans_open = got > 0;
                    if spans.len() >= BATCH {
                        write_batches(&mut writer, &mut batch, &mut spans).await?;
                    }
                }
                answer = answers_rx.recv(), if answers_open => match answer {
                    Some(answer) => frame::write(&mut writer, &answer).await?,
                    None => answers_open = false,
                },
                _ = beat.tick() => {
                    write_batches(&mut writer, &mut batch, &mut spans).await?;
                    let (sent, ended) = *sent_rx.borrow();
                    frame::write(&mut writer, &FromGenerator::Beat { sent, ended }).await?;
                }
            }
        }
        // Spans of requests that ended last.
        while spans_rx.recv_many(&mut spans, BATCH).await > 0 {
            let spans = std::mem::take(&mut spans);
            frame::write(&mut writer, &FromGenerator::Spans { spans }).await?;
        }
        Ok::<_, frame::FrameError>(writer)
    });
    // The orchestrator's word while the load runs: interrupts, a kill's
    // questions, or its connection closing (then requests in flight are
    // given up).
    let asked = pools.clone();
    let listener = tokio::spawn(async move {
        loop {
            match frame::read::<_, ToGenerator>(&mut reader).await {
                Ok(ToGenerator::Stop { interrupts }) => {
                    stop_tx.send_modify(|n| *n = (*n).max(interrupts));
                }
                Ok(ToGenerator::Picks { seq, hop, replica }) => {
                    let picks = crate::wire::pool_picks(&asked, &hop, replica);
                    // Done writing: the orchestrator takes the final view.
                    let _ = answers_tx.send(FromGenerator::Picks { seq, picks });
                }
                Ok(_) => {}
                Err(_) => {
                    stop_tx.send_modify(|n| *n = (*n).max(ABANDON));
                    return;
                }
            }
        }
    });
    let counted = Arc::new(CountedSpans::default());
    let mut sink = Streamed {
        records: records_tx,
        sent: sent_tx,
        ended: 0,
        lateness: stats::new_histogram(),
    };
    let outcome = generate(
        prepared.target,
        &prepared.load,
        clock,
        job.seed,
        Sleeper::Precise,
        None,
        stop_rx,
        Tracing {
            ids: job.trace,
            spans: job.trace.map(|_| {
                if job.held {
                    Arc::clone(&counted) as Arc<dyn ClientSpans>
                } else {
                    Arc::new(ForwardedSpans(spans_tx)) as Arc<dyn ClientSpans>
                }
            }),
        },
        job.part,
        &mut sink,
    )
    .await;
    let Streamed {
        records, lateness, ..
    } = sink;
    drop(records);
    let endpoints = crate::wire::pools_endpoints(
        &crate::wire::generator_caller(job.part.index),
        &pools,
        crate::wire::measured_seconds(&clock),
    );
    let mut writer = writer_task
        .await
        .map_err(|e| frame::FrameError::Io(std::io::Error::other(e)))??;
    let lateness = stats::Percentiles::from_histogram(&lateness);
    let done = GeneratorOutcome {
        warmup: outcome.warmup,
        measured: outcome.measured,
        interrupted: outcome.interrupted,
        links: outcome.links,
        // Its own sends and timer: the CPU the hops and the orchestrator
        // use is "others" to this process, and the orchestrator judges the
        // machine's.
        instrument: outcome.instrument.map(|mut m| {
            m.cpu_use = None;
            instrument::judge(&m, &lateness)
        }),
        records: outcome.pipeline.records,
        peak_in_flight: outcome.pipeline.peak_in_flight,
        traced: counted.0.load(Ordering::Relaxed),
        streams: outcome.streams,
        endpoints,
    };
    frame::write(&mut writer, &FromGenerator::Done(Box::new(done))).await?;
    // The orchestrator closes the connection once it has everything.
    let _ = tokio::time::timeout(Duration::from_secs(10), listener).await;
    Ok(())
}

/// Writes the records and spans gathered, if any, a frame each.
async fn write_batches(
    writer: &mut (impl AsyncWrite + Unpin),
    records: &mut Vec<RequestRecord>,
    spans: &mut Vec<ClientSpan>,
) -> Result<(), frame::FrameError> {
    if !records.is_empty() {
        let records = std::mem::take(records);
        frame::write(writer, &FromGenerator::Records { records }).await?;
    }
    if !spans.is_empty() {
        let spans = std::mem::take(spans);
        frame::write(writer, &FromGenerator::Spans { spans }).await?;
    }
    Ok(())
}

/// Signed ns from `from` to `to`.
fn nanos_between(from: Instant, to: Instant) -> i128 {
    if to >= from {
        to.duration_since(from).as_nanos() as i128
    } else {
        -(from.duration_since(to).as_nanos() as i128)
    }
}
