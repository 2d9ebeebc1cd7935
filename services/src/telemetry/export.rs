//! The exporter: one thread per process, at the least scheduling
//! priority, that wakes every [`INTERVAL`] or whenever a serving thread
//! has left [`super::recorder::WAKE_EVERY`] spans, takes those, writes
//! them as one OTLP `ExportTraceServiceRequest` straight into a reused
//! byte buffer (see [`otlp`]) and sends those bytes over
//! OTLP/gRPC to the collector. Between exports the thread waits inside its
//! runtime, so the connection to the collector keeps being served: pings
//! are answered and a collector that stops (GOAWAY) or closes the
//! connection is heard at once, not at the next export. Every request's
//! resource carries the process's identity, encoded once, and the
//! observer's own counters (see [`Batcher`]).
//!
//! Configuration comes from the standard variables, read as the
//! OpenTelemetry SDK and OTLP exporter 0.33 read them for a gRPC exporter
//! given its endpoint and a 5 s timeout in code: `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_EXPORTER_OTLP_TRACES_HEADERS` (else
//! `OTEL_EXPORTER_OTLP_HEADERS`), `OTEL_EXPORTER_OTLP_TRACES_INSECURE` (else
//! `OTEL_EXPORTER_OTLP_INSECURE`) for an endpoint without a scheme,
//! `OTEL_EXPORTER_OTLP_TRACES_COMPRESSION` (else
//! `OTEL_EXPORTER_OTLP_COMPRESSION`; only `none` is supported) and
//! `OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT`.

use std::{
    collections::HashMap,
    str::FromStr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc::{self, Receiver},
    },
    thread::JoinHandle,
    time::Duration,
};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use opentelemetry_proto::tonic::{
    collector::trace::v1::ExportTraceServiceResponse,
    common::v1::{AnyValue, KeyValue, any_value::Value},
    resource::v1::Resource,
};
use prost::Message;
use tailmesh_proto::pb::{KeptRequest, trace_decisions_client::TraceDecisionsClient};
use tokio::sync::Notify;
use tonic::{
    GrpcMethod,
    client::Grpc,
    codegen::http::uri::PathAndQuery,
    metadata::{MetadataKey, MetadataMap, MetadataValue},
    transport::Channel,
};

use super::{
    Process,
    held::{Held, HeldCounts, HoldLimits, TraceIds},
    otlp,
    recorder::{Counters, SpanRecord, Spans},
};
use crate::turns::Turns;

/// How often the exporter takes the spans handed over: each export
/// request costs the exporter a few tens of microseconds (HTTP/2, system
/// calls) whatever its size, so fewer, larger ones cost less per span.
pub const INTERVAL: Duration = Duration::from_millis(200);
/// Spans per export request at most.
const MAX_BATCH: usize = 1024;
/// Spans waiting for their decisions that make a holding process ask for
/// them every [`INTERVAL`]; with fewer, it asks every [`QUIET_ASK`]. An
/// ask, and the export of what it kept, are round trips to the run's
/// receiver that cost both ends a hundred microseconds or more in a busy
/// mesh, where every process's exporter wakes cold: a mesh of many
/// processes that each see a few hundred requests a second (fifty
/// imported services) spent more on them than on its spans while a
/// process asked every 200 ms from 256 spans. With 2,048, a process asks
/// every 200 ms from about 10,000 spans a second (a hop of a busy chain
/// still does), and holds at most about a second of them otherwise.
const ASK_SPANS: usize = 2048;
/// How long a holding process with few spans waiting goes between asks
/// at most (well inside the run's memory of its decisions, and its
/// hold).
pub const QUIET_ASK: Duration = Duration::from_secs(1);

/// How often a holding process with `waiting` spans undecided asks for
/// its decisions: the one rule [`ask_due`] and [`nap_after`] read.
fn ask_every(waiting: usize) -> Duration {
    if waiting >= ASK_SPANS {
        INTERVAL
    } else {
        QUIET_ASK
    }
}

/// Whether a holding process asks for its decisions now, `waited` after
/// its last ask with `waiting` spans undecided.
fn ask_due(waited: Option<Duration>, waiting: usize) -> bool {
    waited.is_none_or(|w| w >= ask_every(waiting))
}

/// How long a holding process's exporter sleeps, `waited` after its last
/// ask with `waiting` spans undecided: until its next ask is due, and at
/// least an [`INTERVAL`].
fn nap_after(waited: Option<Duration>, waiting: usize) -> Duration {
    waited.map_or(INTERVAL, |w| {
        ask_every(waiting).saturating_sub(w).max(INTERVAL)
    })
}

/// The timeout of one export (the OTLP exporter's, set in code before).
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// The instrumentation scope of tailmesh's spans.
const SCOPE: &str = "tailmesh";

/// Why spans cannot be exported (the process then runs without export).
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("invalid endpoint {endpoint:?}")]
    Endpoint {
        endpoint: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("endpoint {0:?} uses HTTPS, but this build has no TLS for trace export")]
    Https(String),
    #[error("{var}={value:?}: only \"none\" compression is supported")]
    Compression { var: &'static str, value: String },
    #[error("otlp-export: thread")]
    Thread(#[source] std::io::Error),
    #[error("otlp-export: runtime")]
    Runtime(#[source] std::io::Error),
}

/// Where and how spans are sent, from the environment.
#[derive(Debug)]
pub struct ExportConfig {
    endpoint: tonic::transport::Endpoint,
    headers: MetadataMap,
    /// The resource's attributes apart from the observer's counters.
    resource: Vec<KeyValue>,
    attribute_limit: usize,
    /// Spans held until the run's keep decisions ([`HOLD_ENV`]), or all
    /// sent as they come.
    hold: Option<HoldLimits>,
}

/// The hold of retroactive sampling, in milliseconds: set, the exporter
/// holds every span by trace and sends only the traces the run's
/// receiver says it kept (`TraceDecisions`), see [`super::held`].
pub const HOLD_ENV: &str = "TAILMESH_TRACE_HOLD_MS";
/// The most spans held ([`DEFAULT_HOLD_SPANS`] when unset).
pub const HOLD_SPANS_ENV: &str = "TAILMESH_TRACE_HOLD_SPANS";
/// Spans held at most by default: about 200 bytes each, 40 MB.
pub const DEFAULT_HOLD_SPANS: usize = 200_000;

/// The hold from [`HOLD_ENV`] and [`HOLD_SPANS_ENV`]; `None` unset or 0.
fn hold_from_env() -> Option<HoldLimits> {
    let ms = env(HOLD_ENV)?
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|ms| *ms > 0)?;
    let max_spans = env(HOLD_SPANS_ENV)
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(DEFAULT_HOLD_SPANS);
    Some(HoldLimits {
        hold: Duration::from_millis(ms),
        max_spans,
    })
}

fn env(var: &str) -> Option<String> {
    std::env::var(var).ok()
}

/// The first set variable of `vars`.
fn env_either(vars: [&'static str; 2]) -> Option<(&'static str, String)> {
    vars.into_iter()
        .find_map(|v| env(v).map(|value| (v, value)))
}

fn kv(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(value) }),
        ..KeyValue::default()
    }
}

