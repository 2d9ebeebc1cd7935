//! Launchers start the hop and broker processes of a run, wait until each
//! one answers gRPC health checks, watch them while the run lasts, and stop
//! them when it ends. The child side of the contract is
//! `tailmesh_services::process`: a supervised child gets
//! `--addr-file <path> --supervised`, writes its bound address there, serves
//! `grpc.health.v1.Health`, and exits on SIGTERM, SIGINT or EOF on stdin.
//!
//! - `local`: [`LocalLauncher`], processes on 127.0.0.1 with ephemeral ports.
//! - `netns`: [`NetnsLauncher`], a network namespace and address per process
//!   on a bridge (root), so network faults hit one replica only.
//! - `attach`: [`AttachedLauncher`], services someone else started (Docker
//!   Compose, Kubernetes), found by name.
//! - `health`: the readiness probe every launcher shares.
//! - `brokers`: RabbitMQ and NATS servers as processes of a run, started
//!   by `tailmesh broker --kind` (a supervised child like any other).

mod attach;
pub mod brokers;
pub mod health;
mod local;
pub mod netns;

use std::{
    ffi::OsString,
    fmt,
    fs::File,
    io::{Read, Seek, SeekFrom},
    net::{IpAddr, SocketAddr},
    os::unix::process::ExitStatusExt,
    path::{Path, PathBuf},
    process::ExitStatus,
    time::Duration,
};

use tailmesh_services::addr::PeerAddr;

pub use attach::{Attach, AttachedLauncher, DEFAULT_ATTACH_TIMEOUT};
pub use local::LocalLauncher;
pub use netns::NetnsLauncher;

/// The launcher a variant runs with.
#[derive(Debug)]
pub enum AnyLauncher {
    /// Processes on 127.0.0.1.
    Local(LocalLauncher),
    /// A namespace per process.
    Netns(NetnsLauncher),
    /// Services started by Docker Compose or Kubernetes, found by name.
    Attached(AttachedLauncher),
}

impl AnyLauncher {
    /// Starts `spec` (or, attached, finds the service playing `spec.name`)
    /// and waits until it answers health checks; returns its address.
    pub async fn launch(&mut self, spec: ProcessSpec) -> Result<PeerAddr, LaunchError> {
        match self {
            Self::Local(l) => l.launch(spec).await.map(|l| l.addr.into()),
            Self::Netns(l) => l.launch(spec).await.map(|l| l.addr.into()),
            Self::Attached(l) => l.launch(&spec.name).await,
        }
    }

    /// The address the process `name` will listen on, when the launcher
    /// decides it before the process starts: the netns launcher creates
    /// the namespace (and its address) here, so a certificate can name
    /// it. `None` for the local launcher (127.0.0.1) and attached.
    pub fn address_before_launch(&mut self, name: &str) -> Result<Option<IpAddr>, LaunchError> {
        match self {
            Self::Netns(l) => l
                .member(name)
                .map(|m| Some(IpAddr::V4(m.addr)))
                .map_err(|e| LaunchError::Network {
                    name: name.to_owned(),
                    why: e.to_string(),
                }),
            Self::Local(_) | Self::Attached(_) => Ok(None),
        }
    }

    /// Children that exited since the last call (none when attached: the
    /// container runtime restarts or reports its own).
    pub fn exited(&mut self) -> Vec<ExitedChild> {
        match self {
            Self::Local(l) => l.exited(),
            Self::Netns(l) => l.exited(),
            Self::Attached(_) => Vec::new(),
        }
    }

    /// SIGKILLs the child `name` (a scheduled `kill`), by its process id;
    /// its death is not reported by [`AnyLauncher::exited`]. Attached
    /// services are not this process's children: refused.
    pub async fn kill(&mut self, name: &str) -> Result<Killed, LaunchError> {
        match self {
            Self::Local(l) => l.kill(name).await,
            Self::Netns(l) => l.kill(name).await,
            Self::Attached(_) => Err(LaunchError::InvalidName {
                name: name.to_owned(),
                reason: "the attached launcher cannot kill a deployed service",
            }),
        }
    }

