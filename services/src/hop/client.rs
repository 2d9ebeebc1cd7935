//! Reaching the replicas of a push hop: one HTTP/2 connection per replica
//! (or several, or a new connection per call), endpoint health, and a
//! balancing policy (the `balance` module); the call itself is the `unary`
//! module's, over h2.
//!
//! Endpoint health is gRPC's subchannel state, per replica: a connect that
//! fails, a connection that ends or a keepalive timeout puts the replica in
//! TRANSIENT_FAILURE (one event, with the reason), out of the pick list. A
//! probe task then tries a connection of its own, at once if a connection
//! ended and after the backoff's first wait if a connect failed, then
//! after each wait of the backoff, until one opens and the replica answers
//! a PING on it (a black hole completes the handshake too): READY, back in
//! the pick list, backoff reset. The probe's throwaway connections are not the
//! pool's (they are not in its `LinkCounts`): the calls reconnect lazily as
//! they always did. With every replica in TRANSIENT_FAILURE a call is not
//! failed before it is tried: it goes to the replica whose next probe is
//! soonest and tries to connect itself (so a lone replica that came back is
//! found by the next call, not only by the probe); if that fails, so does
//! the call, with UNAVAILABLE naming the hop, the replica and its address.

use std::{
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use tailmesh_proto::pb::{CallReply, CallRequest, EndpointEventKind, PoolEvents};
use tokio::{task::AbortHandle, time::Instant};
use tonic::Status;

// `PoolError` is named here, where a pool is built, as it always was.
pub use super::error::PoolError;
use super::{
    balance::{Balancer, Outcome},
    draw::keyed_rng,
    error::CallError,
    events::{Count, EndpointLog},
    unary::{Keepalive, Link, LinkError, LinkState, Watch},
};
use crate::{
    addr::PeerAddr,
    link::{LinkCounts, LinkEvents},
    model::{Backoff, Balance, EndpointOptions},
};

/// How long a connection to a replica may take to open (a reconnect
/// probe's too: shorter than gRPC's 20 s min_connect_timeout, which is
/// meant for the open internet, not a test bed).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The shortest wait between a probe's attempts and between keepalive
/// PINGs, whatever the options say: nothing spins.
const MIN_WAIT: Duration = Duration::from_millis(10);

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
}

/// The replicas of one push hop and how to pick among them. Dropping it
/// ends every task it started (connections, reconnect probes).
pub struct PushPool {
    shared: Arc<Shared>,
}

/// The pool's state, shared with its reconnect probes and the watches of
/// its links (which hold it weakly).
struct Shared {
    hop: String,
    caller: String,
    seed: u64,
    balance: Balance,
    connections: Connections,
    replicas: Vec<Replica>,
    balancer: Balancer,
    events: Arc<LinkEvents>,
    log: EndpointLog,
    endpoints: EndpointOptions,
    /// The jitter of the reconnect backoff.
    backoff_rng: Mutex<ChaCha8Rng>,
    /// Each replica's reconnect probe, if one runs.
    probes: Vec<Mutex<Option<AbortHandle>>>,
    me: Weak<Shared>,
}

impl PushPool {
    /// A pool over `addrs` (replica `i` at `addrs[i]`) with the default
    /// [`EndpointOptions`]. Channels connect lazily, so a replica that is
    /// down fails its calls, not the pool. `seed` and `caller` key the
    /// random choices of `random`, `p2c` and `ewma` and the backoff's
    /// jitter.
    pub fn new<A: Into<PeerAddr> + Clone>(
        hop: &str,
        addrs: &[A],
        balance: Balance,
        connections: Connections,
        seed: u64,
        caller: &str,
    ) -> Result<Self, PoolError> {
        let addrs: Vec<PeerAddr> = addrs.iter().map(|a| a.clone().into()).collect();
        Self::build(
            hop,
            &addrs,
            balance,
            connections,
            seed,
            caller,
            EndpointOptions::default(),
        )
    }