impl ExportConfig {
    /// The configuration for `endpoint` from the environment, for the
    /// spans of `process`.
    pub fn from_env(endpoint: &str, process: &Process) -> Result<Self, ExportError> {
        let has_scheme = endpoint
            .split_once("://")
            .is_some_and(|(scheme, _)| !scheme.contains(['/', '?', '#']));
        let insecure = env_either([
            "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
            "OTEL_EXPORTER_OTLP_INSECURE",
        ])
        .is_some_and(|(_, v)| v.eq_ignore_ascii_case("true"));
        let endpoint = match (has_scheme, insecure) {
            (true, _) => endpoint.to_string(),
            (false, true) => format!("http://{endpoint}"),
            (false, false) => format!("https://{endpoint}"),
        };
        if endpoint.starts_with("https://") {
            return Err(ExportError::Https(endpoint));
        }
        for var in [
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
            "OTEL_EXPORTER_OTLP_COMPRESSION",
        ] {
            match env(var).map(|v| v.trim().to_ascii_lowercase()) {
                None => continue,
                Some(v) if v == "none" => break,
                Some(v) if v == "gzip" || v == "zstd" => {
                    return Err(ExportError::Compression { var, value: v });
                }
                // Unknown values are ignored, as the OTLP exporter does.
                Some(_) => continue,
            }
        }
        let parsed = tonic::transport::Endpoint::from_shared(endpoint.clone())
            .map_err(|source| ExportError::Endpoint { endpoint, source })?
            .timeout(TIMEOUT)
            .connect_timeout(TIMEOUT);
        let headers = env_either([
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "OTEL_EXPORTER_OTLP_HEADERS",
        ])
        .map(|(_, v)| parse_headers(&v))
        .unwrap_or_default();
        let attribute_limit = env("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT")
            .and_then(|v| usize::from_str(v.trim()).ok())
            .unwrap_or(128);
        Ok(ExportConfig {
            endpoint: parsed,
            headers,
            resource: resource_from_env(process),
            attribute_limit,
            hold: hold_from_env(),
        })
    }
}

/// `key=value` pairs separated by commas, values URL-decoded when they
/// decode; pairs that are no valid metadata are skipped.
fn parse_headers(value: &str) -> MetadataMap {
    let mut map = MetadataMap::new();
    for pair in value.split_terminator(',').map(str::trim) {
        let Some((k, v)) = pair.split_once('=') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim());
        let v = url_decode(v).unwrap_or_else(|| v.to_string());
        if k.is_empty() || v.is_empty() {
            continue;
        }
        if let (Ok(k), Ok(v)) = (
            MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes()),
            MetadataValue::try_from(v.as_str()),
        ) {
            map.append(k, v);
        }
    }
    map
}