    /// Starts a killed child again at the address it had.
    pub async fn relaunch(&mut self, killed: &Killed) -> Result<PeerAddr, LaunchError> {
        match self {
            Self::Local(l) => l.relaunch(killed).await.map(|l| l.addr.into()),
            Self::Netns(l) => l.relaunch(killed).await.map(|l| l.addr.into()),
            Self::Attached(_) => Err(LaunchError::InvalidName {
                name: killed.exited.name.clone(),
                reason: "the attached launcher cannot start a deployed service",
            }),
        }
    }

    /// Stops every child (and removes the network of a netns launcher);
    /// attached services keep running.
    pub async fn shutdown(&mut self, grace: Duration) -> Vec<ExitedChild> {
        match self {
            Self::Local(l) => l.shutdown(grace).await,
            Self::Netns(l) => l.shutdown(grace).await,
            Self::Attached(_) => Vec::new(),
        }
    }

    /// The Control token of the fault agents, and where the fault of the
    /// process `role` (`hop-b-1`) lives: its namespace (netns), its
    /// service (attached) or `local` (a local child with a Control
    /// service: application-level faults only). `None` for a launcher
    /// without fault agents.
    pub fn fault_place(&self, role: &str) -> Option<(&str, String)> {
        match self {
            Self::Local(l) => l.token().map(|t| (t, "local".to_owned())),
            Self::Netns(l) => {
                let net = l.network();
                let member = net.members().iter().find(|m| m.name == role)?;
                Some((l.token(), member.ns.clone()))
            }
            Self::Attached(l) => Some((l.token()?, l.service(role))),
        }
    }

    /// The peak resident memory (VmHWM) of every child still running, in
    /// launch order; empty when attached (the container runtime has its
    /// own figures) and for a child whose figure cannot be read.
    pub fn peak_memory(&self) -> Vec<PeakMemory> {
        self.running()
            .into_iter()
            .filter_map(|c| {
                Some(PeakMemory {
                    process: c.name.clone(),
                    peak_rss_bytes: peak_rss_bytes(&format!("/proc/{}/status", c.pid))?,
                })
            })
            .collect()
    }

    /// Every child still running, in launch order; none when attached.
    pub fn running(&self) -> Vec<&Launched> {
        match self {
            Self::Local(l) => l.running().collect(),
            Self::Netns(l) => l.running().collect(),
            Self::Attached(_) => Vec::new(),
        }
    }

    /// `"local"`, `"netns"` or `"attached"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Local(_) => "local",
            Self::Netns(_) => "netns",
            Self::Attached(_) => "attached",
        }
    }
}

pub use tailmesh_analysis::record::PeakMemory;

/// The VmHWM line of a `/proc/<pid>/status` file, in bytes.
pub fn peak_rss_bytes(status_file: &str) -> Option<u64> {
    status_bytes(&std::fs::read_to_string(status_file).ok()?, "VmHWM")
}

/// A `/proc/<pid>/status` line such as `VmRSS:   8192 kB`, in bytes.
pub fn status_bytes(status: &str, key: &str) -> Option<u64> {
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// What to start: `program args... --addr-file <log_dir>/<name>.addr --supervised`.
#[derive(Clone, Debug)]
pub struct ProcessSpec {
    /// A short unique name such as `hop-b-1` or `broker`; it names the
    /// process's files (`<name>.log`, `<name>.addr`, `<name>.pid`) and
    /// appears in every message about it.
    pub name: String,
    /// The executable; for tailmesh's own roles, `std::env::current_exe()`.
    pub program: PathBuf,
    /// Arguments before the launcher's own `--addr-file .. --supervised`.
    pub args: Vec<OsString>,
    /// Variables added to the inherited environment.
    pub env: Vec<(OsString, OsString)>,
    /// How long it may take to answer SERVING, when longer than the
    /// launcher's default (a RabbitMQ server takes tens of seconds).
    pub ready_timeout: Option<Duration>,
    /// Set for a service of `[hop.service]` (any gRPC server, not a
    /// tailmesh process): see [`ServiceProcess`].
    pub service: Option<ServiceProcess>,
}

/// How a gRPC service of `[hop.service] command` differs from a tailmesh
/// process: it gets no `--addr-file` nor `--supervised` (its port is chosen
/// beforehand and is in its arguments and `PORT`), its stdin is empty, it
/// dies with the launcher through a parent-death signal (`setpriv
/// --pdeathsig KILL`, where util-linux's setpriv is installed), it is
/// ready when it answers a health check SERVING, or UNIMPLEMENTED when it
/// has no health service, within exactly its ready timeout; and the local
/// launcher stops it after the tailmesh processes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceProcess {
    /// Where it must listen.
    pub addr: SocketAddr,
    /// Its working folder (empty: the launcher's).
    pub dir: PathBuf,
}

