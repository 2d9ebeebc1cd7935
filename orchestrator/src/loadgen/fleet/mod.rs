//! Several load generator processes sharing one variant's load
//! (`[load] generators = N`), coordinated by the orchestrator:
//!
//! - it starts them (`tailmesh generator`), each connecting back over TCP;
//! - gives each its part of the load: open loop, every N-th request of
//!   the one seeded schedule, each keeping the id and intended send time it
//!   has in a one-generator run (so the same seed injects the same faults);
//!   closed loop, a share of the requests in flight with disjoint ids;
//! - measures each one's clock offset against its own (the probe with the
//!   shortest round trip of 16) and starts them all at one instant
//!   250 ms ahead; the skew of the origins they set is reported;
//! - takes their records as they end, moves them onto its own clock, and
//!   hands them to the one record pipeline: every histogram, file, phase
//!   and check is made once, centrally, from every request;
//! - a generator that closes its connection or says nothing for
//!   1 s before it is done stops the run: the others stop sending,
//!   the incident names it, its requests not reported (in flight, or
//!   ended and waiting for its next beat) are counted as lost with it, and
//!   the run ends incomplete (exit status 1).
//!
//! - `frame`: the messages and their framing.
//! - `member`: the generator process's side.
//! - `picks`: a scheduled kill's question about their entry pools.

pub(crate) mod frame;
pub mod member;
mod picks;

pub(crate) use self::picks::PicksAsker;

use std::{
    path::Path,
    process::Stdio,
    sync::Arc,
    time::{Duration, SystemTime},
};

use tokio::{
    io::BufReader,
    net::{TcpListener, tcp::OwnedWriteHalf},
    process::{Child, Command},
    sync::{mpsc, watch},
    time::Instant,
};

use self::frame::{ClientSpan, FromGenerator, GeneratorOutcome, Job, ToGenerator, unix_ns_now};
use super::{LoadClock, LoadOutcome, Part, Progress, STOP_SENDING, StreamTally, selfwatch};
use crate::{
    record::{GeneratorReport, PipelineStats, RecordSink, RequestRecord},
    traces::loadgen::LoadTracer,
};

/// How long the generators have to start and say hello.
const HELLO_PATIENCE: Duration = Duration::from_secs(20);
/// How long one connection has to say hello: one that says nothing (not a
/// generator) holds up the others no longer.
const HELLO_WAIT: Duration = Duration::from_secs(5);
/// How long they have to reach their entries.
const READY_PATIENCE: Duration = Duration::from_secs(30);
/// Clock probes per generator.
const PROBES: u32 = 16;
/// How far ahead of now the common start is set: time for the start
/// message to reach every generator.
pub(crate) const START_LEAD: Duration = Duration::from_millis(250);
/// Silence after which a generator is taken for gone.
pub(crate) const SILENCE: Duration = Duration::from_secs(1);

/// A warning when several generators the run starts on its own machine
/// and the mesh's processes are more than its CPUs: each generator spins
/// before its sends (at real-time priority where allowed), on cores the
/// mesh needs.
pub(crate) fn shared_cores_warning(
    generators: u32,
    mesh_processes: usize,
    cpus: usize,
) -> Option<String> {
    let n = usize::try_from(generators).unwrap_or(usize::MAX);
    (n > 1 && n.saturating_add(mesh_processes) > cpus).then(|| {
        format!(
            "{n} load generators and the mesh's {mesh_processes} process(es) share this \
             machine's {cpus} CPU(s): each generator spins before its sends, on cores the mesh \
             needs (on 2 CPUs, 3 generators measured p50 6 to 7 % above one; see \
             docs/performance.md, \"Several load generators\"); generators on machines of \
             their own (--generators-at) measure the mesh alone"
        )
    })
}

/// Why the generators could not be started.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("listen for the load generators: {0}")]
    Listen(std::io::Error),
    #[error("start load generator {index} ({}): {source}", program.display())]
    Spawn {
        index: u32,
        program: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("load generator log {}: {source}", path.display())]
    Log {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("load generator {index}: {what} (its output: {output})")]
    Generator {
        index: u32,
        what: String,
        output: String,
    },
    #[error("{connected} of {of} load generators connected within {} ({where_})",
        tailmesh_units::duration(*patience))]
    Hello {
        connected: usize,
        of: u32,
        patience: Duration,
        /// Where to look: their logs, or the address they were awaited at.
        where_: String,
    },
    #[error("a load generator at {peer} showed no token or the wrong one; it was refused")]
    Token { peer: std::net::SocketAddr },
}

