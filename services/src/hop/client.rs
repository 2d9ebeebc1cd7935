//! Reaching the replicas of a push hop: one HTTP/2 connection per replica
//! (or several, or a new connection per call) and a balancing policy; the
//! call itself is the `unary` module's, over h2.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use tailmesh_proto::pb::{CallReply, CallRequest, PoolEvents};
use tonic::Status;

use super::{
    draw::keyed_rng,
    error::CallError,
    events::{Count, EndpointLog},
    unary::Link,
};
use crate::{
    addr::PeerAddr,
    link::{LinkCounts, LinkEvents},
    model::{Balance, EndpointOptions},
};

/// How long a connection to a replica may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How a caller holds its connections to a hop's replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connections {
    /// `n` long-lived HTTP/2 connections per replica, used in turn.
    Shared(usize),
    /// A new connection for every call, closed after it.
    PerRequest,
}

struct Replica {
    addr: PeerAddr,
    links: Vec<Link>,
    next_channel: AtomicUsize,
    in_flight: AtomicUsize,
}

/// The replicas of one push hop and how to pick among them.
pub struct PushPool {
    hop: String,
    balance: Balance,
    connections: Connections,
    replicas: Vec<Replica>,
    next: AtomicUsize,
    rng: Mutex<ChaCha8Rng>,
    events: Arc<LinkEvents>,
    log: EndpointLog,
    endpoints: EndpointOptions,
}

/// Errors building a pool.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The hop has no replica addresses.
    #[error("hop \"{0}\" has no replicas to call")]
    NoReplicas(String),
    /// An address could not be turned into an endpoint.
    #[error("hop \"{hop}\" replica {replica} ({addr}): {source}")]
    Endpoint {
        hop: String,
        /// The replica index.
        replica: usize,
        /// Its address.
        addr: PeerAddr,
        /// Why it is not a URI.
        source: tonic::codegen::http::uri::InvalidUri,
    },
}

impl PushPool {
    /// A pool over `addrs` (replica `i` at `addrs[i]`). Channels connect
    /// lazily, so a replica that is down fails its calls, not the pool.
    /// `seed` and `caller` key the random choices of `random` and `p2c`.
    pub fn new<A: Into<PeerAddr> + Clone>(
        hop: &str,
        addrs: &[A],
        balance: Balance,
        connections: Connections,
        seed: u64,
        caller: &str,
    ) -> Result<Self, PoolError> {
        if addrs.is_empty() {
            return Err(PoolError::NoReplicas(hop.to_string()));
        }
        let events = Arc::<LinkEvents>::default();
        let mut replicas = Vec::with_capacity(addrs.len());
        for (i, addr) in addrs.iter().enumerate() {
            let addr: PeerAddr = addr.clone().into();
            let link = || {
                Link::new(addr.clone(), CONNECT_TIMEOUT, &events, crate::tls::client()).map_err(
                    |source| PoolError::Endpoint {
                        hop: hop.to_string(),
                        replica: i,
                        addr: addr.clone(),
                        source,
                    },
                )
            };
            // Per request: one link checks the address now; each call
            // opens its own.
            let links = match connections {
                Connections::Shared(n) => (0..n.max(1)).map(|_| link()).collect(),
                Connections::PerRequest => link().map(|_| Vec::new()),
            }?;
            replicas.push(Replica {
                addr,
                links,
                next_channel: AtomicUsize::new(0),
                in_flight: AtomicUsize::new(0),
            });
        }
        Ok(PushPool {
            hop: hop.to_string(),
            balance,
            connections,
            replicas,
            next: AtomicUsize::new(0),
            rng: Mutex::new(keyed_rng(seed, &format!("balance:{caller}->{hop}"), 0, 0)),
            events,
            log: EndpointLog::new(addrs.len()),
            endpoints: EndpointOptions::default(),
        })
    }

    /// What happened to this pool's connections so far.
    pub fn link_counts(&self) -> LinkCounts {
        self.events.counts()
    }

    /// The pool with `endpoints` (health, keepalive, ewma, ejection)
    /// instead of the defaults.
    pub fn with_endpoints(mut self, endpoints: EndpointOptions) -> Self {
        self.endpoints = endpoints;
        self
    }

    /// What this pool did with the hop's replicas so far.
    pub fn endpoint_events(&self) -> PoolEvents {
        self.log.snapshot(&self.hop)
    }

    /// The hop this pool calls.
    pub fn hop(&self) -> &str {
        &self.hop
    }

    /// Requests in flight per replica, for tests and statistics.
    pub fn in_flight(&self) -> Vec<usize> {
        self.replicas
            .iter()
            .map(|r| r.in_flight.load(Ordering::Relaxed))
            .collect()
    }