impl ProcessSpec {
    /// A spec with no arguments and no extra environment.
    pub fn new(name: impl Into<String>, program: impl Into<PathBuf>) -> Self {
        Self {
            name: name.into(),
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            ready_timeout: None,
            service: None,
        }
    }

    /// Makes it a service of `[hop.service]`, listening at `addr`, run in
    /// `dir`.
    pub fn service(mut self, addr: SocketAddr, dir: PathBuf) -> Self {
        self.service = Some(ServiceProcess { addr, dir });
        self
    }

    /// Appends one argument.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Appends arguments.
    pub fn args<I, A>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = A>,
        A: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Gives it longer than the launcher's default to get ready.
    pub fn ready_within(mut self, timeout: Duration) -> Self {
        self.ready_timeout = Some(timeout);
        self
    }

    /// Adds an environment variable.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }
}

/// A process that was started and answered health checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launched {
    /// The spec's name.
    pub name: String,
    /// Where it serves.
    pub addr: SocketAddr,
    /// Its process id (for reports; the launcher signals it by this id only
    /// while it has not reaped it, so the id cannot have been reused).
    pub pid: u32,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
}

/// A child killed on purpose ([`AnyLauncher::kill`]), with what it was
/// started from.
#[derive(Clone, Debug)]
pub struct Killed {
    /// How it ended (SIGKILL, unless it had exited just before).
    pub exited: ExitedChild,
    /// Its spec as launched (the netns launcher's, wrapped).
    pub spec: ProcessSpec,
}

impl Killed {
    /// Its spec, listening where it listened before: `--listen` set to
    /// its address (the netns launcher's `<ip>:0` becomes `<ip>:<port>`).
    pub fn spec_at_its_address(&self) -> ProcessSpec {
        let addr: OsString = self.exited.addr.to_string().into();
        let mut spec = self.spec.clone();
        match spec.args.iter().position(|a| a == "--listen") {
            Some(i) if i + 1 < spec.args.len() => spec.args[i + 1] = addr,
            _ => {
                spec.args.push("--listen".into());
                spec.args.push(addr);
            }
        }
        spec
    }
}

/// A child the launcher has reaped: it exited on its own, was killed from
/// outside, or was stopped by [`LocalLauncher::shutdown`].
#[derive(Clone, Debug)]
pub struct ExitedChild {
    /// The spec's name.
    pub name: String,
    /// Where it served.
    pub addr: SocketAddr,
    /// Its former process id.
    pub pid: u32,
    /// How it ended.
    pub status: ExitStatus,
    /// True when it ignored the graceful stop and had to be killed.
    pub forced: bool,
}

impl fmt::Display for ExitedChild {
    /// `hop-b-1 (127.0.0.1:41234, pid 123) exited: signal 9 (SIGKILL)`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}, pid {}) exited: {}",
            self.name,
            self.addr,
            self.pid,
            describe_exit(self.status)
        )?;
        if self.forced {
            f.write_str(", killed after the grace period")?;
        }
        Ok(())
    }
}

/// `exit status 2`, or `signal 9 (SIGKILL)`.
pub fn describe_exit(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        format!("exit status {code}")
    } else if let Some(signal) = status.signal() {
        match nix::sys::signal::Signal::try_from(signal) {
            Ok(name) => format!("signal {signal} ({name})"),
            Err(_) => format!("signal {signal}"),
        }
    } else {
        status.to_string()
    }
}