struct Member {
    index: u32,
    pid: u32,
    writer: OwnedWriteHalf,
    reader: Option<BufReader<tokio::net::tcp::OwnedReadHalf>>,
    /// Where its output is: its log file, or the process at an address.
    output: String,
    /// Its clock minus ours, ns.
    offset_ns: i64,
    rtt_ns: u64,
}

/// The generator processes of one variant, connected.
pub(crate) struct Fleet {
    members: Vec<Member>,
    children: Vec<Child>,
    /// What a kill asks them while the load runs.
    asks: picks::Asks,
}

/// Where a run awaits generators that stay (`tailmesh generator --stay`,
/// started by a deployment, or by hand on other machines) instead of
/// starting its own: one listener for the whole run, each variant taking
/// the generators it needs from it.
#[derive(Debug)]
pub struct Hub {
    listener: std::net::TcpListener,
    token: Option<String>,
    patience: Duration,
}

impl Hub {
    /// Listens at `addr`; a generator must show `token` when there is
    /// one, and each variant waits `patience` for its generators.
    pub fn bind(
        addr: &str,
        token: Option<String>,
        patience: Duration,
    ) -> Result<Hub, std::io::Error> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        Ok(Hub {
            listener,
            token,
            patience,
        })
    }

    /// The address it listens at.
    pub fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }

    fn listener(&self) -> Result<TcpListener, FleetError> {
        let listener = self.listener.try_clone().map_err(FleetError::Listen)?;
        TcpListener::from_std(listener).map_err(FleetError::Listen)
    }

    /// Tells the `expected` generators waiting for a next variant that
    /// the run is over, so they exit; those that do not connect within
    /// `grace` find no one and give up by themselves.
    pub async fn dismiss(&self, expected: u32, grace: Duration) {
        let Ok(listener) = self.listener() else {
            return;
        };
        let deadline = Instant::now() + grace;
        let mut dismissed = 0;
        while dismissed < expected
            && let Ok(Ok((stream, _))) = tokio::time::timeout_at(deadline, listener.accept()).await
        {
            let (reader, mut writer) = stream.into_split();
            let mut reader = BufReader::new(reader);
            if let Ok(Ok(FromGenerator::Hello { token, .. })) =
                tokio::time::timeout_at(deadline, frame::read(&mut reader)).await
                && token == self.token
            {
                let _ = frame::write(&mut writer, &ToGenerator::Bye).await;
                dismissed += 1;
            }
        }
    }
}

/// Where the generators a run starts itself run.
#[derive(Clone, Debug)]
pub(crate) enum Places {
    /// Beside the orchestrator, reaching it on loopback.
    Loopback,
    /// Each in a network namespace of its own (the netns launcher's, by
    /// index), reaching the orchestrator at `host`, its address on the
    /// namespaces' network.
    Namespaces {
        host: std::net::IpAddr,
        namespaces: Vec<String>,
        ip: std::path::PathBuf,
    },
}