    /// Picks a replica per the balancing policy.
    pub fn pick(&self) -> usize {
        let n = self.replicas.len();
        if n == 1 {
            return 0;
        }
        match self.balance {
            Balance::RoundRobin => self.next.fetch_add(1, Ordering::Relaxed) % n,
            Balance::Random => self.with_rng(|rng| rng.random_range(0..n)),
            Balance::P2c | Balance::Ewma => {
                let (a, b) = self.with_rng(|rng| {
                    let a = rng.random_range(0..n);
                    let b = (a + rng.random_range(1..n)) % n;
                    (a, b)
                });
                let load = |i: usize| self.replicas[i].in_flight.load(Ordering::Relaxed);
                if load(b) < load(a) { b } else { a }
            }
        }
    }

    fn with_rng<T>(&self, f: impl FnOnce(&mut ChaCha8Rng) -> T) -> T {
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut rng)
    }

    /// Calls one replica picked by the policy. `timeout` becomes the
    /// request's `grpc-timeout`; the wait here ends a little after it, so
    /// the replica's own DEADLINE_EXCEEDED usually ends the call. Errors
    /// name the hop, the replica and its address.
    pub async fn call(
        &self,
        request: CallRequest,
        timeout: Option<Duration>,
    ) -> Result<CallReply, Status> {
        let index = self.pick();
        self.call_replica(index, request, timeout).await
    }

    /// Calls replica `index` directly.
    pub async fn call_replica(
        &self,
        index: usize,
        request: CallRequest,
        timeout: Option<Duration>,
    ) -> Result<CallReply, Status> {
        let index = index % self.replicas.len();
        let replica = &self.replicas[index];
        self.log.count(index, Count::Pick);
        replica.in_flight.fetch_add(1, Ordering::Relaxed);
        let _done = InFlight(&replica.in_flight);
        let traceparent = crate::telemetry::traceparent_header();
        let call = async {
            match self.connections {
                Connections::Shared(_) => {
                    let i = replica.next_channel.fetch_add(1, Ordering::Relaxed);
                    replica.links[i % replica.links.len()]
                        .call(&request, timeout, traceparent)
                        .await
                }
                Connections::PerRequest => {
                    // Its connection closes when the link drops.
                    let link = Link::new(
                        replica.addr.clone(),
                        CONNECT_TIMEOUT,
                        &self.events,
                        crate::tls::client(),
                    )
                    .map_err(|e| Status::internal(e.to_string()))?;
                    link.call(&request, timeout, traceparent).await
                }
            }
        };
        let result = match timeout {
            Some(t) => crate::deadline::within(t, call, || "no answer".to_owned()).await,
            None => call.await,
        };
        result.map_err(|status| {
            CallError::Replica {
                hop: self.hop.clone(),
                replica: index,
                addr: replica.addr.clone(),
                status,
            }
            .into()
        })
    }
}

struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A shareable pool.
pub type SharedPool = Arc<PushPool>;

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;

    fn addrs(n: u16) -> Vec<SocketAddr> {
        (0..n)
            .map(|i| SocketAddr::from(([127, 0, 0, 1], 40000 + i)))
            .collect()
    }

    #[tokio::test]
    async fn round_robin_visits_each_replica_in_turn() {
        let pool = PushPool::new(
            "b",
            &addrs(3),
            Balance::RoundRobin,
            Connections::Shared(1),
            1,
            "a",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let picks: Vec<usize> = (0..6).map(|_| pool.pick()).collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
    }

    #[tokio::test]
    async fn random_is_seeded_and_covers_all_replicas() {
        let make = |seed| {
            PushPool::new(
                "b",
                &addrs(4),
                Balance::Random,
                Connections::Shared(1),
                seed,
                "a",
            )
            .unwrap_or_else(|e| panic!("{e}"))
        };
        let a: Vec<usize> = {
            let p = make(3);
            (0..200).map(|_| p.pick()).collect()
        };
        let b: Vec<usize> = {
            let p = make(3);
            (0..200).map(|_| p.pick()).collect()
        };
        let c: Vec<usize> = {
            let p = make(4);
            (0..200).map(|_| p.pick()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
        for r in 0..4 {
            assert!(a.contains(&r), "replica {r} never picked");
        }
    }

    #[tokio::test]
    async fn p2c_avoids_the_busier_replica() {
        let pool = PushPool::new("b", &addrs(2), Balance::P2c, Connections::Shared(1), 1, "a")
            .unwrap_or_else(|e| panic!("{e}"));
        pool.replicas[0].in_flight.store(5, Ordering::Relaxed);
        assert!((0..100).all(|_| pool.pick() == 1));
    }

    #[test]
    fn an_empty_pool_is_an_error() {
        let err =
            PushPool::new::<SocketAddr>("b", &[], Balance::P2c, Connections::Shared(1), 1, "a")
                .err();
        assert!(matches!(err, Some(PoolError::NoReplicas(h)) if h == "b"));
    }
}