/// Why a process could not be launched.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The name cannot be used as a file name, or is already running.
    #[error("{name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },
    /// A file the launcher needs (log directory, log file, pid file) could
    /// not be written.
    #[error("{name}: cannot write {}: {source}", path.display())]
    Files {
        name: String,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The process's network namespace could not be made (netns).
    #[error("{name}: its network namespace: {why}")]
    Network { name: String, why: String },
    /// The program could not be started at all.
    #[error("{name}: cannot start {}: {source}", program.display())]
    Spawn {
        name: String,
        program: PathBuf,
        /// The cause (commonly: not found, permission denied).
        source: std::io::Error,
    },
    /// The process exited before it answered health checks.
    #[error("{}: exited before it was ready ({}); {log}", who(name, *addr, *pid), describe_exit(*status))]
    ExitedBeforeReady {
        name: String,
        pid: u32,
        /// Its address, if it had written one.
        addr: Option<SocketAddr>,
        status: ExitStatus,
        /// The end of its log.
        log: Box<LogTail>,
    },
    /// The deadline passed before the process answered SERVING; it has
    /// been killed.
    #[error(
        "{}: not ready after {} ({}); {log}",
        who(name, *addr, *pid),
        tailmesh_units::duration(*waited),
        last_problem.as_deref().unwrap_or("it never wrote its address file")
    )]
    NotReady {
        name: String,
        pid: u32,
        /// Its address, if it had written one.
        addr: Option<SocketAddr>,
        waited: Duration,
        /// The last failed health check, or why the address file was not
        /// usable.
        last_problem: Option<String>,
        /// The end of its log.
        log: Box<LogTail>,
    },
    /// An attached service did not answer SERVING in time (attached
    /// launcher: it is not running, not healthy, or named otherwise).
    #[error(
        "{name}: service {service:?} not ready after {}: {last_problem}; is the deployment \
         running, and was it generated from this scenario (tailmesh compose / tailmesh k8s)?",
        tailmesh_units::duration(*waited)
    )]
    Unreachable {
        /// The role (`hop-b-1`, `broker`).
        name: String,
        /// The service expected to play it.
        service: String,
        waited: Duration,
        /// The last failed health check.
        last_problem: String,
    },
    /// Waiting for the process failed in the operating system.
    #[error("{}: cannot wait for it: {source}", who(name, None, *pid))]
    Wait {
        name: String,
        pid: u32,
        source: std::io::Error,
    },
}

impl LaunchError {
    /// The name of the process the error is about.
    pub fn name(&self) -> &str {
        match self {
            LaunchError::InvalidName { name, .. }
            | LaunchError::Files { name, .. }
            | LaunchError::Spawn { name, .. }
            | LaunchError::Network { name, .. }
            | LaunchError::ExitedBeforeReady { name, .. }
            | LaunchError::NotReady { name, .. }
            | LaunchError::Unreachable { name, .. }
            | LaunchError::Wait { name, .. } => name,
        }
    }
}

/// `hop-b-1 (127.0.0.1:41234, pid 123)`, or `hop-b-1 (pid 123)` before the
/// address is known.
fn who(name: &str, addr: Option<SocketAddr>, pid: u32) -> String {
    match addr {
        Some(addr) => format!("{name} ({addr}, pid {pid})"),
        None => format!("{name} (pid {pid})"),
    }
}

/// The last lines a process wrote to its log during one launch.
#[derive(Clone, Debug, Default)]
pub struct LogTail {
    /// The log file.
    pub path: PathBuf,
    /// Its last lines (at most [`LogTail::MAX_LINES`]).
    pub lines: Vec<String>,
    /// Why the log could not be read, if it could not.
    pub unreadable: Option<String>,
}

impl LogTail {
    /// How many lines an error message quotes.
    pub const MAX_LINES: usize = 20;

    /// Reads at most this much of a log to quote its last lines.
    const MAX_BYTES: u64 = 64 * 1024;

    /// The last [`LogTail::MAX_LINES`] lines of `path` written after byte
    /// `start` (where one launch's output begins in an appended log).
    pub fn read(path: &Path, start: u64) -> Box<LogTail> {
        let read = || -> std::io::Result<Vec<String>> {
            let mut file = File::open(path)?;
            let end = file.metadata()?.len();
            let from = start.max(end.saturating_sub(Self::MAX_BYTES));
            file.seek(SeekFrom::Start(from))?;
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes)?;
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            let skip = lines.len().saturating_sub(Self::MAX_LINES);
            Ok(lines[skip..].iter().map(|l| l.to_string()).collect())
        };
        match read() {
            Ok(lines) => Box::new(LogTail {
                path: path.to_path_buf(),
                lines,
                unreadable: None,
            }),
            Err(e) => Box::new(LogTail {
                path: path.to_path_buf(),
                lines: Vec::new(),
                unreadable: Some(e.to_string()),
            }),
        }
    }
}