impl Fleet {
    /// Starts `of` generator processes of `exe` in their `places`, their
    /// output in `log_dir`, and waits for each to connect.
    pub(crate) async fn launch(
        exe: &Path,
        of: u32,
        places: &Places,
        log_dir: &Path,
    ) -> Result<Fleet, FleetError> {
        let listen = match places {
            Places::Loopback => std::net::IpAddr::from([127, 0, 0, 1]),
            Places::Namespaces { host, .. } => *host,
        };
        let listener = TcpListener::bind((listen, 0))
            .await
            .map_err(FleetError::Listen)?;
        let hub = listener.local_addr().map_err(FleetError::Listen)?;
        let mut children = Vec::with_capacity(of as usize);
        let mut logs = Vec::with_capacity(of as usize);
        for index in 0..of {
            let log = log_dir.join(format!("generator-{index}.log"));
            let file = std::fs::File::create(&log).map_err(|source| FleetError::Log {
                path: log.clone(),
                source,
            })?;
            let err = file.try_clone().map_err(|source| FleetError::Log {
                path: log.clone(),
                source,
            })?;
            // In a namespace: `ip netns exec` joins it and execs the
            // generator, so the child is the generator itself.
            let mut command = match places {
                Places::Loopback => Command::new(exe),
                Places::Namespaces { namespaces, ip, .. } => {
                    let Some(ns) = namespaces.get(index as usize) else {
                        return Err(FleetError::Spawn {
                            index,
                            program: exe.to_path_buf(),
                            source: std::io::Error::other("no network namespace for it"),
                        });
                    };
                    let mut c = Command::new(ip);
                    c.args(["netns", "exec", ns]).arg(exe);
                    c
                }
            };
            let child = command
                .arg("generator")
                .arg("--hub")
                .arg(hub.to_string())
                .arg("--index")
                .arg(index.to_string())
                .stdin(Stdio::null())
                // It reaches us on a private address and shows no token
                // (a deployment's, in the environment, is not its).
                .env_remove(crate::deploy::TOKEN_FILE_ENV)
                .stdout(file)
                .stderr(err)
                .process_group(0)
                .kill_on_drop(true)
                .spawn()
                .map_err(|source| FleetError::Spawn {
                    index,
                    program: exe.to_path_buf(),
                    source,
                })?;
            if let Some(pid) = child.id() {
                let pid_file = log_dir.join(format!("generator-{index}.pid"));
                std::fs::write(&pid_file, format!("{pid}\n")).map_err(|source| {
                    FleetError::Log {
                        path: pid_file,
                        source,
                    }
                })?;
            }
            children.push(child);
            logs.push(log);
        }
        let mut fleet = Fleet {
            members: Vec::new(),
            children,
            asks: picks::Asks::none(),
        };
        let look = format!("their logs are in {}", log_dir.display());
        fleet.members = accept_members(&listener, of, None, HELLO_PATIENCE, &look, |index, _| {
            logs.get(index as usize).map(|l| l.display().to_string())
        })
        .await?;
        Ok(fleet)
    }

    /// Takes `of` generators that stay from `hub` (those of other indexes
    /// are told to skip this variant).
    pub(crate) async fn attach(hub: &Hub, of: u32) -> Result<Fleet, FleetError> {
        let listener = hub.listener()?;
        let look = match hub.local_addr() {
            Ok(addr) => format!("awaited at {addr}"),
            Err(e) => format!("awaited at an address unknown: {e}"),
        };
        let members = accept_members(
            &listener,
            of,
            hub.token.as_deref(),
            hub.patience,
            &look,
            |index, peer| (index < of).then(|| format!("generator {index}'s own, at {peer}")),
        )
        .await?;
        Ok(Fleet {
            members,
            children: Vec::new(),
            asks: picks::Asks::none(),
        })
    }

    /// What asks the generators about their entry pools' picks while the
    /// load runs ([`Fleet::generate`] answers).
    pub(crate) fn picks_asker(&mut self) -> PicksAsker {
        let (asker, asks) = PicksAsker::new();
        self.asks = asks;
        asker
    }

    /// Hands each generator its job (`job(part)`), waits until each has
    /// reached its entries, and measures its clock.
    pub(crate) async fn assign(&mut self, job: impl Fn(Part) -> Job) -> Result<(), FleetError> {
        let of = u32::try_from(self.members.len()).unwrap_or(u32::MAX);
        for m in &mut self.members {
            let message = ToGenerator::Job(Box::new(job(Part { index: m.index, of })));
            frame::write(&mut m.writer, &message)
                .await
                .map_err(|e| m.failed(format!("send its job: {e}")))?;
        }
        let deadline = Instant::now() + READY_PATIENCE;
        for m in &mut self.members {
            let failed = m.failure();
            let reader = m
                .reader
                .as_mut()
                .ok_or_else(|| failed("no connection".into()))?;
            match tokio::time::timeout_at(deadline, frame::read(reader)).await {
                Ok(Ok(FromGenerator::Ready)) => {}
                Ok(Ok(FromGenerator::Failed { error })) => return Err(failed(error)),
                Ok(Ok(other)) => return Err(failed(format!("unexpected {other:?}"))),
                Ok(Err(e)) => return Err(failed(format!("its connection: {e}"))),
                Err(_) => {
                    return Err(failed(format!(
                        "not ready within {}",
                        tailmesh_units::duration(READY_PATIENCE)
                    )));
                }
            }
            m.probe_clock().await?;
        }
        Ok(())
    }

