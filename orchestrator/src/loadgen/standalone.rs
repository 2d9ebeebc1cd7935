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

use super::{LoadClock, Part, Target, Tracing, generate};
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

impl Counted {
    fn new() -> Self {
        Counted {
            sent: 0,
            // Bounded, so that slow answers are counted at their value:
            // a histogram that grows on demand would clamp them instead
            // (`saturating_record` does not grow it).
            #[allow(clippy::expect_used)]
            latency_us: hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3)
                .expect("constant, valid histogram bounds"),
        }
    }
}

impl RecordSink for Counted {
    fn record(&mut self, r: RequestRecord) {
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
    /// histogram of 3 significant digits, 1 us to an hour).
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
        generators: 1,
        entries: Vec::new(),
        net: None,
        generator_net: Vec::new(),
        streams: None,
    };
    // Never interrupted: a Ctrl-C ends the process.
    let (_keep, stop) = watch::channel(0);
    let mut counted = Counted::new();
    let outcome = generate(
        Target::push(pool, ClientPolicy::default()),
        &spec,
        LoadClock::start(spec.warmup),
        1,
        Sleeper::Precise,
        None,
        stop,
        Tracing::default(),
        Part::WHOLE,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn answered_after(id: u64, latency: Duration) -> RequestRecord {
        RequestRecord {
            id,
            intended: Duration::ZERO,
            start: Duration::ZERO,
            end: latency,
            outcome: Outcome::Ok,
            path: Vec::new(),
            extra_attempts: 0,
            attempts: Vec::new(),
            stream: None,
        }
    }

    #[test]
    fn slow_answers_are_counted_at_their_latency() {
        let mut counted = Counted::new();
        for id in 0..10 {
            counted.record(answered_after(id, Duration::from_millis(50)));
        }
        assert_eq!(counted.sent, 10);
        let p50 = counted.latency_us.value_at_quantile(0.5);
        assert!((49_900..=50_100).contains(&p50), "p50 {p50} us");
    }
}