    fn build(
        hop: &str,
        addrs: &[PeerAddr],
        balance: Balance,
        connections: Connections,
        seed: u64,
        caller: &str,
        endpoints: EndpointOptions,
    ) -> Result<Self, PoolError> {
        if addrs.is_empty() {
            return Err(PoolError::NoReplicas(hop.to_string()));
        }
        let events = Arc::<LinkEvents>::default();
        let mut replicas = Vec::with_capacity(addrs.len());
        for (i, addr) in addrs.iter().enumerate() {
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
                addr: addr.clone(),
                links,
                next_channel: AtomicUsize::new(0),
            });
        }
        let keepalive = endpoints.keepalive.map(|every| Keepalive {
            every: every.max(MIN_WAIT),
            timeout: endpoints.keepalive_timeout,
        });
        let shared = Arc::new_cyclic(|me: &Weak<Shared>| {
            for (i, replica) in replicas.iter_mut().enumerate() {
                replica.links = std::mem::take(&mut replica.links)
                    .into_iter()
                    .map(|link| link.watched(Some(watch(me, i)), keepalive))
                    .collect();
            }
            Shared {
                hop: hop.to_string(),
                caller: caller.to_string(),
                seed,
                balance,
                connections,
                balancer: Balancer::new(
                    balance,
                    replicas.len(),
                    keyed_rng(seed, &format!("balance:{caller}->{hop}"), 0, 0),
                    endpoints.ewma,
                    endpoints.ejection,
                ),
                probes: (0..replicas.len()).map(|_| Mutex::new(None)).collect(),
                log: EndpointLog::new(replicas.len()),
                replicas,
                events,
                backoff_rng: Mutex::new(keyed_rng(seed, &format!("backoff:{caller}->{hop}"), 0, 0)),
                endpoints,
                me: me.clone(),
            }
        });
        Ok(PushPool { shared })
    }

    /// What happened to this pool's connections so far.
    pub fn link_counts(&self) -> LinkCounts {
        self.shared.events.counts()
    }

    /// The pool with `endpoints` (health, keepalive, ewma, ejection)
    /// instead of the defaults; built again, before any call.
    pub fn with_endpoints(self, endpoints: EndpointOptions) -> Self {
        let s = &self.shared;
        let addrs: Vec<PeerAddr> = s.replicas.iter().map(|r| r.addr.clone()).collect();
        match Self::build(
            &s.hop,
            &addrs,
            s.balance,
            s.connections,
            s.seed,
            &s.caller,
            endpoints,
        ) {
            Ok(pool) => pool,
            // The same addresses built this pool a moment ago.
            Err(_) => self,
        }
    }

    /// What this pool did with the hop's replicas so far.
    pub fn endpoint_events(&self) -> PoolEvents {
        self.shared.log.snapshot(&self.shared.hop)
    }

    /// The hop this pool calls.
    pub fn hop(&self) -> &str {
        &self.shared.hop
    }

    /// Requests in flight per replica, for tests and statistics.
    pub fn in_flight(&self) -> Vec<usize> {
        (0..self.shared.replicas.len())
            .map(|i| self.shared.balancer.in_flight(i).load(Ordering::Relaxed))
            .collect()
    }

    /// Picks a replica per the balancing policy, among those in the pick
    /// list if any is (see the module's docs).
    pub fn pick(&self) -> usize {
        self.shared.balancer.pick(Instant::now(), &self.shared.log)
    }

    /// Calls one replica picked by the policy. `timeout` becomes the
    /// request's `grpc-timeout`; the wait here ends a little after it, so
    /// the replica's own DEADLINE_EXCEEDED usually ends the call. A call
    /// whose connection fails before the request left goes to another
    /// replica in the pick list (endpoint health only), within the same
    /// deadline. Errors name the hop, the replica and its address.
    pub async fn call(
        &self,
        request: CallRequest,
        timeout: Option<Duration>,
    ) -> Result<CallReply, Status> {
        let s = &*self.shared;
        let started = Instant::now();
        let mut index = s.balancer.pick(started, &s.log);
        let mut tries = 1;
        loop {
            let left = timeout.map(|t| t.saturating_sub(started.elapsed()));
            match s.attempt(index, &request, left).await {
                Err(Failure::Unsent(status)) => {
                    let next = (s.endpoints.health && tries < s.replicas.len())
                        .then(|| s.balancer.pick_other(Instant::now(), &s.log, index))
                        .flatten();
                    match next {
                        Some(next) => {
                            s.log.count(index, Count::Redirected);
                            index = next;
                            tries += 1;
                        }
                        None => return Err(s.named(index, status)),
                    }
                }
                Err(Failure::Sent(status)) => return Err(s.named(index, status)),
                Ok(reply) => return Ok(reply),
            }
        }
    }

    /// Calls replica `index` directly (no redirection).
    pub async fn call_replica(
        &self,
        index: usize,
        request: CallRequest,
        timeout: Option<Duration>,
    ) -> Result<CallReply, Status> {
        let s = &*self.shared;
        let index = index % s.replicas.len();
        s.attempt(index, &request, timeout)
            .await
            .map_err(|(Failure::Unsent(status) | Failure::Sent(status))| s.named(index, status))
    }
}