    /// Starts every generator at one instant and hands each measured
    /// request to `sink` (on the orchestrator's clock, which `clock`
    /// becomes) as it ends; `tracer` records each traced request's span.
    pub(crate) async fn generate<S: RecordSink + ?Sized>(
        mut self,
        clock: LoadClock,
        mut progress: Option<Progress>,
        mut interrupt: watch::Receiver<u32>,
        tracer: Option<Arc<LoadTracer>>,
        sink: &mut S,
    ) -> LoadOutcome {
        // The origin on the wall clock (it is ahead: START_LEAD).
        let start_unix_ns =
            unix_ns_now() + nanos(clock.origin.saturating_duration_since(Instant::now()));
        let measuring_from =
            SystemTime::UNIX_EPOCH + Duration::from_nanos(start_unix_ns) + clock.warmup;
        sink.measuring_from(measuring_from);
        let watch = selfwatch::Watch::start();
        let (tx, mut rx) = mpsc::channel::<(usize, Result<FromGenerator, frame::FrameError>)>(1024);
        let mut states: Vec<State> = Vec::with_capacity(self.members.len());
        for (k, m) in self.members.iter_mut().enumerate() {
            let at = start_unix_ns.saturating_add_signed(m.offset_ns);
            let started = frame::write(&mut m.writer, &ToGenerator::Start { at_unix_ns: at }).await;
            let mut state = State::new(m);
            if let Err(e) = started {
                state.gone = Some(format!("could not be started: {e}"));
            }
            if let Some(mut reader) = m.reader.take() {
                let tx = tx.clone();
                tokio::spawn(async move {
                    loop {
                        let message = frame::read(&mut reader).await;
                        let end = message.is_err();
                        if tx.send((k, message)).await.is_err() || end {
                            return;
                        }
                    }
                });
            }
            states.push(state);
        }
        drop(tx);
        let mut sent_interrupts = 0u32;
        let mut interrupts_open = true;
        let mut stopped = false;
        let mut check = tokio::time::interval(SILENCE / 4);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while states.iter().any(State::running) {
            tokio::select! {
                got = rx.recv() => {
                    let Some((k, message)) = got else { break };
                    let state = &mut states[k];
                    state.heard = Instant::now();
                    match message {
                        Ok(FromGenerator::Records { records }) => {
                            for mut r in records {
                                state.shift(&mut r);
                                state.records += 1;
                                if let Some(p) = &mut progress {
                                    p.record(&r);
                                }
                                sink.record(r);
                            }
                        }
                        Ok(FromGenerator::Spans { spans }) => {
                            if let Some(t) = &tracer {
                                for s in spans {
                                    state.trace(t, s);
                                }
                            }
                        }
                        Ok(FromGenerator::Beat { sent, ended: _ }) => state.sent = sent,
                        Ok(FromGenerator::Picks { seq, picks }) => {
                            self.asks.answered(seq, k, state.index, picks);
                        }
                        Ok(FromGenerator::Started { origin_unix_ns }) => {
                            let ours = i128::from(origin_unix_ns) - i128::from(state.offset_ns);
                            state.skew_ns = Some(ours - i128::from(start_unix_ns));
                        }
                        Ok(FromGenerator::Done(mut outcome)) => {
                            if let Some(t) = &tracer {
                                // Counted there when it forwarded no span.
                                t.add_traced(outcome.traced);
                            }
                            for pool in &mut outcome.endpoints {
                                state.shift_events(pool);
                            }
                            state.done = Some(*outcome);
                        }
                        Ok(FromGenerator::Failed { error }) => state.gone = Some(error),
                        Ok(other) => {
                            state.gone = Some(format!("said {other:?} while its load ran"));
                        }
                        Err(e) => {
                            state.gone = Some(format!("its connection ended: {e}"));
                        }
                    }
                }
                _ = check.tick() => {
                    // Traced requests' spans wait in a batch: hand them on.
                    if let Some(t) = &tracer {
                        t.flush();
                    }
                    let now = Instant::now();
                    for s in states.iter_mut().filter(|s| s.running()) {
                        if now.duration_since(s.heard) >= SILENCE {
                            s.gone = Some(format!(
                                "said nothing for {}",
                                tailmesh_units::duration(now.duration_since(s.heard))
                            ));
                        }
                    }
                }
                changed = interrupt.changed(), if interrupts_open => {
                    // Closed: the interrupt counter is gone with the run.
                    interrupts_open = changed.is_ok();
                }
                ask = self.asks.next() => {
                    let seq = self.asks.next_seq();
                    let question = ToGenerator::Picks {
                        seq,
                        hop: ask.hop.clone(),
                        replica: ask.replica,
                    };
                    let mut waiting = Vec::new();
                    for (k, (m, s)) in self.members.iter_mut().zip(&states).enumerate() {
                        // One that cannot be written to is gone: its reader says so.
                        if s.running() && frame::write(&mut m.writer, &question).await.is_ok() {
                            waiting.push(k);
                        }
                    }
                    self.asks.sent(seq, ask, waiting);
                }
            }
            self.asks.settle(&states);
            let sent = states.iter().map(|s| s.sent).sum();
            sink.sent(sent);
            if let Some(p) = &mut progress {
                p.tick(
                    sent,
                    Instant::now().saturating_duration_since(clock.origin + clock.warmup),
                );
            }
            // A generator gone before it was done stops the run: the
            // others stop sending and finish what they have in flight.
            let mut wanted = *interrupt.borrow();
            for s in states.iter_mut().filter(|s| s.gone.is_some() && !s.told) {
                s.told = true;
                let lost = s.sent.saturating_sub(s.records);
                let line = format!(
                    "load generator {} (pid {}) stopped before its part was done: {}; {} of its \
                     requests, sent and not reported, were lost with it (its output: {})",
                    s.index,
                    s.pid,
                    s.gone.as_deref().unwrap_or_default(),
                    lost,
                    s.output
                );
                crate::tell!("warning: {line}");
                stopped = true;
                wanted = wanted.max(STOP_SENDING);
            }
            if wanted > sent_interrupts {
                sent_interrupts = wanted;
                for (m, s) in self.members.iter_mut().zip(&states) {
                    if s.running() {
                        let _ =
                            frame::write(&mut m.writer, &ToGenerator::Stop { interrupts: wanted })
                                .await;
                    }
                }
            }
        }
        // A question still open is answered by those done.
        self.asks.settle(&states);
        if let Some(t) = &tracer {
            t.flush();
        }
        if let Some(p) = &progress {
            p.finish();
        }
        // Done: their connections close, and they exit.
        drop(self.members);
        for child in &mut self.children {
            if tokio::time::timeout(Duration::from_secs(5), child.wait())
                .await
                .is_err()
            {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
        }
        let mut load = combine(&states, stopped, watch.finish());
        load.start_skew_us = skew_spread_us(&states);
        load.start_skew_bound_us = skew_bound_us(&states);
        load.generators = states.iter().map(State::report).collect();
        load
    }
}

/// Accepts generators on `listener` until `of` distinct indexes said
/// hello, within `patience` (else the error says where to `look`).
/// `output(index, peer)` says where a generator's output is, or `None` for
/// an index not wanted (told to skip). A generator must show `token`
/// (none for the processes the run starts itself).
async fn accept_members(
    listener: &TcpListener,
    of: u32,
    token: Option<&str>,
    patience: Duration,
    look: &str,
    output: impl Fn(u32, std::net::SocketAddr) -> Option<String>,
) -> Result<Vec<Member>, FleetError> {
    let mut members: Vec<Member> = Vec::with_capacity(of as usize);
    let deadline = Instant::now() + patience;
    while members.len() < of as usize {
        let accepted = tokio::time::timeout_at(deadline, listener.accept()).await;
        let Ok(Ok((stream, peer))) = accepted else {
            return Err(FleetError::Hello {
                connected: members.len(),
                of,
                patience,
                where_: look.to_owned(),
            });
        };
        let _ = stream.set_nodelay(true);
        let (reader, mut writer) = stream.into_split();
        let mut reader = BufReader::new(reader);
        let hello_by = deadline.min(Instant::now() + HELLO_WAIT);
        let hello = tokio::time::timeout_at(hello_by, frame::read(&mut reader)).await;
        let Ok(Ok(FromGenerator::Hello {
            index,
            pid,
            token: shown,
        })) = hello
        else {
            continue;
        };
        if shown.as_deref() != token {
            crate::tell!("warning: {}", FleetError::Token { peer });
            continue;
        }
        let Some(output) = output(index, peer) else {
            let _ = frame::write(&mut writer, &ToGenerator::Skip).await;
            continue;
        };
        if members.iter().any(|m| m.index == index) {
            let _ = frame::write(&mut writer, &ToGenerator::Skip).await;
            continue;
        }
        members.push(Member {
            index,
            pid,
            writer,
            reader: Some(reader),
            output,
            offset_ns: 0,
            rtt_ns: 0,
        });
    }
    members.sort_by_key(|m| m.index);
    Ok(members)
}

impl Member {
    fn failed(&self, what: impl Into<String>) -> FleetError {
        self.failure()(what.into())
    }

