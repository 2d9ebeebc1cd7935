//! The serving-thread span path alone, with no mesh around it: per
//! request, what a hop's serving thread does for its trace, done as the hop
//! does it, on one current-thread runtime. The caller's context is read
//! from gRPC metadata, the server span starts at the request's arrival and
//! is scoped around the rest, and a client span under it is scoped around
//! a call whose `traceparent` it writes. Both end and are handed to the
//! recorder.
//!
//! `--traced` installs the process's recorder as a traced hop has it; its
//! queue is emptied on another thread, as the exporter does. Without it
//! every step is the no-op it is in an untraced hop. Prints nanoseconds
//! per request. bench/span-path.sh runs both in turn over rounds and gives
//! the difference with an interval: changes to the span path too small for
//! a whole mesh's noise show here.

use std::{
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use clap::Parser;
use opentelemetry::trace::SpanKind;
use tailmesh_services::telemetry::{
    self, SpanFields, TraceSpan,
    recorder::{Recorder, Spans},
};
use tonic::metadata::{MetadataMap, MetadataValue};

/// The span path of one hop, per request.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Record spans, as a traced hop does (default: untraced).
    #[arg(long)]
    traced: bool,
    /// Requests to time.
    #[arg(long, default_value_t = 1_000_000)]
    requests: u64,
}

/// How often the queue is emptied: often enough that it never fills here.
const DRAIN_EVERY: Duration = Duration::from_millis(1);

fn main() -> ExitCode {
    match run(&Args::parse()) {
        Ok(ns) => {
            println!("{ns:.1}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("span_path: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<f64> {
    if args.traced {
        let (recorder, mut spans, _counters) = Recorder::new(1.0, telemetry::MAX_QUEUE);
        anyhow::ensure!(recorder.install(), "a recorder was already installed");
        std::thread::Builder::new()
            .name("drain".into())
            .spawn(move || drain(&mut spans))
            .context("start the draining thread")?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .context("build the runtime")?;
    let mut metadata = MetadataMap::new();
    metadata.insert(
        "traceparent",
        MetadataValue::from_static("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    );
    let hop = telemetry::intern("b");
    let call = telemetry::intern("b -> c");
    let downstream = telemetry::intern("c");
    // A warm-up of a tenth, then the timed requests.
    runtime.block_on(async {
        for id in 0..args.requests / 10 {
            request(&metadata, id, hop, call, downstream).await;
        }
        let began = Instant::now();
        for id in 0..args.requests {
            request(&metadata, id, hop, call, downstream).await;
        }
        Ok(began.elapsed().as_nanos() as f64 / args.requests.max(1) as f64)
    })
}

/// One request's span work: the server span around a call's client span.
async fn request(
    metadata: &MetadataMap,
    id: u64,
    hop: &'static str,
    call: &'static str,
    downstream: &'static str,
) {
    let arrived = tailmesh_units::unix_nanos();
    let parent = telemetry::extract_metadata(metadata);
    let mut server = TraceSpan::start_at(
        SpanKind::Server,
        Some(arrived),
        || parent,
        || {
            (
                hop.into(),
                SpanFields {
                    request_id: Some(id),
                    ..SpanFields::default()
                },
            )
        },
    );
    server
        .scope(async {
            let mut client = TraceSpan::start(SpanKind::Client, telemetry::current, || {
                (
                    call.into(),
                    SpanFields {
                        downstream: Some(downstream),
                        request_id: Some(id),
                        ..SpanFields::default()
                    },
                )
            });
            client
                .scope(async {
                    std::hint::black_box(telemetry::traceparent_header());
                })
                .await;
            client.end();
        })
        .await;
    server.end_after(tailmesh_units::unix_nanos().saturating_sub(arrived));
}

/// Takes the recorder's spans until the process ends.
fn drain(spans: &mut Spans) {
    let mut taken = Vec::new();
    loop {
        spans.take(&mut taken);
        std::hint::black_box(taken.len());
        taken.clear();
        std::thread::sleep(DRAIN_EVERY);
    }
}