fn url_decode(value: &str) -> Option<String> {
    let b = value.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The resource attributes naming a process, beside `service.name`: the
/// same keys its spans would carry, so a reader takes a span's own
/// attribute first and its resource's otherwise.
const PROCESS_KEYS: [&str; 4] = ["hop", "replica", "transport", "variant"];

/// `OTEL_RESOURCE_ATTRIBUTES` (`key=value,...`), then `service.name` from
/// `OTEL_SERVICE_NAME` (default "tailmesh"), `process`'s `hop`, `replica`
/// and `transport`, the `variant`, the SDK attributes and this process's
/// `service.instance.id`. The attributes set here win over the
/// environment's of the same key.
fn resource_from_env(process: &Process) -> Vec<KeyValue> {
    let service = env("OTEL_SERVICE_NAME").unwrap_or_else(|| "tailmesh".into());
    let mut attributes: Vec<KeyValue> = env("OTEL_RESOURCE_ATTRIBUTES")
        .unwrap_or_default()
        .split_terminator(',')
        .filter_map(|entry| entry.split_once('='))
        .map(|(k, v)| (k.trim(), v.trim()))
        .filter(|(k, _)| *k != "service.name" && !PROCESS_KEYS.contains(k))
        .map(|(k, v)| kv(k, Value::StringValue(v.to_string())))
        .collect();
    attributes.push(kv("service.name", Value::StringValue(service)));
    if let Some(hop) = &process.hop {
        attributes.push(kv("hop", Value::StringValue(hop.clone())));
    }
    if let Some(replica) = process.replica {
        attributes.push(kv("replica", Value::IntValue(i64::from(replica))));
    }
    if let Some(transport) = process.transport {
        attributes.push(kv(
            "transport",
            Value::StringValue(transport.as_str().into()),
        ));
    }
    attributes.push(kv(
        "variant",
        Value::StringValue(super::variant().to_owned()),
    ));
    attributes.push(kv(
        "telemetry.sdk.name",
        Value::StringValue("tailmesh".into()),
    ));
    attributes.push(kv(
        "telemetry.sdk.language",
        Value::StringValue("rust".into()),
    ));
    attributes.push(kv(
        "telemetry.sdk.version",
        Value::StringValue(env!("CARGO_PKG_VERSION").into()),
    ));
    attributes.push(kv(
        "service.instance.id",
        Value::StringValue(format!(
            "{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        )),
    ));
    attributes
}

/// Turns handed-over spans into export requests and keeps the observer's
/// counters: every request's resource carries `tailmesh.observer.spans`
/// (spans recorded so far, dropped ones included),
/// `tailmesh.observer.dropped`, `tailmesh.observer.record_ns` (serving
/// threads' time on spans and propagation so far) and
/// `tailmesh.observer.export_cpu_ns` (the exporter thread's CPU time so
/// far), all cumulative.
///
/// A request is written as bytes: first its spans, behind a gap, then
/// what goes before them (the resource, whose fixed attributes were
/// encoded once, its counters, and the lengths of the enclosing messages)
/// at the gap's end, so the spans never move.
#[derive(Debug)]
pub struct Batcher {
    /// The resource's attributes apart from the counters, as the fields
    /// of a `Resource`.
    resource: Vec<u8>,
    attribute_limit: usize,
    counters: Arc<Counters>,
    /// Spans handed over so far.
    received: u64,
    record_ns: u64,
    /// What the hold did so far, when spans are held.
    pub held: Option<HeldCounts>,
    /// Where requests are written; its memory comes back for the next
    /// one once the previous one is sent.
    buf: BytesMut,
    /// The resource field of the request being written.
    head: BytesMut,
}

impl Batcher {
    pub fn new(
        config_resource: Vec<KeyValue>,
        attribute_limit: usize,
        counters: Arc<Counters>,
    ) -> Self {
        let resource = Resource {
            attributes: config_resource,
            ..Resource::default()
        }
        .encode_to_vec();
        Batcher {
            resource,
            attribute_limit,
            counters,
            received: 0,
            record_ns: 0,
            held: None,
            buf: BytesMut::new(),
            head: BytesMut::new(),
        }
    }

    /// The export request of `spans` (`ExportTraceServiceRequest` bytes),
    /// the exporter having used `export_cpu_ns` of CPU so far; the
    /// thread's `turns` tick with each span.
    pub fn encode(&mut self, spans: &[SpanRecord], export_cpu_ns: u64, turns: &mut Turns) -> Bytes {
        self.received += spans.len() as u64;
        self.record_ns += spans.iter().map(|r| r.cost_ns).sum::<u64>();
        let dropped = self.counters.dropped.load(Ordering::Relaxed);
        let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);

        // ResourceSpans.resource
        let head = &mut self.head;
        head.clear();
        let resource = otlp::open(head, 1, 2);
        head.put_slice(&self.resource);
        let held = self.held.unwrap_or_default();
        for (key, n) in [
            (
                "tailmesh.observer.spans",
                self.received + dropped + held.evicted_spans,
            ),
            ("tailmesh.observer.dropped", dropped),
            (
                "tailmesh.observer.record_ns",
                self.record_ns + held.evicted_cost_ns,
            ),
            ("tailmesh.observer.export_cpu_ns", export_cpu_ns),
        ] {
            otlp::int_attribute(head, 1, key, int(n));
        }
        if self.held.is_some() {
            for (key, n) in [
                ("tailmesh.observer.evicted", held.evicted_spans),
                ("tailmesh.observer.evicted_early", held.evicted_early),
                ("tailmesh.observer.lost_traces", held.lost_traces),
                (
                    "tailmesh.observer.forgotten_decisions",
                    held.forgotten_decisions,
                ),
                (
                    "tailmesh.observer.lost_delay_ns",
                    u64::try_from(held.lost_delay.as_nanos()).unwrap_or(u64::MAX),
                ),
            ] {
                otlp::int_attribute(head, 1, key, int(n));
            }
        }
        otlp::close(head, resource);

        // The ScopeSpans' body, behind room for the request's tag and
        // length, the resource, and ResourceSpans.scope_spans's tag and
        // length.
        let buf = &mut self.buf;
        buf.clear();
        let gap = head.len() + 2 * (1 + otlp::MAX_VARINT);
        buf.put_bytes(0, gap);
        let scope = otlp::open(buf, 1, 1);
        otlp::bytes_field(buf, 1, SCOPE.as_bytes());
        otlp::close(buf, scope);
        for r in spans {
            turns.tick();
            otlp::span(buf, r, self.attribute_limit);
        }

        let scope_spans = (buf.len() - gap) as u64;
        let resource_spans =
            head.len() as u64 + 1 + otlp::varint_len(scope_spans) as u64 + scope_spans;
        let start = gap
            - (1 + otlp::varint_len(resource_spans)
                + head.len()
                + 1
                + otlp::varint_len(scope_spans));
        let mut before = &mut buf[start..gap];
        // ExportTraceServiceRequest.resource_spans
        otlp::tag(&mut before, 1, 2);
        otlp::varint(&mut before, resource_spans);
        before.put_slice(head);
        // ResourceSpans.scope_spans
        otlp::tag(&mut before, 2, 2);
        otlp::varint(&mut before, scope_spans);
        buf.advance(start);
        buf.split().freeze()
    }
}

/// This thread's CPU time so far.
fn thread_cpu_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).map_or(0, |t| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
            + u64::try_from(t.tv_nsec()).unwrap_or(0)
    })
}

/// The running exporter thread; [`ExportThread::shutdown`] flushes it.
#[derive(Debug)]
pub struct ExportThread {
    stop: Arc<AtomicBool>,
    /// Ends the exporter's idle wait early (a notification given while it
    /// exports is kept for its next wait).
    wake: Arc<Notify>,
    done: Receiver<()>,
    thread: JoinHandle<()>,
}

impl ExportThread {
    /// Starts the exporter of the spans arriving on `spans`.
    pub fn spawn(
        config: ExportConfig,
        mut spans: Spans,
        counters: Arc<Counters>,
    ) -> Result<Self, ExportError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(ExportError::Runtime)?;
        let stop = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(Notify::new());
        let (finished, done) = mpsc::channel();
        let (stopping, woken) = (stop.clone(), wake.clone());
        let thread = std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || {
                yield_to_serving();
                export_loop(&runtime, config, &mut spans, counters, &stopping, &woken);
                let _ = finished.send(());
            })
            .map_err(ExportError::Thread)?;
        Ok(ExportThread {
            stop,
            wake,
            done,
            thread,
        })
    }

    /// What ends the exporter's wait: the recorder rings it as spans come.
    pub fn waker(&self) -> Arc<Notify> {
        Arc::clone(&self.wake)
    }

    /// Exports what is still queued, waiting up to 5 s, and stops.
    pub fn shutdown(self) {
        self.stop.store(true, Ordering::Release);
        self.wake.notify_one();
        match self.done.recv_timeout(TIMEOUT) {
            Ok(()) => {
                let _ = self.thread.join();
            }
            Err(_) => tracing::warn!("trace export shutdown: spans still unsent after 5 s"),
        }
    }
}