    /// What makes its errors, borrowing nothing of it.
    fn failure(&self) -> impl Fn(String) -> FleetError + use<> {
        let (index, output) = (self.index, self.output.clone());
        move |what| FleetError::Generator {
            index,
            what,
            output: output.clone(),
        }
    }

    /// Measures its clock: the probe with the shortest round trip, whose
    /// answer came about half way through it.
    async fn probe_clock(&mut self) -> Result<(), FleetError> {
        let mut best: Option<(u64, i64)> = None;
        let failed = self.failure();
        for seq in 0..PROBES {
            let sent = unix_ns_now();
            let t0 = Instant::now();
            frame::write(&mut self.writer, &ToGenerator::Ping { seq })
                .await
                .map_err(|e| failed(format!("clock probe: {e}")))?;
            let reader = self
                .reader
                .as_mut()
                .ok_or_else(|| failed("no connection".into()))?;
            let answer = tokio::time::timeout(SILENCE, frame::read(reader)).await;
            let rtt = nanos(t0.elapsed());
            let theirs = match answer {
                Ok(Ok(FromGenerator::Pong { seq: s, unix_ns })) if s == seq => unix_ns,
                Ok(Ok(other)) => return Err(failed(format!("unexpected {other:?}"))),
                Ok(Err(e)) => return Err(failed(format!("clock probe: {e}"))),
                Err(_) => return Err(failed("no answer to a clock probe within 1 s".into())),
            };
            let offset = offset_ns(sent, rtt, theirs);
            if best.is_none_or(|(r, _)| rtt < r) {
                best = Some((rtt, offset));
            }
        }
        if let Some((rtt, offset)) = best {
            self.rtt_ns = rtt;
            self.offset_ns = offset;
        }
        Ok(())
    }
}

/// A generator's clock minus ours, from one probe sent at `sent` (our
/// clock) and answered `rtt` later with `theirs`: the answer is taken as
/// given half way.
fn offset_ns(sent: u64, rtt: u64, theirs: u64) -> i64 {
    let mid = i128::from(sent) + i128::from(rtt / 2);
    i64::try_from(i128::from(theirs) - mid).unwrap_or(i64::MAX)
}

/// One generator while the load runs.
struct State {
    index: u32,
    pid: u32,
    output: String,
    offset_ns: i64,
    rtt_ns: u64,
    /// Its origin minus the common start, on our clock.
    skew_ns: Option<i128>,
    heard: Instant,
    /// Measured requests it said it sent, and those it handed on.
    sent: u64,
    records: u64,
    done: Option<GeneratorOutcome>,
    gone: Option<String>,
    /// Whether its going was reported.
    told: bool,
}

impl State {
    fn new(m: &Member) -> Self {
        State::of(m.index, m.pid, m.output.clone(), m.offset_ns, m.rtt_ns)
    }

