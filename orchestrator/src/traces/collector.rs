//! The embedded OTLP trace receiver: a tonic `TraceService` that appends
//! every span batch of the run to a spool file in the run folder as it
//! arrives (bounded, drops counted; nothing kept in memory but the spans
//! held for a decision, see `held`), rejects malformed batches, and
//! optionally forwards what it spools to an external collector such as
//! Jaeger without ever slowing the run.

use super::decisions::{DecisionLog, REMEMBERED};
use std::{
    future::Future,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, MutexGuard, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use opentelemetry_proto::tonic::{
    collector::trace::v1::{ExportTraceServiceRequest, trace_service_client::TraceServiceClient},
    trace::v1::ResourceSpans,
};
use prost::Message;
use tailmesh_services::runtime_thread::{RuntimeThread, ThreadError};
use tokio::{net::TcpListener, sync::mpsc, task::JoinHandle};
use tonic::transport::server::TcpIncoming;

use super::{
    held::ReceiverHold,
    observer::{CpuMeter, CpuReading, task_cpu_ns},
    raw::{self, RawBatch},
    spool::{SpoolError, SpoolWriter},
};
use tailmesh_services::telemetry::held::{HeldCounts, HoldLimits};

/// Spans spooled at most over a run; more are dropped and counted. A bound
/// on the disk the spool takes (about 150 bytes a span), not on memory.
pub const DEFAULT_CAPACITY: usize = 50_000_000;
/// Batches waiting to be forwarded at most; more are dropped and counted.
const FORWARD_QUEUE: usize = 256;
/// How long one forwarded batch may take.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(2);
/// The receiver's HTTP/2 flow-control window, per stream and connection.
const RECEIVE_WINDOW: u32 = 4 * 1024 * 1024;
/// How long a stopping receiver lets open calls finish.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// Why the trace receiver could not start.
#[derive(Debug, thiserror::Error)]
pub enum ReceiverError {
    /// The forward target is not a URI a gRPC channel can take.
    #[error("forward target {url}: {source}")]
    ForwardTarget {
        /// The target as given.
        url: String,
        /// The transport error.
        source: tonic::transport::Error,
    },
    /// The listening address could not be bound.
    #[error("trace receiver: bind {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The bound address could not be read.
    #[error("trace receiver: local address: {0}")]
    LocalAddr(#[source] std::io::Error),
    /// The receiver's thread could not start.
    #[error(transparent)]
    Thread(#[from] ThreadError),
}

pub use tailmesh_analysis::traces::TraceCounts;

#[derive(Debug, Default)]
struct Counters {
    spans: AtomicU64,
    dropped: AtomicU64,
    rejected_batches: AtomicU64,
    forwarded: AtomicU64,
    forward_dropped: AtomicU64,
}

/// A batch to keep, as export request bytes: one the receiver took as
/// it arrived (checked, not decoded), or one this process encoded (the
/// load generator's own spans).
enum Stored {
    Raw(RawBatch),
    Local(RawBatch),
}

impl Stored {
    fn batch(&self) -> &RawBatch {
        match self {
            Stored::Raw(b) | Stored::Local(b) => b,
        }
    }
}

/// Where the run's spans go: the spool and the forwarder.
pub struct Collector {
    spool: Mutex<SpoolState>,
    capacity: usize,
    counters: Arc<Counters>,
    forward: Mutex<Option<Forwarder>>,
    /// The clock of the spool's arrival times.
    origin: Instant,
    /// The receiver thread's id, once it runs.
    receiver_tid: OnceLock<i32>,
    /// Spooling batches as they arrived, on the receiver's thread, each
    /// timed (its CPU is taken off the thread's).
    spool_raw: CpuMeter,
    /// Spooling the load generator's own spans, on its thread.
    spool_local: CpuMeter,
    /// The readings at the last seal.
    sealed_at: Mutex<CostMark>,
    /// The traces kept, for the processes that hold their spans.
    pub decisions: Arc<DecisionLog>,
    /// The spans of processes that do not hold their own, held for the
    /// decisions, when the variant holds.
    hold: Mutex<Option<ReceiverHold>>,
}

/// The collector's CPU readings at one moment.
#[derive(Clone, Copy, Debug, Default)]
struct CostMark {
    receiver_ns: Option<u64>,
    spool_raw: CpuReading,
    spool_local: CpuReading,
}

/// What the collector's own work cost between two seals, on the threads
/// that did it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CollectorCost {
    /// CPU of the receiver's thread (serving OTLP, checking batches,
    /// forwarding) besides spooling, ns; `None` when the thread's CPU
    /// time cannot be read.
    pub receiver_ns: Option<u64>,
    /// CPU spent appending batches to the spool, ns, on the receiver's
    /// thread and (for the load generator's spans, encoding included) on
    /// the load generator's.
    pub spool_ns: u64,
}

/// The spool file being written, opened at the first batch after each
/// [`Collector::seal`].
struct SpoolState {
    dir: PathBuf,
    /// The number of the next spool file.
    next: u32,
    writer: Option<SpoolWriter>,
    /// The spool file given up after an error, until the seal.
    broken: Option<PathBuf>,
    /// The error that broke the spool since the last seal.
    error: Option<SpoolError>,
}

/// One sealed spool file: the spans that arrived between two seals (one
/// variant's). Read it with [`super::spool::SpoolReader`]; remove it with
/// [`Spool::remove`] once read.
#[derive(Debug, Default)]
pub struct Spool {
    /// The file; `None` when no span arrived.
    pub path: Option<PathBuf>,
    /// Why some spans could not be spooled, if any were lost that way.
    pub error: Option<String>,
    /// What receiving and spooling these spans cost.
    pub cost: CollectorCost,
    /// What holding the spans of processes that do not hold their own
    /// did, when the receiver held them.
    pub held: Option<HeldCounts>,
    counters: Option<Arc<Counters>>,
}

impl Spool {
    /// Counts a batch that was spooled but does not decode: it is
    /// rejected after all, and its spans are not kept.
    pub fn reject(&self, spans: u64) {
        if let Some(c) = &self.counters {
            c.rejected_batches.fetch_add(1, Ordering::Relaxed);
            c.spans.fetch_sub(spans, Ordering::Relaxed);
        }
    }

    /// The spool at `path`, not counted by any collector.
    #[cfg(test)]
    pub(crate) fn at(path: PathBuf) -> Self {
        Spool {
            path: Some(path),
            ..Spool::default()
        }
    }

    /// Removes the file (best effort: it is hidden in the run folder).
    pub fn remove(&self) {
        if let Some(path) = &self.path {
            let _ = std::fs::remove_file(path);
        }
    }
}

struct Forwarder {
    tx: mpsc::Sender<ExportTraceServiceRequest>,
    task: JoinHandle<()>,
}

fn span_count(batch: &[ResourceSpans]) -> u64 {
    batch
        .iter()
        .flat_map(|r| &r.scope_spans)
        .map(|s| s.spans.len() as u64)
        .sum()
}

impl Collector {
    /// A collector spooling up to `capacity` spans into hidden files in
    /// `spool_dir`, forwarding to `forward` (an `http://host:port` OTLP
    /// gRPC endpoint) when given. Must be called inside a tokio runtime
    /// when forwarding.
    pub fn new(
        capacity: usize,
        forward: Option<&str>,
        spool_dir: &Path,
    ) -> Result<Arc<Self>, ReceiverError> {
        let counters = Arc::new(Counters::default());
        let forward = match forward {
            None => None,
            Some(url) => Some(Forwarder::start(url, Arc::clone(&counters))?),
        };
        Ok(Arc::new(Collector {
            spool: Mutex::new(SpoolState {
                dir: spool_dir.to_owned(),
                next: 1,
                writer: None,
                broken: None,
                error: None,
            }),
            capacity,
            counters,
            forward: Mutex::new(forward),
            origin: Instant::now(),
            receiver_tid: OnceLock::new(),
            spool_raw: CpuMeter::every_call(),
            spool_local: CpuMeter::sampled(),
            sealed_at: Mutex::new(CostMark::default()),
            decisions: Arc::new(DecisionLog::new(REMEMBERED)),
            hold: Mutex::new(None),
        }))
    }

    /// Until the next seal, holds the spans of processes that do not
    /// hold their own for the run's decisions within `limits` (`None`:
    /// every span is spooled as it comes).
    pub fn hold_spans(&self, limits: Option<HoldLimits>) {
        *self.hold.lock().unwrap_or_else(|e| e.into_inner()) = limits.map(ReceiverHold::new);
    }

    /// Nanoseconds since the collector started.
    fn now(&self) -> u64 {
        tailmesh_units::nanos(self.origin.elapsed())
    }

    fn lock(&self) -> MutexGuard<'_, SpoolState> {
        self.spool.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps a well-formed batch (as much of it as fits) and forwards it.
    pub fn accept(&self, batch: Vec<ResourceSpans>) {
        let spans = span_count(&batch);
        let body = ExportTraceServiceRequest {
            resource_spans: batch,
        }
        .encode_to_vec();
        self.accept_encoded(Bytes::from(body), spans);
    }

    /// Keeps an export request this process encoded itself, holding
    /// `spans` spans (the load generator's batches of client spans).
    pub fn accept_encoded(&self, body: Bytes, spans: u64) {
        self.keep(spans, Stored::Local(RawBatch::encoded(body, spans)));
    }

    /// Keeps a batch checked by [`raw::check`] as it arrived (or what of
    /// it is of kept traces, when holding), and forwards it (decoded only
    /// when forwarding is on).
    fn accept_raw(&self, batch: RawBatch) {
        let mut hold = self.hold.lock().unwrap_or_else(|e| e.into_inner());
        match hold.as_mut() {
            None => {
                drop(hold);
                self.keep(batch.spans, Stored::Raw(batch));
            }
            Some(h) => {
                let now = self.now();
                let passed = self
                    .spool_raw
                    .measure(|| h.take(batch, &self.decisions, now));
                drop(hold);
                for batch in passed {
                    self.keep(batch.spans, Stored::Raw(batch));
                }
            }
        }
    }

    /// Forwards a batch of `n` spans when forwarding is on, and spools it
    /// when it fits. A batch without spans is spooled for the counters
    /// its process reports in its resource.
    fn keep(&self, n: u64, batch: Stored) {
        if n == 0 {
            if let Stored::Raw(b) = &batch {
                self.spool_raw.measure(|| self.spool(0, b.body()));
            }
            return;
        }
        if let Some(f) = self
            .forward
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            let request = ExportTraceServiceRequest {
                resource_spans: batch
                    .batch()
                    .decode()
                    .map(|r| r.resource_spans)
                    .unwrap_or_default(),
            };
            if f.tx.try_send(request).is_err() {
                self.counters
                    .forward_dropped
                    .fetch_add(n, Ordering::Relaxed);
            }
        }
        let kept = self.counters.spans.load(Ordering::Relaxed);
        if kept + n > self.capacity as u64 {
            self.counters.dropped.fetch_add(n, Ordering::Relaxed);
            return;
        }
        let meter = match &batch {
            Stored::Raw(_) => &self.spool_raw,
            Stored::Local(_) => &self.spool_local,
        };
        meter.measure(|| self.spool(n, batch.batch().body()));
    }

    /// Appends an export request of `n` spans to the spool.
    fn spool(&self, n: u64, body: &[u8]) {
        let arrived = self.now();
        let mut spool = self.lock();
        if spool.error.is_some() {
            // The spool broke (a full disk): nothing more until the seal.
            self.counters.dropped.fetch_add(n, Ordering::Relaxed);
            return;
        }
        let written = match spool.writer.as_mut() {
            Some(w) => w.append(arrived, body),
            None => {
                let path = spool.dir.join(format!(".spans-{}.spool", spool.next));
                SpoolWriter::create(&path).and_then(|mut w| {
                    w.append(arrived, body)?;
                    spool.writer = Some(w);
                    Ok(())
                })
            }
        };
        match written {
            Ok(()) => {
                self.counters.spans.fetch_add(n, Ordering::Relaxed);
            }
            Err(e) => {
                self.counters.dropped.fetch_add(n, Ordering::Relaxed);
                // What was written before stays readable; a frame cut
                // short ends it.
                spool.broken = spool.writer.take().map(SpoolWriter::abandon);
                spool.error = Some(e);
            }
        }
    }

    /// Closes the spool file written so far and returns it; the next batch
    /// starts a new one. Call it when a variant's processes have flushed.
    pub fn seal(&self) -> Spool {
        let hold = self.hold.lock().unwrap_or_else(|e| e.into_inner()).take();
        let held = hold.map(|h| {
            let (last, counts) = h.finish(&self.decisions, self.now());
            if let Some(batch) = last {
                self.keep(batch.spans, Stored::Raw(batch));
            }
            counts
        });
        let cost = self.cost_since_seal();
        let mut spool = self.lock();
        spool.next += 1;
        let mut error = spool.error.take().map(|e| e.to_string());
        let path = match spool.writer.take() {
            None => spool.broken.take(),
            Some(w) => {
                let (path, flushed) = w.finish();
                if let Err(e) = flushed {
                    error.get_or_insert(e.to_string());
                }
                Some(path)
            }
        };
        Spool {
            path,
            error,
            cost,
            held,
            counters: Some(Arc::clone(&self.counters)),
        }
    }

    /// Notes the calling thread as the receiver's, whose CPU time counts
    /// as receiving.
    fn mark_receiver_thread(&self) {
        let _ = self.receiver_tid.set(nix::unistd::gettid().as_raw());
        let mut at = self.sealed_at.lock().unwrap_or_else(|e| e.into_inner());
        at.receiver_ns = self.receiver_tid.get().copied().and_then(task_cpu_ns);
    }

    /// What the collector cost since the last seal; the mark moves on.
    fn cost_since_seal(&self) -> CollectorCost {
        let now = CostMark {
            receiver_ns: self.receiver_tid.get().copied().and_then(task_cpu_ns),
            spool_raw: self.spool_raw.read(),
            spool_local: self.spool_local.read(),
        };
        let mut at = self.sealed_at.lock().unwrap_or_else(|e| e.into_inner());
        let raw = now.spool_raw.since(&at.spool_raw).total_ns();
        let local = now.spool_local.since(&at.spool_local).total_ns();
        let receiver_ns = match (now.receiver_ns, at.receiver_ns) {
            // Spooling raw batches runs on the receiver's thread: counted
            // as spooling, not twice.
            (Some(n), Some(a)) => Some(n.saturating_sub(a).saturating_sub(raw)),
            _ => None,
        };
        *at = now;
        CollectorCost {
            receiver_ns,
            spool_ns: raw + local,
        }
    }

    /// Seals the spool and reads every span in it back (tests only: a run
    /// reads its spool in one streaming pass).
    #[cfg(test)]
    pub(crate) fn take(&self) -> Vec<ResourceSpans> {
        let spool = self.seal();
        let mut out = Vec::new();
        let Some(path) = &spool.path else {
            return out;
        };
        let mut reader = super::spool::SpoolReader::open(path).expect("open spool");
        while let Some(frame) = reader.next_frame().expect("read spool") {
            match ExportTraceServiceRequest::decode(frame.body) {
                Ok(r) => out.extend(r.resource_spans),
                Err(_) => spool.reject(0),
            }
        }
        spool.remove();
        out
    }

    /// The counts so far.
    pub fn counts(&self) -> TraceCounts {
        let c = &self.counters;
        TraceCounts {
            spans: c.spans.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            rejected_batches: c.rejected_batches.load(Ordering::Relaxed),
            forwarded: c.forwarded.load(Ordering::Relaxed),
            forward_dropped: c.forward_dropped.load(Ordering::Relaxed),
        }
    }

    /// Waits until no span has arrived for `quiet`, at most `limit`. For
    /// services that keep running after the load (attached), whose last
    /// batches come on their exporters' schedule. Returns "" when spans
    /// settled, or a line saying that later ones may be missing.
    pub async fn settle(&self, quiet: Duration, limit: Duration) -> String {
        let seen = || {
            let c = self.counts();
            c.spans + c.dropped + c.rejected_batches
        };
        let started = tokio::time::Instant::now();
        let mut last = seen();
        let mut last_change = started;
        loop {
            tokio::time::sleep(quiet / 10).await;
            let now = seen();
            if now != last {
                last = now;
                last_change = tokio::time::Instant::now();
            } else if last_change.elapsed() >= quiet {
                return String::new();
            }
            if started.elapsed() >= limit {
                return format!(
                    "spans were still arriving {} after the load; later ones are not in this \
                     variant's traces",
                    tailmesh_units::duration(limit)
                );
            }
        }
    }

    /// Stops forwarding: waits up to `grace` for queued batches to go out,
    /// then counts what is left as dropped.
    pub async fn finish_forwarding(&self, grace: Duration) {
        let forward = self
            .forward
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let Some(Forwarder { tx, mut task }) = forward else {
            return;
        };
        drop(tx);
        if tokio::time::timeout(grace, &mut task).await.is_err() {
            task.abort();
            let _ = task.await;
        }
        // Whatever was neither delivered nor counted as dropped was lost.
        let c = &self.counters;
        let handled =
            c.forwarded.load(Ordering::Relaxed) + c.forward_dropped.load(Ordering::Relaxed);
        let total = c.spans.load(Ordering::Relaxed) + c.dropped.load(Ordering::Relaxed);
        if total > handled {
            c.forward_dropped
                .fetch_add(total - handled, Ordering::Relaxed);
        }
    }
}

impl Forwarder {
    fn start(url: &str, counters: Arc<Counters>) -> Result<Self, ReceiverError> {
        let endpoint = tonic::transport::Endpoint::from_shared(url.to_string())
            .map_err(|source| ReceiverError::ForwardTarget {
                url: url.to_owned(),
                source,
            })?
            .connect_timeout(FORWARD_TIMEOUT)
            .timeout(FORWARD_TIMEOUT);
        let mut client = TraceServiceClient::new(endpoint.connect_lazy());
        let (tx, mut rx) = mpsc::channel::<ExportTraceServiceRequest>(FORWARD_QUEUE);
        let task = tokio::spawn(async move {
            while let Some(request) = rx.recv().await {
                let n = span_count(&request.resource_spans);
                let sent = tokio::time::timeout(FORWARD_TIMEOUT, client.export(request)).await;
                let counter = match sent {
                    Ok(Ok(_)) => &counters.forwarded,
                    _ => &counters.forward_dropped,
                };
                counter.fetch_add(n, Ordering::Relaxed);
            }
        });
        Ok(Forwarder { tx, task })
    }
}

/// Takes each export request as it arrives: checked with a light decode
/// (ids, times and span count; attributes skipped) and spooled as bytes,
/// decoded in full only when the spool is read, after the variant.
fn receive(collector: &Collector, body: Bytes) -> Result<(), tonic::Status> {
    let holding = collector
        .hold
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_some();
    match raw::check(body, holding) {
        Ok(batch) => {
            collector.accept_raw(batch);
            Ok(())
        }
        Err(why) => {
            collector
                .counters
                .rejected_batches
                .fetch_add(1, Ordering::Relaxed);
            Err(tonic::Status::invalid_argument(format!(
                "malformed span batch: {why}"
            )))
        }
    }
}

/// A receiver running on its own thread and runtime, so decoding span
/// batches never delays the load generator. Stops when dropped.
pub struct ReceiverThread {
    /// Its spool.
    pub collector: Arc<Collector>,
    /// `http://<bound address>`.
    pub endpoint: String,
    /// Its thread's runtime, where further listeners are served.
    runtime: tokio::runtime::Handle,
    /// The port it is bound to.
    port: u16,
    /// Stops and joins the receiver when dropped.
    _thread: RuntimeThread,
}

impl ReceiverThread {
    /// Binds `bind` (127.0.0.1:0 for the local launchers; all interfaces
    /// on the trace port when attached to a deployment) and serves there,
    /// spooling up to `capacity` spans into `spool_dir` and forwarding to
    /// `forward` when given.
    pub fn start(
        capacity: usize,
        forward: Option<&str>,
        bind: std::net::SocketAddr,
        spool_dir: &Path,
    ) -> Result<Self, ReceiverError> {
        let forward = forward.map(str::to_string);
        let spool_dir = spool_dir.to_owned();
        let ((collector, addr, runtime), thread) =
            RuntimeThread::spawn("trace-receiver", move |ready, stopped| async move {
                let started = async {
                    let collector = Collector::new(capacity, forward.as_deref(), &spool_dir)?;
                    let listener = TcpListener::bind(bind)
                        .await
                        .map_err(|source| ReceiverError::Bind { addr: bind, source })?;
                    let addr = listener.local_addr().map_err(ReceiverError::LocalAddr)?;
                    Ok::<_, ReceiverError>((collector, listener, addr))
                };
                let (collector, listener, addr) = match started.await {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = ready.send(Err(e));
                        return;
                    }
                };
                let runtime = tokio::runtime::Handle::current();
                // A current-thread runtime: every listener's work is here.
                collector.mark_receiver_thread();
                let _ = ready.send(Ok((Arc::clone(&collector), addr, runtime)));
                if let Err(e) = serve(Arc::clone(&collector), listener, async {
                    let _ = stopped.await;
                })
                .await
                {
                    crate::tell!("warning: trace receiver on {addr}: {e}");
                }
                // Keep the forwarder's runtime alive until it is done.
                collector.finish_forwarding(Duration::ZERO).await;
            })?;
        Ok(ReceiverThread {
            collector,
            endpoint: format!("http://{addr}"),
            runtime,
            port: addr.port(),
            _thread: thread,
        })
    }

    /// A handle that opens more listeners for this receiver.
    pub fn handle(&self) -> ReceiverHandle {
        ReceiverHandle {
            collector: Arc::clone(&self.collector),
            runtime: self.runtime.clone(),
            port: self.port,
        }
    }
}