impl super::stream::OpenStream for PushPool {
    fn hop(&self) -> &str {
        PushPool::hop(self)
    }

    /// A stream to a replica picked as a call's would be, on its shared
    /// connection (or one of its own, closed with the stream). The pick
    /// is counted; the stream's messages are not observed one by one by
    /// the balancer.
    fn open<'a>(
        &'a self,
        opening: &'a super::stream::Opening,
    ) -> futures::future::BoxFuture<'a, Result<super::stream::MessageStream, Status>> {
        use super::stream::{Kind, Opening};
        Box::pin(async move {
            let s = &*self.shared;
            let index = s.balancer.pick(Instant::now(), &s.log);
            s.log.count(index, Count::Pick);
            let replica = &s.replicas[index];
            let opened = match s.connections {
                Connections::Shared(_) => {
                    let i = replica.next_channel.fetch_add(1, Ordering::Relaxed);
                    let link = &replica.links[i % replica.links.len()];
                    link.open_stream(opening)
                        .await
                        .map(|(answer, send)| (answer, send, Arc::clone(link.events()), None))
                }
                Connections::PerRequest => {
                    let link = Link::new(
                        replica.addr.clone(),
                        CONNECT_TIMEOUT,
                        &s.events,
                        crate::tls::client(),
                    )
                    .map_err(|e| Status::internal(e.to_string()))?
                    .watched(Some(watch(&s.me, index)), None);
                    let (answer, send) = link.open_stream(opening).await?;
                    let events = Arc::clone(link.events());
                    Ok((
                        answer,
                        send,
                        events,
                        Some(Box::new(link) as Box<dyn Send + Sync>),
                    ))
                }
            };
            let (answer, mut send, events, own) =
                opened.map_err(|status| s.named(index, status))?;
            let kind = match opening {
                // A server stream's one request, then the request side ends.
                Opening::Server(request) => {
                    let body = super::unary::encode(request)?;
                    send.send_data(body, true).map_err(|e| {
                        s.named(index, Status::unavailable(format!("send the request: {e}")))
                    })?;
                    Kind::Server
                }
                Opening::Bidi => Kind::Bidi,
                Opening::Client => Kind::Client,
            };
            Ok(super::stream::MessageStream::new(
                kind,
                Arc::from(s.hop.as_str()),
                index,
                answer,
                send,
                events,
                own,
            ))
        })
    }
}

impl Drop for PushPool {
    fn drop(&mut self) {
        for probe in &self.shared.probes {
            if let Some(task) = probe.lock().unwrap_or_else(|e| e.into_inner()).take() {
                task.abort();
            }
        }
    }
}

/// How an attempt failed.
enum Failure {
    /// Its connection failed before the request left.
    Unsent(Status),
    /// After, or its deadline passed.
    Sent(Status),
}

/// The watch of replica `i`'s links: their states go to the pool's health,
/// if the pool is still there.
fn watch(pool: &Weak<Shared>, i: usize) -> Watch {
    let pool = pool.clone();
    Arc::new(move |state: LinkState<'_>| {
        if let Some(pool) = pool.upgrade() {
            pool.report(i, state);
        }
    })
}