    fn of(index: u32, pid: u32, output: String, offset_ns: i64, rtt_ns: u64) -> Self {
        State {
            index,
            pid,
            output,
            offset_ns,
            rtt_ns,
            skew_ns: None,
            heard: Instant::now(),
            sent: 0,
            records: 0,
            done: None,
            gone: None,
            told: false,
        }
    }

    fn running(&self) -> bool {
        self.done.is_none() && self.gone.is_none()
    }

    /// Moves a record from its measured clock onto ours: its times are
    /// from its own origin, which was `skew` from the common one.
    fn shift(&self, r: &mut RequestRecord) {
        let skew = self.skew_ns.unwrap_or(0);
        let by = Duration::from_nanos(u64::try_from(skew.unsigned_abs()).unwrap_or(u64::MAX));
        for t in [&mut r.intended, &mut r.start, &mut r.end] {
            *t = if skew >= 0 {
                t.saturating_add(by)
            } else {
                t.saturating_sub(by)
            };
        }
    }

    /// Moves its pool's events from its measured clock onto ours, as
    /// [`State::shift`] does its records.
    fn shift_events(&self, pool: &mut crate::analysis::CallerEndpoints) {
        let skew_s = self.skew_ns.unwrap_or(0) as f64 / 1e9;
        for e in &mut pool.events {
            e.at_s += skew_s;
        }
    }

    /// Records the client span of a traced request it sent, its end moved
    /// onto our clock.
    fn trace(&self, tracer: &LoadTracer, s: ClientSpan) {
        let ended = i128::from(s.ended_unix_ns) - i128::from(self.offset_ns);
        let ended = SystemTime::UNIX_EPOCH
            + Duration::from_nanos(u64::try_from(ended.max(0)).unwrap_or(u64::MAX));
        tracer.record(tracer.request(s.id), s.id, || {
            crate::traces::loadgen::Ended {
                stream: s.stream,
                ..crate::traces::loadgen::Ended::new(ended, s.latency, s.error.as_deref())
            }
        });
    }