/// Opens more listeners for a running receiver: the same store, served on
/// the receiver's own thread (for processes that cannot reach the address
/// it was started on, such as those in network namespaces).
#[derive(Clone)]
pub struct ReceiverHandle {
    collector: Arc<Collector>,
    runtime: tokio::runtime::Handle,
    port: u16,
}

impl ReceiverHandle {
    /// Serves the receiver on `ip` as well, on the receiver's own port
    /// when that is free there (an ephemeral one otherwise), until the
    /// returned listener is dropped. If the receiver has stopped, the
    /// listener accepts nothing.
    pub fn listen_on(&self, ip: std::net::IpAddr) -> Result<ExtraListener, ReceiverError> {
        let wanted = std::net::SocketAddr::new(ip, self.port);
        let bound = match std::net::TcpListener::bind(wanted) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                std::net::TcpListener::bind(std::net::SocketAddr::new(ip, 0))
            }
            other => other,
        };
        let listener = bound.map_err(|source| ReceiverError::Bind {
            addr: wanted,
            source,
        })?;
        let addr = listener.local_addr().map_err(ReceiverError::LocalAddr)?;
        listener
            .set_nonblocking(true)
            .map_err(|source| ReceiverError::Bind { addr, source })?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let collector = Arc::clone(&self.collector);
        self.runtime.spawn(async move {
            let listener = match TcpListener::from_std(listener) {
                Ok(l) => l,
                Err(e) => {
                    crate::tell!("warning: trace receiver on {addr}: {e}");
                    return;
                }
            };
            // Ends when the listener's owner drops it (the sender).
            let shutdown = async {
                let _ = stopped.await;
            };
            if let Err(e) = serve(collector, listener, shutdown).await {
                crate::tell!("warning: trace receiver on {addr}: {e}");
            }
        });
        Ok(ExtraListener {
            endpoint: format!("http://{addr}"),
            _stop: stop,
        })
    }
}