impl Shared {
    /// One attempt on replica `index`, counted, observed, and bounded by
    /// `timeout`.
    async fn attempt(
        &self,
        index: usize,
        request: &CallRequest,
        timeout: Option<Duration>,
    ) -> Result<CallReply, Failure> {
        let replica = &self.replicas[index];
        self.log.count(index, Count::Pick);
        let in_flight = self.balancer.in_flight(index);
        in_flight.fetch_add(1, Ordering::Relaxed);
        let _done = InFlight(in_flight);
        let sent = self.balancer.observes().then(Instant::now);
        let trace = crate::telemetry::current_wire();
        // Ok(Err(_)): nothing was sent; Err(_): the call's failure.
        let call = async {
            let result = match self.connections {
                Connections::Shared(_) => {
                    let i = replica.next_channel.fetch_add(1, Ordering::Relaxed);
                    replica.links[i % replica.links.len()]
                        .call(request, timeout, trace)
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
                    .map_err(|e| Status::internal(e.to_string()))?
                    .watched(Some(watch(&self.me, index)), None);
                    link.call(request, timeout, trace).await
                }
            };
            match result {
                Ok(reply) => Ok(Ok(reply)),
                Err(LinkError::Unsent(status)) => Ok(Err(status)),
                Err(LinkError::Failed(status)) => Err(status),
            }
        };
        let result = match timeout {
            Some(t) => crate::deadline::within(t, call, || "no answer".to_owned()).await,
            None => call.await,
        };
        if let Some(sent) = sent {
            let now = Instant::now();
            let outcome = match &result {
                Ok(Ok(_)) => Outcome::Fine,
                Ok(Err(_)) => Outcome::Error,
                Err(status) => Outcome::of(status.code()),
            };
            self.balancer
                .observe(index, now - sent, outcome, now, &self.log);
        }
        match result {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(status)) => Err(Failure::Unsent(status)),
            Err(status) => Err(Failure::Sent(status)),
        }
    }

    /// `status` as the caller reads it: naming the hop, the replica and
    /// its address.
    fn named(&self, index: usize, status: Status) -> Status {
        CallError::Replica {
            hop: self.hop.clone(),
            replica: index,
            addr: self.replicas[index].addr.clone(),
            status,
        }
        .into()
    }

    /// A link of replica `i` says what became of its connection.
    fn report(&self, i: usize, state: LinkState<'_>) {
        match state {
            LinkState::Connected => {
                if self.balancer.set_down(i, false) {
                    self.log.event(i, EndpointEventKind::Ready, "connected");
                }
            }
            LinkState::ConnectFailed(status) => {
                self.log.count(i, Count::FailedConnect);
                self.fail(i, || status.message().to_string(), false);
            }
            LinkState::Ended(reason) => self.fail(i, || reason, true),
            LinkState::KeepaliveTimeout => {
                self.log.count(i, Count::KeepaliveTimeout);
                self.fail(i, || "keepalive timeout".to_string(), true);
            }
        }
    }

    /// Replica `i` into TRANSIENT_FAILURE (endpoint health only), its
    /// probe started: trying `at_once` or after the first wait.
    fn fail(&self, i: usize, reason: impl FnOnce() -> String, at_once: bool) {
        if !self.endpoints.health || !self.balancer.set_down(i, true) {
            return;
        }
        self.log
            .event(i, EndpointEventKind::TransientFailure, reason());
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let task = runtime.spawn(probe(self.me.clone(), i, at_once));
        let previous = self.probes[i]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(task.abort_handle());
        if let Some(previous) = previous {
            previous.abort();
        }
    }

    /// The `attempt`-th wait of the backoff (from 0), jittered.
    fn backoff_wait(&self, attempt: u32) -> Duration {
        let mut rng = self.backoff_rng.lock().unwrap_or_else(|e| e.into_inner());
        backoff_wait(&self.endpoints.backoff, attempt, &mut rng).max(MIN_WAIT)
    }
}