/// Lowers the calling thread to the least scheduling priority (nice 19):
/// the exporter runs on time the serving threads leave, and a serving
/// thread woken by a request takes the core from it at once instead of
/// waiting out its turn. Where the kernel refuses, it stays as it was.
fn yield_to_serving() {
    let thread = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(thread), 19) {
        tracing::debug!("trace export: kept its priority ({e})");
    }
}

fn export_loop(
    runtime: &tokio::runtime::Runtime,
    config: ExportConfig,
    spans: &mut Spans,
    counters: Arc<Counters>,
    stop: &AtomicBool,
    wake: &Notify,
) {
    let channel = {
        let _entered = runtime.enter();
        config.endpoint.connect_lazy()
    };
    let mut sender = Sender {
        client: Grpc::new(channel.clone()),
        headers: config.headers.clone(),
        counters: counters.clone(),
        failing: false,
    };
    let mut hold = config.hold.map(|limits| Hold {
        held: Held::new(limits),
        decisions: TraceDecisionsClient::new(channel),
        headers: config.headers.clone(),
        after: 0,
        log: 0,
        failing: false,
        sent_counts: None,
        last_sent: tokio::time::Instant::now(),
        pending: Vec::new(),
        decided: HashMap::default(),
        asked_at: None,
    });
    let mut batcher = Batcher::new(config.resource, config.attribute_limit, counters.clone());
    let mut batch = Vec::with_capacity(MAX_BATCH);
    // The thread's work between two naps, in turns.
    let mut turns = Turns::new();
    loop {
        let stopping = stop.load(Ordering::Acquire);
        match &mut hold {
            None => {
                spans.take(&mut batch);
                for chunk in batch.chunks(MAX_BATCH) {
                    let body = batcher.encode(chunk, thread_cpu_ns(), &mut turns);
                    sender.send(runtime, body, chunk.len() as u64);
                }
                batch.clear();
            }
            Some(hold) => {
                hold.step(runtime, spans, stopping, &mut batch, &mut turns);
                batcher.held = Some(hold.held.counts());
                // Every kept span, and the counters once a second even
                // with nothing to send (and at the end): the observer
                // reads them from the latest request.
                let due = hold.sent_counts != batcher.held
                    && (stopping || hold.last_sent.elapsed() >= COUNTERS_EVERY);
                if !batch.is_empty() || due {
                    for chunk in batch.chunks(MAX_BATCH) {
                        let body = batcher.encode(chunk, thread_cpu_ns(), &mut turns);
                        sender.send(runtime, body, chunk.len() as u64);
                    }
                    if batch.is_empty() {
                        let body = batcher.encode(&[], thread_cpu_ns(), &mut turns);
                        sender.send(runtime, body, 0);
                    }
                    hold.sent_counts = batcher.held;
                    hold.last_sent = tokio::time::Instant::now();
                    batch.clear();
                }
            }
        }
        if stopping {
            return;
        }
        // Waiting in the runtime serves the connection meanwhile.
        let nap = hold.as_ref().map_or(INTERVAL, Hold::nap);
        runtime.block_on(async {
            tokio::select! {
                () = tokio::time::sleep(nap) => {}
                () = wake.notified() => {}
            }
        });
        turns.begin();
    }
}

/// How often a holding exporter with nothing kept still sends its
/// counters.
const COUNTERS_EVERY: Duration = Duration::from_secs(1);

/// Sends export requests over one client, counting what fails.
struct Sender {
    client: Grpc<Channel>,
    headers: MetadataMap,
    counters: Arc<Counters>,
    failing: bool,
}

impl Sender {
    /// Sends `body`, the export request of `n` spans.
    fn send(&mut self, runtime: &tokio::runtime::Runtime, body: Bytes, n: u64) {
        let mut request = tonic::Request::new(body);
        *request.metadata_mut() = self.headers.clone();
        request
            .extensions_mut()
            .insert(GrpcMethod::new(otlp::SERVICE, otlp::METHOD));
        let sent = runtime.block_on(async {
            tokio::time::timeout(TIMEOUT, export(&mut self.client, request)).await
        });
        let error = match sent {
            Ok(Ok(_)) => None,
            Ok(Err(status)) => Some(status.to_string()),
            Err(_) => Some("timed out after 5 s".to_string()),
        };
        if let Some(e) = &error {
            self.counters.dropped.fetch_add(n, Ordering::Relaxed);
            if !self.failing {
                tracing::warn!("trace export: {e} (spans dropped until it recovers)");
            }
        }
        self.failing = error.is_some();
    }
}

/// The spans held until the run's keep decisions, and where those come
/// from.
struct Hold {
    held: Held,
    decisions: TraceDecisionsClient<Channel>,
    headers: MetadataMap,
    /// The position of the last decision read, and the log it is a
    /// position in (0 before the first reply).
    after: u64,
    log: u64,
    failing: bool,
    /// The counters last sent, and when.
    sent_counts: Option<HeldCounts>,
    last_sent: tokio::time::Instant,
    /// Spans taken since the last decisions were asked for: most of their
    /// traces are decided by the next ask, and go on or away from here
    /// without being held.
    pending: Vec<SpanRecord>,
    /// The last ask's decisions, by trace: kept or not (reused).
    decided: HashMap<u128, bool, TraceIds>,
    /// When the decisions were last asked for.
    asked_at: Option<tokio::time::Instant>,
}

impl Hold {
    /// Takes the spans handed over; once an [`INTERVAL`] when many wait,
    /// else once a [`QUIET_ASK`] (and when `stopping`; see [`ask_due`]),
    /// asks for the decisions since the last ones: the kept
    /// traces' spans go into `out`, the dropped ones' away, and only the
    /// spans of traces still undecided are held. Then evicts what waited
    /// past its hold (everything, `stopping`). Each span taken ticks the
    /// thread's `turns`.
    fn step(
        &mut self,
        runtime: &tokio::runtime::Runtime,
        spans: &mut Spans,
        stopping: bool,
        out: &mut Vec<SpanRecord>,
        turns: &mut Turns,
    ) {
        spans.take(&mut self.pending);
        if self.waiting() > self.held.max_spans() {
            // Past the cap, waiting spans are held now: the oldest traces
            // go early, and a late keep decision is a counted loss.
            let now = held_clock();
            for span in self.pending.drain(..) {
                turns.tick();
                self.held.add(span, now, out);
            }
        }
        let due = ask_due(self.waited(), self.waiting());
        if !(due || stopping) {
            return;
        }
        self.asked_at = Some(tokio::time::Instant::now());
        self.ask(runtime);
        // The ask waited for its answer: work starts again.
        turns.begin();
        let pending = self.pending.drain(..).inspect(|_| {
            turns.tick();
        });
        self.held.decide(&self.decided, pending, held_clock(), out);
        let now = held_clock();
        if stopping {
            self.held.evict_all(now);
        } else {
            self.held.expire(now);
        }
    }