/// One more listener of the receiver; stops listening when dropped.
pub struct ExtraListener {
    /// `http://<bound address>`.
    pub endpoint: String,
    /// Dropping it stops the listener.
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// Serves the OTLP trace service for `collector` on `listener` until
/// `shutdown` resolves, then lets open calls finish for at most 2 s.
pub async fn serve(
    collector: Arc<Collector>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let decisions = super::decisions::server(Arc::clone(&collector.decisions));
    let take = move |body: Bytes| receive(&collector, body);
    let stopping = tokio::sync::Notify::new();
    let server = tonic::transport::Server::builder()
        // Batches are large: a window that takes one whole saves the
        // round trips of window updates.
        .initial_stream_window_size(Some(RECEIVE_WINDOW))
        .initial_connection_window_size(Some(RECEIVE_WINDOW))
        .add_service(raw::TraceServer::new(take))
        .add_service(decisions)
        .serve_with_incoming_shutdown(incoming, async {
            shutdown.await;
            stopping.notify_one();
        });
    tokio::select! {
        served = server => served,
        // A graceful stop waits for every connection to close, and a
        // client that outlives the run (an attached deployment's hops)
        // may keep its own open: those are cut.
        () = async {
            stopping.notified().await;
            tokio::time::sleep(CLOSE_GRACE).await;
        } => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::trace::v1::{ScopeSpans, Span};

    use super::*;

    fn batch(trace_id: Vec<u8>) -> Vec<ResourceSpans> {
        vec![ResourceSpans {
            scope_spans: vec![ScopeSpans {
                spans: vec![Span {
                    trace_id,
                    span_id: vec![1; 8],
                    name: "s".into(),
                    start_time_unix_nano: 1,
                    end_time_unix_nano: 2,
                    ..Span::default()
                }],
                ..ScopeSpans::default()
            }],
            ..ResourceSpans::default()
        }]
    }

    #[tokio::test]
    async fn malformed_batches_are_rejected_and_counted_good_ones_kept() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let collector = Collector::new(10, None, tmp.path()).expect("collector");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(Arc::clone(&collector), listener, async {
            let _ = stopped.await;
        }));
        let mut client = TraceServiceClient::connect(format!("http://{addr}"))
            .await
            .expect("connect");
        let bad = client
            .export(ExportTraceServiceRequest {
                resource_spans: batch(vec![7; 3]),
            })
            .await
            .expect_err("a 3-byte trace id is refused");
        assert_eq!(bad.code(), tonic::Code::InvalidArgument);
        assert!(bad.message().contains("trace id of 3 bytes"), "{bad}");
        client
            .export(ExportTraceServiceRequest {
                resource_spans: batch(vec![7; 16]),
            })
            .await
            .expect("a good batch is taken");
        let counts = collector.counts();
        assert_eq!(counts.rejected_batches, 1);
        assert_eq!(counts.spans, 1);
        assert_eq!(span_count(&collector.take()), 1);
        let _ = stop.send(());
        server.await.expect("join").expect("serve");
    }

