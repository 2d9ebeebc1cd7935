//! The load generator against one replica that is already running,
//! outside any scenario: what `tailmesh load` runs (hidden; the benchmark
//! of the generator against h2load, `bench/generator.sh`, drives it). The
//! requests go through the very code a run's closed loop uses.

use std::time::Duration;

use tailmesh_services::{
    addr::PeerAddr,
    hop::{Connections, PushPool, client::PoolError, policy::ClientPolicy},
    link::LinkCounts,
    timer::Sleeper,
};
use tokio::sync::watch;

use super::{Target, generate};
use crate::{
    record::{Outcome, RecordSink, RequestRecord},
    scenario::{ConnectionMode, Load, LoadMode, Stop},
};

/// What to send: a closed loop of `concurrency` requests in flight.
#[derive(Clone, Debug)]
pub struct Standalone {
    /// Requests in flight.
    pub concurrency: u32,
    /// Measured requests.
    pub requests: u64,
    /// HTTP/2 connections the requests share.
    pub connections: u32,
    /// Unmeasured time first.
    pub warmup: Duration,
    /// Each request's deadline.
    pub timeout: Duration,
    /// Payload bytes per request.
    pub payload: usize,
}

/// Counts requests as they complete, keeping no sample.
struct Counted {
    sent: u64,
    /// Ok answers' latency, µs.
    latency_us: hdrhistogram::Histogram<u64>,
}

impl RecordSink for Counted {
    fn record(&mut self, r: &RequestRecord) {
        self.sent += 1;
        if r.outcome == Outcome::Ok {
            let us = u64::try_from(r.latency().as_micros()).unwrap_or(u64::MAX);
            self.latency_us.saturating_record(us);
        }
    }
}

/// What it measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StandaloneReport {
    /// Measured requests sent.
    pub sent: u64,
    /// Of those, answered ok.
    pub ok: u64,
    /// Of those, anything else.
    pub failed: u64,
    /// Answered ok per second of the measured phase.
    pub ok_per_s: f64,
    /// Latency percentiles of the ok answers, in microseconds (from a
    /// histogram of 3 significant digits).
    pub p50_us: u64,
    /// See `p50_us`.
    pub p99_us: u64,
    /// What happened to the generator's connections.
    pub links: Option<LinkCounts>,
}

/// Drives `load` against the hop replica at `addr` (push).
pub async fn against(addr: &PeerAddr, load: &Standalone) -> Result<StandaloneReport, PoolError> {
    let pool = PushPool::new(
        "target",
        std::slice::from_ref(addr),
        tailmesh_services::model::Balance::RoundRobin,
        Connections::Shared(load.connections.max(1) as usize),
        1,
        "loadgen",
    )?;
    let spec = Load {
        mode: LoadMode::Closed {
            concurrency: load.concurrency.max(1),
        },
        stop: Stop::Requests(load.requests),
        warmup: load.warmup,
        timeout: load.timeout,
        connection: ConnectionMode::Shared {
            connections: load.connections.max(1),
        },
        payload_bytes: load.payload,
    };
    // Never interrupted: a Ctrl-C ends the process.
    let (_keep, stop) = watch::channel(0);
    let mut counted = Counted {
        sent: 0,
        latency_us: hdrhistogram::Histogram::new(3)
            .expect("3 significant digits is a valid histogram"),
    };
    let outcome = generate(
        Target::push(pool, ClientPolicy::default()),
        &spec,
        1,
        Sleeper::Precise,
        None,
        stop,
        None,
        &mut counted,
    )
    .await;
    let (sent, ok) = (counted.sent, counted.latency_us.len());
    let micros = |p: f64| {
        if ok == 0 {
            0
        } else {
            counted.latency_us.value_at_quantile(p / 100.0)
        }
    };
    let seconds = outcome.measured.as_secs_f64();
    Ok(StandaloneReport {
        sent,
        ok,
        failed: sent - ok,
        ok_per_s: if seconds > 0.0 {
            ok as f64 / seconds
        } else {
            0.0
        },
        p50_us: micros(50.0),
        p99_us: micros(99.0),
        links: outcome.links,
    })
}