    /// How long the exporter sleeps before its next step (unless a
    /// serving thread's full buffer wakes it): until its next ask when few
    /// spans wait for one, so that a quiet process wakes about once a
    /// [`QUIET_ASK`], else an [`INTERVAL`].
    fn nap(&self) -> Duration {
        nap_after(self.waited(), self.waiting())
    }

    /// The time since the last ask (`None` before the first).
    fn waited(&self) -> Option<Duration> {
        self.asked_at.map(|at| at.elapsed())
    }

    /// Spans waiting for their decisions.
    fn waiting(&self) -> usize {
        self.pending.len() + self.held.len()
    }

    /// Asks for the decisions since the last ones, into `decided`.
    fn ask(&mut self, runtime: &tokio::runtime::Runtime) {
        self.decided.clear();
        loop {
            let mut request = tonic::Request::new(KeptRequest {
                after: self.after,
                log: self.log,
            });
            *request.metadata_mut() = self.headers.clone();
            let asked = runtime.block_on(async {
                tokio::time::timeout(TIMEOUT, self.decisions.kept(request)).await
            });
            let reply = match asked {
                Ok(Ok(reply)) => reply.into_inner(),
                Ok(Err(status)) => {
                    self.warn(&status.to_string());
                    break;
                }
                Err(_) => {
                    self.warn("timed out after 5 s");
                    break;
                }
            };
            self.failing = false;
            self.held.forgotten(reply.forgotten);
            self.after = reply.next;
            self.log = reply.log;
            self.decided
                .extend(trace_ids(&reply.trace_ids).map(|t| (t, true)));
            self.decided
                .extend(trace_ids(&reply.dropped_ids).map(|t| (t, false)));
            if !reply.more {
                break;
            }
        }
    }

    fn warn(&mut self, e: &str) {
        if !self.failing {
            tracing::warn!("trace decisions: {e} (held spans are evicted until it recovers)");
        }
        self.failing = true;
    }
}

/// The 16-byte trace ids of a decisions reply.
fn trace_ids(bytes: &[u8]) -> impl Iterator<Item = u128> + '_ {
    bytes
        .chunks_exact(16)
        .filter_map(|c| c.try_into().ok().map(u128::from_be_bytes))
}

/// Nanoseconds on the holder's monotonic clock.
fn held_clock() -> u64 {
    static EPOCH: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();
    u64::try_from(
        EPOCH
            .get_or_init(tokio::time::Instant::now)
            .elapsed()
            .as_nanos(),
    )
    .unwrap_or(u64::MAX)
}