    #[test]
    fn the_receiver_stops_while_a_client_keeps_its_connection_open() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let receiver = ReceiverThread::start(1_000, None, ([127, 0, 0, 1], 0).into(), tmp.path())
            .expect("receiver");
        // A service that outlives the run (attached) and whose exporter
        // drives its connection only while it exports (the hops' exporter
        // thread between batches): the connection stays open, deaf to the
        // receiver's goodbye.
        let endpoint = receiver.endpoint.clone();
        let (exported_tx, exported) = std::sync::mpsc::channel();
        let (leave, left) = std::sync::mpsc::channel::<()>();
        let client = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let client = runtime.block_on(async {
                let mut client = TraceServiceClient::connect(endpoint)
                    .await
                    .expect("connect");
                let taken = client
                    .export(ExportTraceServiceRequest {
                        resource_spans: batch(vec![3; 16]),
                    })
                    .await;
                let _ = exported_tx.send(taken.map(|_| ()));
                client
            });
            let _ = left.recv();
            drop(client);
        });
        exported
            .recv_timeout(Duration::from_secs(60))
            .expect("the client exported")
            .expect("the batch was taken");
        let (stopped_tx, stopped) = std::sync::mpsc::channel();
        let stopper = std::thread::spawn(move || {
            drop(receiver);
            let _ = stopped_tx.send(());
        });
        let outcome = stopped.recv_timeout(Duration::from_secs(60));
        let _ = leave.send(());
        client.join().expect("client thread");
        assert!(
            outcome.is_ok(),
            "the receiver did not stop while a client held its connection"
        );
        stopper.join().expect("stopper thread");
    }

    #[test]
    fn each_seal_gives_what_receiving_and_spooling_cost_since_the_last() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let receiver =
            ReceiverThread::start(1_000_000, None, ([127, 0, 0, 1], 0).into(), tmp.path())
                .expect("receiver");
        let endpoint = receiver.endpoint.clone();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let mut client = TraceServiceClient::connect(endpoint)
                .await
                .expect("connect");
            for i in 0..64u8 {
                client
                    .export(ExportTraceServiceRequest {
                        resource_spans: batch(vec![i + 1; 16]),
                    })
                    .await
                    .expect("taken");
            }
        });
        let collector = &receiver.collector;
        let first = collector.seal();
        assert_eq!(collector.counts().spans, 64);
        // The receiver's thread served 64 calls and spooled 64 batches.
        assert!(
            first.cost.receiver_ns.is_some_and(|ns| ns > 0),
            "{:?}",
            first.cost
        );
        assert!(first.cost.spool_ns > 0, "{:?}", first.cost);
        first.remove();
        // Spans the orchestrator makes itself are spooled on its thread:
        // counted as spooling, not as the receiver's.
        for i in 0..32u8 {
            collector.accept(batch(vec![i + 1; 16]));
        }
        let second = collector.seal();
        assert!(second.cost.spool_ns > 0, "{:?}", second.cost);
        second.remove();
        let idle = collector.seal();
        assert_eq!(idle.cost.spool_ns, 0, "nothing spooled since the last seal");
    }

    #[test]
    fn a_full_store_drops_and_counts() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let collector = Collector::new(1, None, tmp.path()).expect("collector");
        collector.accept(batch(vec![7; 16]));
        collector.accept(batch(vec![8; 16]));
        let counts = collector.counts();
        assert_eq!((counts.spans, counts.dropped), (1, 1));
        assert_eq!(span_count(&collector.take()), 1);
    }

    #[test]
    fn a_spool_that_cannot_be_written_drops_and_counts_and_says_why() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let gone = tmp.path().join("no such folder");
        let collector = Collector::new(10, None, &gone).expect("collector");
        collector.accept(batch(vec![7; 16]));
        collector.accept(batch(vec![8; 16]));
        let counts = collector.counts();
        assert_eq!((counts.spans, counts.dropped), (0, 2));
        let spool = collector.seal();
        assert_eq!(spool.path, None);
        let why = spool.error.unwrap_or_default();
        assert!(why.contains("no such folder"), "{why}");
        // After the seal the spool is tried afresh.
        std::fs::create_dir(&gone).expect("create");
        collector.accept(batch(vec![9; 16]));
        assert_eq!(span_count(&collector.take()), 1);
    }

    /// `batch` as the bytes of an export request.
    fn encoded(batch: Vec<ResourceSpans>) -> Bytes {
        ExportTraceServiceRequest {
            resource_spans: batch,
        }
        .encode_to_vec()
        .into()
    }

    #[test]
    fn the_check_names_each_problem() {
        let problem = |b| {
            raw::check(encoded(b), true)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert_eq!(problem(batch(vec![7; 16])), "");
        assert!(problem(batch(vec![0; 16])).contains("trace id of 16 bytes"));
        let mut b = batch(vec![7; 16]);
        b[0].scope_spans[0].spans[0].span_id = vec![1; 3];
        assert!(problem(b).contains("span id of 3 bytes"));
        let mut b = batch(vec![7; 16]);
        b[0].scope_spans[0].spans[0].end_time_unix_nano = 0;
        assert!(problem(b).contains("ends before"));
        let mut b = batch(vec![7; 16]);
        b[0].scope_spans[0].spans[0].parent_span_id = vec![1; 4];
        assert!(problem(b).contains("parent"));
        assert!(
            raw::check(Bytes::from_static(&[0x0a, 0x05, 0x01]), false)
                .is_err_and(|e| e.to_string().contains("undecodable"))
        );
    }

    #[test]
    fn raw_batches_are_counted_on_arrival_and_decoded_in_full_when_taken() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let collector = Collector::new(10, None, tmp.path()).expect("collector");
        let mut b = batch(vec![7; 16]);
        let first = b[0].scope_spans[0].spans[0].clone();
        b[0].scope_spans[0].spans.push(first);
        b[0].scope_spans[0].spans[1].name = "second".into();
        collector.accept_raw(raw::check(encoded(b.clone()), true).expect("well-formed"));
        collector.accept(batch(vec![8; 16]));
        assert_eq!(collector.counts().spans, 3);
        let taken = collector.take();
        assert_eq!(taken[0], b[0], "the raw batch decodes to what was sent");
        assert_eq!(span_count(&taken), 3);
    }
}
