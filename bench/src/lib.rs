//! What the benchmark binaries share: one closed loop that measures, and
//! one way to start the broker servers they compare against.
//!
//! - [`closed_loop`]: `requests` calls with a fixed number in flight, each
//!   latency recorded in an HdrHistogram (a [`Sample`]).
//! - [`start_server`]: nats-server or rabbitmq-server as a child process on
//!   127.0.0.1, started, waited for and stopped exactly as a run's broker
//!   server is (`tailmesh::launcher::brokers`), its output in its own log.
//!
//! - [`h2lean`]: a lean unary-gRPC HTTP/2 client written against the
//!   wire, the `h2lean` binary's closed loop.
//! - [`rounds`]: a ratio measured over rounds as a median with a
//!   bootstrap 95 % interval, goals judged on the interval, and the CPU
//!   steal and load average during the rounds (the `intervals` binary).
//!
//! The binaries: `broker_vs_nats` (request/reply through tailmesh's broker
//! and through core NATS), `pull_backends` (each pull backend through
//! the producer and worker code pull hops use) and `h2lean` (the lean
//! client against one hop, beside h2load and `tailmesh load` in
//! `bench/generator.sh`) and `intervals` (the table that bench/floor.sh,
//! generator.sh, tracing.sh and sidecar.sh end with).

use std::{
    future::Future,
    net::Ipv4Addr,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use hdrhistogram::Histogram;
use tailmesh::launcher::brokers::{BrokerProcessError, BrokerServer, ServerSpec};
use tailmesh_services::model::BrokerKind;

pub mod h2lean;
pub mod rounds;

/// Latencies above a minute are recorded as a minute.
pub const HIST_MAX_NS: u64 = 60_000_000_000;

/// An empty latency histogram in nanoseconds, 1 ns to [`HIST_MAX_NS`],
/// three significant digits.
pub fn histogram() -> Histogram<u64> {
    // Constant bounds that `new_with_bounds` accepts (low >= 1, high >=
    // 2 * low, sigfig <= 5): it cannot fail.
    Histogram::new_with_bounds(1, HIST_MAX_NS, 3).unwrap_or_else(|e| panic!("{e}"))
}

/// Why one call of a closed loop failed.
pub type CallError = Box<dyn std::error::Error + Send + Sync>;

/// One request of a closed loop: send it, wait for its answer, check it.
/// Each request in flight gets its own clone.
pub trait Call: Clone + Send + 'static {
    /// Makes one request.
    fn call(&mut self) -> impl Future<Output = Result<(), CallError>> + Send;
}

/// Why a closed loop did not finish.
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    /// A request failed.
    #[error("a request failed")]
    Call(#[source] CallError),
    /// The loop took longer than it was given.
    #[error("a measurement took longer than {0:?}")]
    TooLong(Duration),
    /// A task that kept one request in flight panicked or was cancelled.
    #[error("a requester task ended abnormally")]
    Task(#[from] tokio::task::JoinError),
}

/// What one closed loop measured.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Every request's latency, in ns.
    pub hist: Histogram<u64>,
    /// From the first request sent to the last answer.
    pub elapsed: Duration,
}

impl Sample {
    /// Requests answered per second.
    pub fn throughput(&self) -> f64 {
        self.hist.len() as f64 / self.elapsed.as_secs_f64()
    }
}

/// Makes `requests` calls with `inflight` of them outstanding at all times
/// (each of `inflight` tasks sends its next request when its last one is
/// answered), on the current runtime; fails on the first failed call, or
/// when the whole loop takes longer than `limit`.
pub async fn closed_loop<C: Call>(
    caller: &C,
    inflight: usize,
    requests: u64,
    limit: Duration,
) -> Result<Sample, LoopError> {
    let sent = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..inflight {
        let mut caller = caller.clone();
        let sent = Arc::clone(&sent);
        tasks.spawn(async move {
            let mut hist = histogram();
            while sent.fetch_add(1, Ordering::Relaxed) < requests {
                let t = Instant::now();
                caller.call().await.map_err(LoopError::Call)?;
                let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
                hist.saturating_record(ns.clamp(1, HIST_MAX_NS));
            }
            Ok::<_, LoopError>(hist)
        });
    }
    let mut hist = histogram();
    let joined = tokio::time::timeout(limit, async {
        while let Some(task) = tasks.join_next().await {
            // Both histograms have the same bounds: adding cannot fail.
            let _ = hist.add(task??);
        }
        Ok::<_, LoopError>(())
    })
    .await;
    joined.map_err(|_| LoopError::TooLong(limit))??;
    Ok(Sample {
        hist,
        elapsed: started.elapsed(),
    })
}

/// Starts the `kind` server (nats-server or rabbitmq-server; `program`
/// instead of the one on `PATH` when given) on 127.0.0.1 and waits until
/// it takes connections. Its output goes to a log in its own temporary
/// directory, quoted by the error if it does not get ready. Stop it with
/// [`BrokerServer::stop`]; dropping it kills it.
pub async fn start_server(
    kind: BrokerKind,
    program: Option<&Path>,
) -> Result<BrokerServer, BrokerProcessError> {
    let spec = ServerSpec::new(kind, Ipv4Addr::LOCALHOST.into());
    let spec = match program {
        Some(program) => spec.program(program),
        None => spec,
    };
    let server = BrokerServer::start(spec).await?;
    eprintln!(
        "{} (pid {}) listening on {}",
        kind.as_str(),
        server.pid().unwrap_or_default(),
        server.addr
    );
    Ok(server)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// Counts its calls, and the most that were in flight at once.
    #[derive(Clone, Default)]
    struct Counting {
        calls: Arc<AtomicU64>,
        now: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
        fail_at: Option<u64>,
    }

    impl Call for Counting {
        async fn call(&mut self) -> Result<(), CallError> {
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            tokio::task::yield_now().await;
            self.now.fetch_sub(1, Ordering::SeqCst);
            if Some(n) == self.fail_at {
                return Err("refused".into());
            }
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_closed_loop_makes_every_request_with_the_given_number_in_flight() {
        let caller = Counting::default();
        let sample = closed_loop(&caller, 4, 103, Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(sample.hist.len(), 103);
        assert_eq!(caller.calls.load(Ordering::SeqCst), 103);
        assert_eq!(caller.most.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn a_failed_request_ends_the_loop_with_its_cause() {
        let caller = Counting {
            fail_at: Some(10),
            ..Counting::default()
        };
        match closed_loop(&caller, 2, 100, Duration::from_secs(60)).await {
            Err(LoopError::Call(cause)) => assert_eq!(cause.to_string(), "refused"),
            other => panic!("expected the call's error, got {other:?}"),
        }
    }
}