/// gRPC's connection backoff: `min(initial * multiplier^attempt, max)`,
/// times a uniform draw in [1 - jitter, 1 + jitter].
fn backoff_wait(backoff: &Backoff, attempt: u32, rng: &mut ChaCha8Rng) -> Duration {
    let exponent = i32::try_from(attempt).unwrap_or(i32::MAX);
    let max = backoff.max.as_secs_f64();
    let base = (backoff.initial.as_secs_f64() * backoff.multiplier.powi(exponent)).min(max);
    let jitter = backoff.jitter.clamp(0.0, 1.0);
    let spread = if jitter > 0.0 {
        rng.random_range(-jitter..=jitter)
    } else {
        0.0
    };
    Duration::try_from_secs_f64(base * (1.0 + spread)).unwrap_or(backoff.max)
}

/// Replica `i`'s reconnect probe: until a connection opens and the
/// replica answers a PING on it (READY), or the replica left
/// TRANSIENT_FAILURE otherwise (a call's own connection), tries a
/// throwaway connection after each wait of the backoff. Holds the pool
/// weakly, and is aborted with it.
async fn probe(pool: Weak<Shared>, i: usize, at_once: bool) {
    let mut attempt = 0;
    let mut wait = !at_once;
    loop {
        if wait {
            let Some(wait) = pool.upgrade().map(|s| {
                let wait = s.backoff_wait(attempt);
                s.balancer.set_retry_at(i, Instant::now() + wait);
                wait
            }) else {
                return;
            };
            attempt = attempt.saturating_add(1);
            tokio::time::sleep(wait).await;
        }
        wait = true;
        let Some(s) = pool.upgrade() else {
            return;
        };
        if !s.balancer.is_down(i) {
            return;
        }
        // Its own counts: the pool's are the calls'.
        let Ok(link) = Link::new(
            s.replicas[i].addr.clone(),
            CONNECT_TIMEOUT,
            &Arc::default(),
            crate::tls::client(),
        ) else {
            return;
        };
        drop(s);
        let checked = link.connect_checked(CONNECT_TIMEOUT).await;
        drop(link);
        let Some(s) = pool.upgrade() else {
            return;
        };
        match checked {
            Ok(()) => {
                s.report(i, LinkState::Connected);
                return;
            }
            Err(status) => s.report(i, LinkState::ConnectFailed(&status)),
        }
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
        pool.shared
            .balancer
            .in_flight(0)
            .store(5, Ordering::Relaxed);
        assert!((0..100).all(|_| pool.pick() == 1));
    }

    #[test]
    fn backoff_waits_grow_by_the_multiplier_within_the_jitter_up_to_the_max() {
        use rand::SeedableRng;
        let backoff = Backoff::default();
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut distinct = std::collections::BTreeSet::new();
        for attempt in 0..20u32 {
            let wait = backoff_wait(&backoff, attempt, &mut rng).as_secs_f64();
            let base = (1.6f64.powi(attempt as i32)).min(120.0);
            assert!(
                wait >= base * 0.8 - 1e-9 && wait <= base * 1.2 + 1e-9,
                "attempt {attempt}: {wait} s, base {base} s"
            );
            distinct.insert(wait.to_bits());
        }
        assert_eq!(distinct.len(), 20, "the jitter draws differ");
        let exact = Backoff {
            jitter: 0.0,
            ..backoff
        };
        let waits: Vec<Duration> = [0, 1, 2, 40]
            .into_iter()
            .map(|n| backoff_wait(&exact, n, &mut rng))
            .collect();
        assert_eq!(
            waits,
            vec![
                Duration::from_secs(1),
                Duration::from_millis(1600),
                Duration::from_millis(2560),
                Duration::from_secs(120),
            ]
        );
    }

    #[test]
    fn an_empty_pool_is_an_error() {
        let err =
            PushPool::new::<SocketAddr>("b", &[], Balance::P2c, Connections::Shared(1), 1, "a")
                .err();
        assert!(matches!(err, Some(PoolError::NoReplicas(h)) if h == "b"));
    }
}