/// Sends one export request's bytes.
async fn export(
    client: &mut Grpc<Channel>,
    request: tonic::Request<Bytes>,
) -> Result<(), tonic::Status> {
    client
        .ready()
        .await
        .map_err(|e| tonic::Status::unknown(format!("Service was not ready: {e}")))?;
    let _: tonic::Response<ExportTraceServiceResponse> = client
        .unary(
            request,
            PathAndQuery::from_static(otlp::EXPORT_PATH),
            otlp::RawCodec,
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::{
        collector::trace::v1::ExportTraceServiceRequest,
        common::v1::InstrumentationScope,
        trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span::SpanKind, status::StatusCode},
    };

    use super::*;
    use crate::{
        model::Transport,
        telemetry::recorder::{FieldValue, Recorder, SpanFields},
    };

    /// What `batcher` makes of `spans`, decoded.
    fn decoded(
        batcher: &mut Batcher,
        spans: Vec<SpanRecord>,
        export_cpu_ns: u64,
    ) -> ExportTraceServiceRequest {
        let bytes = batcher.encode(&spans, export_cpu_ns, &mut Turns::new());
        ExportTraceServiceRequest::decode(bytes).expect("a request that decodes")
    }

    /// The observer's counters as a request carries them.
    struct Observed {
        spans: u64,
        dropped: u64,
        record_ns: u64,
        export_cpu_ns: u64,
    }

    /// The request of `spans` built as prost structs, as the exporter
    /// built it before writing bytes itself: the reference.
    fn reference(
        resource: &[KeyValue],
        attribute_limit: usize,
        spans: &[SpanRecord],
        observed: &Observed,
    ) -> ExportTraceServiceRequest {
        let int = |n: u64| Value::IntValue(i64::try_from(n).unwrap_or(i64::MAX));
        let mut attributes = resource.to_vec();
        attributes.extend([
            kv("tailmesh.observer.spans", int(observed.spans)),
            kv("tailmesh.observer.dropped", int(observed.dropped)),
            kv("tailmesh.observer.record_ns", int(observed.record_ns)),
            kv(
                "tailmesh.observer.export_cpu_ns",
                int(observed.export_cpu_ns),
            ),
        ]);
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes,
                    ..Resource::default()
                }),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: SCOPE.into(),
                        ..InstrumentationScope::default()
                    }),
                    spans: spans
                        .iter()
                        .map(|r| reference_span(r, attribute_limit))
                        .collect(),
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        }
    }

    fn reference_span(r: &SpanRecord, attribute_limit: usize) -> Span {
        use opentelemetry::trace::SpanKind as K;
        let all: Vec<KeyValue> = r
            .fields
            .attributes()
            .map(|(key, value)| kv(key, reference_value(value)))
            .collect();
        let attributes: Vec<KeyValue> = all.iter().take(attribute_limit).cloned().collect();
        Span {
            trace_id: r.trace_id.to_be_bytes().to_vec(),
            span_id: r.span_id.to_be_bytes().to_vec(),
            parent_span_id: if r.parent_span_id == 0 {
                Vec::new()
            } else {
                r.parent_span_id.to_be_bytes().to_vec()
            },
            flags: otlp::flags(r.parent_remote),
            name: r.name.as_str().to_owned(),
            kind: match r.kind {
                K::Client => SpanKind::Client,
                K::Server => SpanKind::Server,
                K::Producer => SpanKind::Producer,
                K::Consumer => SpanKind::Consumer,
                K::Internal => SpanKind::Internal,
            } as i32,
            start_time_unix_nano: r.start_unix_ns,
            end_time_unix_nano: r.end_unix_ns,
            dropped_attributes_count: u32::try_from(all.len() - attributes.len())
                .unwrap_or(u32::MAX),
            attributes,
            status: Some(Status {
                message: String::new(),
                code: if r.error {
                    StatusCode::Error
                } else {
                    StatusCode::Unset
                } as i32,
            }),
            ..Span::default()
        }
    }

    fn reference_value(v: FieldValue<'_>) -> Value {
        match v {
            FieldValue::Str(s) => Value::StringValue(s.to_owned()),
            FieldValue::Int(i) => Value::IntValue(i),
            FieldValue::Bool(b) => Value::BoolValue(b),
        }
    }

    /// Spans of every shape: roots and children, remote and local
    /// parents, every kind, errors, past spans, unicode names, empty and
    /// long names and values, every field, some and none set.
    fn varied_spans() -> Vec<SpanRecord> {
        use opentelemetry::trace::SpanKind as K;
        let kinds = [K::Server, K::Client, K::Internal, K::Producer, K::Consumer];
        (0..12_u64)
            .map(|i| SpanRecord {
                trace_id: 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210 ^ u128::from(i),
                span_id: 0x8000_0000_0000_0000 | (i + 1),
                parent_span_id: if i % 3 == 0 { 0 } else { i },
                parent_remote: i % 4 == 1,
                kind: kinds[i as usize % kinds.len()].clone(),
                name: match i % 4 {
                    0 => "hop.serve".into(),
                    1 => format!("grüße → 跳 {i} ✓").into(),
                    2 => "".into(),
                    _ => "n".repeat(300).into(),
                },
                // Past spans: times well before now; one at time zero.
                start_unix_ns: if i == 5 {
                    0
                } else {
                    1_600_000_000_000_000_000 + i
                },
                end_unix_ns: if i == 5 {
                    7
                } else {
                    1_600_000_000_000_000_000 + 2 * i
                },
                error: i % 2 == 1,
                fields: match i % 4 {
                    0 => SpanFields {
                        hop: Some("a"),
                        downstream: Some("ünïcode → 跳 ✓"),
                        transport: Some(Transport::Pull),
                        request_id: Some(i),
                        slow: Some(false),
                        queue_wait_ns: Some(0),
                        slot_wait_ns: Some(u64::MAX),
                        service_ns: Some(3),
                        work_ns: Some(2),
                        grpc_code: Some(tonic::Code::DeadlineExceeded),
                    },
                    1 => SpanFields {
                        hop: Some(""),
                        downstream: Some(crate::telemetry::intern(&"v".repeat(200))),
                        slow: Some(true),
                        queue_wait_ns: Some(1 << 40),
                        ..SpanFields::default()
                    },
                    2 => SpanFields {
                        transport: Some(Transport::Push),
                        request_id: Some(u64::from(u32::MAX) + i),
                        grpc_code: Some(tonic::Code::Ok),
                        ..SpanFields::default()
                    },
                    _ => SpanFields::default(),
                },
                cost_ns: 100 + i,
            })
            .collect()
    }

    #[test]
    fn written_bytes_are_what_prost_makes_of_the_reference_request() {
        // Every attribute kept, then some dropped by the limit.
        for limit in [128, 5] {
            bytes_match_the_reference(limit);
        }
    }

    fn bytes_match_the_reference(limit: usize) {
        let resource = resource_from_env(&Process::hop("a", 1, Transport::Pull));
        let counters = Arc::new(Counters::default());
        let mut batcher = Batcher::new(resource.clone(), limit, counters.clone());
        let mut observed = Observed {
            spans: 0,
            dropped: 0,
            record_ns: 0,
            export_cpu_ns: 0,
        };
        // A first batch, then one after drops with grown counters, then
        // an empty one, then a single span.
        let mut batches = vec![varied_spans(), varied_spans(), Vec::new()];
        batches.push(varied_spans().into_iter().take(1).collect());
        for (n, spans) in batches.into_iter().enumerate() {
            if n == 1 {
                counters.dropped.fetch_add(300, Ordering::Relaxed);
                observed.dropped = 300;
            }
            observed.spans = observed.spans + spans.len() as u64 + if n == 1 { 300 } else { 0 };
            observed.record_ns += spans.iter().map(|r| r.cost_ns).sum::<u64>();
            observed.export_cpu_ns = 1 << (7 * n as u64 + 3);
            let expected = reference(&resource, limit, &spans, &observed);
            let bytes = batcher.encode(&spans, observed.export_cpu_ns, &mut Turns::new());
            let got = ExportTraceServiceRequest::decode(bytes.clone()).expect("decodes");
            let (got_spans, expected_spans) = (
                &got.resource_spans[0].scope_spans[0].spans,
                &expected.resource_spans[0].scope_spans[0].spans,
            );
            assert_eq!(
                got_spans.len(),
                expected_spans.len(),
                "limit {limit}, batch {n}"
            );
            for (i, (g, e)) in got_spans.iter().zip(expected_spans).enumerate() {
                assert_eq!(g, e, "limit {limit}, batch {n}, span {i}");
            }
            assert_eq!(got, expected, "limit {limit}, batch {n}");
            assert_eq!(
                &bytes[..],
                &expected.encode_to_vec()[..],
                "limit {limit}, batch {n}"
            );
        }
    }

    fn record(id: u64, cost_ns: u64) -> SpanRecord {
        SpanRecord {
            trace_id: 0x0102,
            span_id: id,
            parent_span_id: if id == 1 { 0 } else { 1 },
            parent_remote: id == 1,
            kind: opentelemetry::trace::SpanKind::Server,
            name: format!("s{id}").into(),
            start_unix_ns: 10,
            end_unix_ns: 20,
            error: id == 2,
            fields: SpanFields {
                downstream: Some("b"),
                request_id: Some(7),
                slow: Some(false),
                ..SpanFields::default()
            },
            cost_ns,
        }
    }

    /// The value of the request's resource attribute `key`, if any.
    fn resource_value<'a>(request: &'a ExportTraceServiceRequest, key: &str) -> Option<&'a Value> {
        request.resource_spans[0]
            .resource
            .as_ref()
            .expect("resource")
            .attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref()?.value.as_ref())
    }

    fn resource_int(request: &ExportTraceServiceRequest, key: &str) -> i64 {
        match resource_value(request, key) {
            Some(Value::IntValue(n)) => *n,
            other => panic!("{key}: {other:?}"),
        }
    }

    fn resource_string(request: &ExportTraceServiceRequest, key: &str) -> String {
        match resource_value(request, key) {
            Some(Value::StringValue(s)) => s.clone(),
            other => panic!("{key}: {other:?}"),
        }
    }

    #[test]
    fn spans_encode_as_the_sdk_exported_them() {
        let counters = Arc::new(Counters::default());
        let mut batcher = Batcher::new(resource_from_env(&Process::default()), 128, counters);
        let request = decoded(&mut batcher, vec![record(1, 0), record(2, 0)], 0);
        let scope = &request.resource_spans[0].scope_spans[0];
        assert_eq!(
            scope.scope.as_ref().map(|s| s.name.as_str()),
            Some("tailmesh")
        );
        let [root, child] = &scope.spans[..] else {
            panic!("two spans: {:?}", scope.spans);
        };
        assert_eq!(root.trace_id, 0x0102_u128.to_be_bytes());
        assert_eq!(root.span_id, 1_u64.to_be_bytes());
        assert!(root.parent_span_id.is_empty());
        assert_eq!(child.parent_span_id, 1_u64.to_be_bytes());
        assert_eq!((root.flags, child.flags), (0x301, 0x101));
        assert_eq!(root.kind, SpanKind::Server as i32);
        assert_eq!(
            (root.start_time_unix_nano, root.end_time_unix_nano),
            (10, 20)
        );
        assert_eq!(root.name, "s1");
        let code = |s: &Span| s.status.as_ref().map(|s| s.code);
        assert_eq!(code(root), Some(StatusCode::Unset as i32));
        assert_eq!(code(child), Some(StatusCode::Error as i32));
        let values: Vec<_> = root
            .attributes
            .iter()
            .map(|kv| (kv.key.as_str(), kv.value.clone().and_then(|v| v.value)))
            .collect();
        assert_eq!(
            values,
            [
                ("downstream", Some(Value::StringValue("b".into()))),
                ("request_id", Some(Value::IntValue(7))),
                ("slow", Some(Value::BoolValue(false))),
            ]
        );
        assert_eq!(resource_string(&request, "service.name"), "tailmesh");
        let instance = resource_string(&request, "service.instance.id");
        assert!(
            instance.starts_with(&format!("{}-", std::process::id())),
            "{instance}"
        );
    }

    #[test]
    fn every_batch_carries_growing_observer_counters() {
        let counters = Arc::new(Counters::default());
        let mut batcher = Batcher::new(
            resource_from_env(&Process::default()),
            128,
            counters.clone(),
        );
        let first = decoded(&mut batcher, vec![record(1, 100), record(2, 50)], 1_000);
        assert_eq!(resource_int(&first, "tailmesh.observer.spans"), 2);
        assert_eq!(resource_int(&first, "tailmesh.observer.dropped"), 0);
        assert_eq!(resource_int(&first, "tailmesh.observer.record_ns"), 150);
        assert_eq!(
            resource_int(&first, "tailmesh.observer.export_cpu_ns"),
            1_000
        );
        counters.dropped.fetch_add(3, Ordering::Relaxed);
        let second = decoded(&mut batcher, vec![record(3, 25)], thread_cpu_ns());
        assert_eq!(resource_int(&second, "tailmesh.observer.spans"), 6);
        assert_eq!(resource_int(&second, "tailmesh.observer.dropped"), 3);
        assert_eq!(resource_int(&second, "tailmesh.observer.record_ns"), 175);
        assert!(resource_int(&second, "tailmesh.observer.export_cpu_ns") > 0);
        assert_eq!(
            resource_string(&first, "service.instance.id"),
            resource_string(&second, "service.instance.id")
        );
    }

    #[test]
    fn a_process_says_what_it_is_once_and_the_broker_only_its_variant() {
        let keys = |resource: &[KeyValue]| -> Vec<String> {
            resource
                .iter()
                .map(|kv| kv.key.clone())
                .filter(|k| PROCESS_KEYS.contains(&k.as_str()))
                .collect()
        };
        let hop = resource_from_env(&Process::hop("a", 0, Transport::Push));
        assert_eq!(keys(&hop), ["hop", "replica", "transport", "variant"]);
        let value = |key: &str| {
            hop.iter()
                .find(|kv| kv.key == key)
                .and_then(|kv| kv.value.as_ref()?.value.clone())
        };
        assert_eq!(value("hop"), Some(Value::StringValue("a".into())));
        assert_eq!(value("replica"), Some(Value::IntValue(0)));
        assert_eq!(value("transport"), Some(Value::StringValue("push".into())));
        let broker = resource_from_env(&Process::default());
        assert_eq!(keys(&broker), ["variant"]);
    }

    #[test]
    fn the_attribute_limit_drops_and_counts() {
        let mut batcher = Batcher::new(Vec::new(), 2, Arc::new(Counters::default()));
        let request = decoded(&mut batcher, vec![record(1, 0)], 0);
        let span = &request.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!(span.attributes.len(), 2);
        assert_eq!(span.dropped_attributes_count, 1);
    }

    #[test]
    fn a_process_asks_every_interval_when_many_spans_wait_else_every_quiet_ask() {
        assert!(ask_due(None, 0), "the first ask at once");
        let just = Some(INTERVAL - Duration::from_millis(1));
        assert!(!ask_due(just, ASK_SPANS * 10));
        assert!(ask_due(Some(INTERVAL), ASK_SPANS));
        assert!(!ask_due(Some(INTERVAL), ASK_SPANS - 1));
        assert!(!ask_due(Some(QUIET_ASK - Duration::from_millis(1)), 0));
        assert!(ask_due(Some(QUIET_ASK), 0));
    }

    #[test]
    fn a_quiet_holding_exporter_sleeps_until_its_next_ask() {
        let ms = Duration::from_millis;
        // Few spans: until the second since the last ask is up.
        assert_eq!(nap_after(Some(ms(100)), 0), QUIET_ASK - ms(100));
        assert!(ask_due(Some(ms(100) + nap_after(Some(ms(100)), 0)), 0));
        // Never less than an interval, nor more than the quiet ask.
        assert_eq!(nap_after(Some(QUIET_ASK - ms(10)), 0), INTERVAL);
        assert_eq!(nap_after(Some(ms(0)), ASK_SPANS - 1), QUIET_ASK);
        // Many spans, or no ask yet: an interval.
        assert_eq!(nap_after(Some(ms(100)), ASK_SPANS), INTERVAL);
        assert_eq!(nap_after(None, 0), INTERVAL);
    }

    #[test]
    fn headers_parse_like_the_otlp_exporter() {
        let map = parse_headers("api-key=a%20b, x=1,bad,=v,k=");
        assert_eq!(
            map.get("api-key").and_then(|v| v.to_str().ok()),
            Some("a b")
        );
        assert_eq!(map.get("x").and_then(|v| v.to_str().ok()), Some("1"));
        assert_eq!(map.len(), 2);
    }

    #[derive(Clone, Default)]
    struct Sink(Arc<std::sync::Mutex<Vec<(MetadataMap, ExportTraceServiceRequest)>>>);

    #[tonic::async_trait]
    impl opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceService for Sink {
        async fn export(
            &self,
            request: tonic::Request<ExportTraceServiceRequest>,
        ) -> Result<
            tonic::Response<
                opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse,
            >,
            tonic::Status,
        > {
            let (metadata, _, request) = request.into_parts();
            self.0.lock().expect("sink").push((metadata, request));
            Ok(tonic::Response::new(Default::default()))
        }
    }

    /// A collector on 127.0.0.1 that keeps what it receives in a [`Sink`],
    /// served on its own runtime (kept alive by the caller) until `stop`
    /// fires; the exporter's configuration for it, with `headers`; and the
    /// collector's result once it stopped serving.
    struct TestCollector {
        runtime: tokio::runtime::Runtime,
        sink: Sink,
        config: ExportConfig,
        stopped: mpsc::Receiver<Result<(), tonic::transport::Error>>,
    }

    impl TestCollector {
        fn start(headers: &str, stop: impl Future<Output = ()> + Send + 'static) -> Self {
            use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceServiceServer;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("runtime");
            let listener = runtime
                .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
                .expect("bind");
            let addr = listener.local_addr().expect("addr");
            let sink = Sink::default();
            let server = tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(sink.clone()))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    stop,
                );
            let (served, stopped) = mpsc::channel();
            runtime.spawn(async move {
                let _ = served.send(server.await);
            });
            let config = ExportConfig {
                endpoint: tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                    .expect("endpoint")
                    .timeout(TIMEOUT),
                headers: parse_headers(headers),
                resource: resource_from_env(&Process::default()),
                attribute_limit: 128,
                hold: None,
            };
            TestCollector {
                runtime,
                sink,
                config,
                stopped,
            }
        }
    }

    #[test]
    fn the_exporter_sends_over_otlp_grpc_and_flushes_on_shutdown() {
        let TestCollector {
            runtime: _runtime,
            sink,
            mut config,
            ..
        } = TestCollector::start("x-test=yes", std::future::pending());
        // A hop replica's exporter: its resource names the replica.
        config.resource = resource_from_env(&Process::hop("b", 2, Transport::Pull));
        let (recorder, spans, counters) = Recorder::new(1.0, 16);
        let exporter = ExportThread::spawn(config, spans, counters).expect("spawn");
        for id in 1..=3 {
            recorder.hand_over(&mut Some(record(id, 10)));
        }
        exporter.shutdown();
        let got = sink.0.lock().expect("sink");
        let sent: usize = got
            .iter()
            .map(|(_, r)| r.resource_spans[0].scope_spans[0].spans.len())
            .sum();
        assert_eq!(sent, 3, "every queued span flushed at shutdown");
        let (metadata, last) = got.last().expect("an export");
        assert_eq!(
            metadata.get("x-test").and_then(|v| v.to_str().ok()),
            Some("yes")
        );
        assert_eq!(resource_int(last, "tailmesh.observer.spans"), 3);
        assert_eq!(resource_int(last, "tailmesh.observer.record_ns"), 30);
        for (_, request) in got.iter() {
            assert_eq!(resource_string(request, "hop"), "b");
            assert_eq!(resource_int(request, "replica"), 2);
            assert_eq!(resource_string(request, "transport"), "pull");
            assert_eq!(
                resource_string(request, "variant"),
                crate::telemetry::variant()
            );
            // The spans carry only their own facts.
            for span in &request.resource_spans[0].scope_spans[0].spans {
                let keys: Vec<&str> = span.attributes.iter().map(|kv| kv.key.as_str()).collect();
                assert_eq!(keys, ["downstream", "request_id", "slow"]);
            }
        }
        assert!(resource_int(last, "tailmesh.observer.export_cpu_ns") > 0);
    }

    #[test]
    fn an_idle_exporter_lets_its_collector_stop_gracefully() {
        const DEADLINE: Duration = Duration::from_secs(30);
        let (stop, stop_fired) = tokio::sync::oneshot::channel::<()>();
        let TestCollector {
            runtime: _runtime,
            sink,
            config,
            stopped,
        } = TestCollector::start("", async {
            let _ = stop_fired.await;
        });
        let (recorder, spans, counters) = Recorder::new(1.0, 16);
        let exporter = ExportThread::spawn(config, spans, counters).expect("spawn");
        recorder.hand_over(&mut Some(record(1, 10)));
        let poll = Duration::from_millis(10);
        let exported = (0..DEADLINE.as_millis() / poll.as_millis()).any(|_| {
            let any = !sink.0.lock().expect("sink").is_empty();
            if !any {
                std::thread::sleep(poll);
            }
            any
        });
        assert!(exported, "no export within {DEADLINE:?}");
        // The exporter is idle now (nothing more queued): a graceful stop
        // completes only if it answers the collector's GOAWAY and ping.
        stop.send(()).expect("the server waits for its stop");
        let served = stopped
            .recv_timeout(DEADLINE)
            .expect("the collector stopped gracefully while the exporter was idle");
        assert!(served.is_ok(), "the collector served: {served:?}");
        exporter.shutdown();
        assert_eq!(sink.0.lock().expect("sink").len(), 1, "one batch exported");
    }
}