    fn report(&self) -> GeneratorReport {
        GeneratorReport {
            index: self.index,
            pid: self.pid,
            clock_offset_us: self.offset_ns as f64 / 1e3,
            clock_probe_rtt_us: self.rtt_ns as f64 / 1e3,
            start_skew_us: self.skew_ns.map_or(0.0, |s| s as f64 / 1e3),
            records: self.records,
            warmup: self.done.as_ref().map(|d| d.warmup).unwrap_or_default(),
            lost_in_flight: if self.done.is_some() {
                0
            } else {
                self.sent.saturating_sub(self.records)
            },
            stopped: if self.done.is_some() {
                None
            } else {
                self.gone.clone()
            },
            instrument: self.done.as_ref().and_then(|d| d.instrument.clone()),
        }
    }
}

/// The spread of the generators' origins, µs.
fn skew_spread_us(states: &[State]) -> f64 {
    let skews: Vec<i128> = states.iter().filter_map(|s| s.skew_ns).collect();
    match (skews.iter().min(), skews.iter().max()) {
        (Some(lo), Some(hi)) => (hi - lo) as f64 / 1e3,
        _ => 0.0,
    }
}

/// The most the spread of the generators' true origins can be: the
/// spread measured on our clock, moved apart by two offsets' errors, each
/// at most half its probe's round trip, µs.
fn skew_bound_us(states: &[State]) -> f64 {
    let started = || states.iter().filter(|s| s.skew_ns.is_some());
    let mut rtts: Vec<u64> = started().map(|s| s.rtt_ns).collect();
    rtts.sort_unstable_by(|a, b| b.cmp(a));
    let error_ns = rtts.iter().take(2).sum::<u64>() / 2;
    skew_spread_us(states) + error_ns as f64 / 1e3
}

/// The load's outcome from every generator's: warmups summed, the longest
/// measured phase, interrupted if any was or any stopped early, the
/// streams' tallies added, the pools' views one after another.
fn combine(states: &[State], stopped: bool, samples: crate::record::MachineSamples) -> LoadOutcome {
    let mut load = LoadOutcome {
        instrument: Some(samples),
        interrupted: stopped,
        ..LoadOutcome::default()
    };
    let mut stats = PipelineStats::default();
    for s in states {
        stats.records += s.records;
        let Some(done) = &s.done else { continue };
        load.warmup.sent += done.warmup.sent;
        load.warmup.ok += done.warmup.ok;
        load.warmup.failed += done.warmup.failed;
        load.measured = load.measured.max(done.measured);
        load.interrupted |= done.interrupted;
        load.links = match (load.links, done.links) {
            (Some(a), Some(b)) => Some(a.plus(&b)),
            (a, b) => a.or(b),
        };
        stats.peak_in_flight += done.peak_in_flight;
        load.endpoints.extend(done.endpoints.iter().cloned());
        if let Some(theirs) = &done.streams {
            load.streams
                .get_or_insert_with(StreamTally::default)
                .add(theirs);
        }
    }
    load.pipeline = stats;
    load
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_generators_beside_a_mesh_that_fills_the_cpus_are_warned_of() {
        let line = shared_cores_warning(3, 3, 2).expect("3 + 3 processes on 2 CPUs");
        assert!(
            line.starts_with(
                "3 load generators and the mesh's 3 process(es) share this machine's 2 CPU(s)"
            ),
            "{line}"
        );
        // Room for every process: no warning.
        assert_eq!(shared_cores_warning(3, 3, 6), None);
        assert!(shared_cores_warning(3, 3, 5).is_some());
        // One generator (in a process of its own, or in the orchestrator)
        // is the baseline the warning compares with.
        assert_eq!(shared_cores_warning(1, 3, 2), None);
    }

    #[test]
    fn a_probe_answered_half_way_gives_the_clocks_difference() {
        // Sent at 1,000 on our clock, answered after 200 ns round trip
        // with their 1,600: they are 500 ahead.
        assert_eq!(offset_ns(1_000, 200, 1_600), 500);
        assert_eq!(offset_ns(1_000, 200, 600), -500);
    }

    fn state(skew_ns: Option<i128>) -> State {
        State {
            skew_ns,
            ..State::of(0, 1, "g.log".to_owned(), 0, 0)
        }
    }

    #[test]
    fn records_move_by_their_generators_skew_and_the_spread_is_reported() {
        let record = |t: u64| RequestRecord {
            id: 1,
            intended: Duration::from_micros(t),
            start: Duration::from_micros(t + 5),
            end: Duration::from_micros(t + 100),
            outcome: crate::record::Outcome::Ok,
            path: Vec::new(),
            extra_attempts: 0,
            attempts: Vec::new(),
            stream: None,
        };
        let late = state(Some(300_000));
        let mut r = record(1_000);
        late.shift(&mut r);
        assert_eq!(r.intended, Duration::from_micros(1_300));
        assert_eq!(r.latency(), Duration::from_micros(100));
        let early = state(Some(-200_000));
        let mut r = record(1_000);
        early.shift(&mut r);
        assert_eq!(r.end, Duration::from_micros(900));
        // Its pool's events move with its records.
        let mut pool = crate::analysis::CallerEndpoints {
            caller: "loadgen/1".to_owned(),
            hop: "a".to_owned(),
            replicas: Vec::new(),
            events: vec![crate::analysis::EndpointEvent {
                at_s: 1.5,
                replica: 0,
                kind: "ejected".to_owned(),
                reason: String::new(),
            }],
            dropped: 0,
        };
        early.shift_events(&mut pool);
        assert!((pool.events[0].at_s - 1.4998).abs() < 1e-9);
        assert!((skew_spread_us(&[late, early, state(None)]) - 500.0).abs() < 1e-9);
    }

    #[test]
    fn merged_records_give_the_sum_of_the_generators_histograms_bucket_for_bucket() {
        use tailmesh_analysis::testing::{analyze_variant, chain3, check, ok_records};
        // 1000 requests spread over many buckets, sent by 3 generators
        // (ids k, k + 3, ...), each with its own start skew; the
        // orchestrator takes them in the order they come, interleaved.
        let records: Vec<RequestRecord> = ok_records()
            .into_iter()
            .map(|mut r| {
                r.end += Duration::from_micros(r.id * 7_919 % 30_000);
                r
            })
            .collect();
        let states = [state(Some(0)), state(Some(150_000)), state(Some(-80_000))];
        let parts: Vec<Vec<RequestRecord>> = (0..3u64)
            .map(|k| {
                records
                    .iter()
                    .filter(|r| r.id % 3 == k)
                    .map(|r| {
                        let mut r = r.clone();
                        states[k as usize].shift(&mut r);
                        r
                    })
                    .collect()
            })
            .collect();
        let mut merged = Vec::new();
        for i in 0..parts.iter().map(Vec::len).max().unwrap_or(0) {
            merged.extend(parts.iter().filter_map(|p| p.get(i).cloned()));
        }
        let measured = Duration::from_secs(3);
        let whole = analyze_variant(&chain3(), &check(), &merged, measured);
        let mut sum = tailmesh_analysis::stats::new_histogram();
        for part in &parts {
            let own = analyze_variant(&chain3(), &check(), part, measured);
            sum.add(&own.latency_histogram).expect("add");
        }
        let buckets = |h: &hdrhistogram::Histogram<u64>| -> Vec<(u64, u64)> {
            h.iter_recorded()
                .map(|v| (v.value_iterated_to(), v.count_at_value()))
                .collect()
        };
        assert!(buckets(&sum).len() > 100, "{}", buckets(&sum).len());
        assert_eq!(buckets(&whole.latency_histogram), buckets(&sum));
        assert_eq!(whole.ok, 1000);
        assert_eq!(
            whole.latency.p99_us,
            sum.value_at_quantile(0.99),
            "the merged p99 is the summed histogram's"
        );
    }

    #[test]
    fn the_skew_bound_widens_the_spread_by_the_two_longest_probes_halves() {
        let probed = |skew_ns: i128, rtt_ns: u64| State {
            rtt_ns,
            ..state(Some(skew_ns))
        };
        // Spread 300 us; the two longest round trips 80 and 40 us, so the
        // true origins may be up to 60 us further apart. A generator that
        // never started adds nothing, however long its probe.
        let states = [
            probed(100_000, 40_000),
            probed(-200_000, 80_000),
            probed(0, 20_000),
            State {
                rtt_ns: 900_000,
                ..state(None)
            },
        ];
        assert!((skew_bound_us(&states) - 360.0).abs() < 1e-9);
        assert!((skew_bound_us(&states[..1]) - 20.0).abs() < 1e-9);
    }
}