impl fmt::Display for LogTail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(why) = &self.unreadable {
            return write!(f, "its log {} is unreadable: {why}", self.path.display());
        }
        if self.lines.is_empty() {
            return write!(f, "it wrote nothing to {}", self.path.display());
        }
        write!(f, "last log lines ({}):", self.path.display())?;
        for line in &self.lines {
            write!(f, "\n  {line}")?;
        }
        Ok(())
    }
}

/// A fresh 128-bit Control token in hex, from the OS's generator.
pub fn new_token() -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    format!("{:032x}", rng.random::<u128>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_killed_child_comes_back_at_its_own_address() {
        let exited = |addr: &str| ExitedChild {
            name: "hop-b-1".into(),
            addr: addr.parse().expect("an address"),
            pid: 1,
            status: ExitStatus::from_raw(9),
            forced: false,
        };
        let local = Killed {
            exited: exited("127.0.0.1:41234"),
            spec: ProcessSpec::new("hop-b-1", "tailmesh").args(["hop", "--config", "b.json"]),
        };
        let args: Vec<String> = local
            .spec_at_its_address()
            .args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args,
            ["hop", "--config", "b.json", "--listen", "127.0.0.1:41234"]
        );

        let netns = Killed {
            exited: exited("10.7.0.3:40000"),
            spec: ProcessSpec::new("hop-b-1", "ip").args([
                "netns",
                "exec",
                "tm1n3",
                "tailmesh",
                "hop",
                "--listen",
                "10.7.0.3:0",
            ]),
        };
        let args = netns.spec_at_its_address().args;
        assert_eq!(args.iter().filter(|a| *a == "--listen").count(), 1);
        assert_eq!(
            args.last().map(|a| a.to_string_lossy()),
            Some("10.7.0.3:40000".into())
        );
    }

    #[test]
    fn exit_statuses_read_like_the_shell_says_them() {
        // Raw wait statuses: exit code in the high byte, signal in the low.
        assert_eq!(describe_exit(ExitStatus::from_raw(2 << 8)), "exit status 2");
        assert_eq!(describe_exit(ExitStatus::from_raw(0)), "exit status 0");
        assert_eq!(describe_exit(ExitStatus::from_raw(9)), "signal 9 (SIGKILL)");
        assert_eq!(
            describe_exit(ExitStatus::from_raw(15)),
            "signal 15 (SIGTERM)"
        );
    }

    #[test]
    fn the_log_tail_covers_this_launch_only_and_its_last_lines() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("hop.log");
        let earlier = "an earlier run\n";
        let lines: Vec<String> = (1..=25).map(|i| format!("line {i}")).collect();
        std::fs::write(&path, format!("{earlier}{}\n", lines.join("\n")))?;

        let tail = LogTail::read(&path, earlier.len() as u64);
        assert_eq!(tail.lines, lines[5..]);
        assert!(tail.unreadable.is_none());

        let tail = LogTail::read(&path, std::fs::metadata(&path)?.len());
        assert!(tail.lines.is_empty());

        let tail = LogTail::read(&dir.path().join("missing.log"), 0);
        assert!(tail.unreadable.is_some());
        Ok(())
    }

    #[test]
    fn launch_errors_name_the_process_and_quote_its_log() {
        let error = LaunchError::ExitedBeforeReady {
            name: "hop-b-1".into(),
            pid: 123,
            addr: Some("127.0.0.1:41234".parse().expect("an address")),
            status: ExitStatus::from_raw(2 << 8),
            log: Box::new(LogTail {
                path: "/run/logs/hop-b-1.log".into(),
                lines: vec!["error: bad flag".into(), "usage: ...".into()],
                unreadable: None,
            }),
        };
        assert_eq!(
            error.to_string(),
            "hop-b-1 (127.0.0.1:41234, pid 123): exited before it was ready (exit status 2); \
             last log lines (/run/logs/hop-b-1.log):\n  error: bad flag\n  usage: ..."
        );
        assert_eq!(error.name(), "hop-b-1");

        let error = LaunchError::NotReady {
            name: "broker".into(),
            pid: 7,
            addr: None,
            waited: Duration::from_secs(15),
            last_problem: None,
            log: Box::new(LogTail {
                path: "/run/logs/broker.log".into(),
                ..LogTail::default()
            }),
        };
        assert_eq!(
            error.to_string(),
            "broker (pid 7): not ready after 15.0 s (it never wrote its address file); \
             it wrote nothing to /run/logs/broker.log"
        );
    }
}
