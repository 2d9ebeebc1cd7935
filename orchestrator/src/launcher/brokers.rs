//! RabbitMQ and NATS JetStream servers as processes of a run.
//!
//! `tailmesh broker --kind nats|rabbitmq` is the supervised child the
//! launchers start, like any other: it serves gRPC health (NOT_SERVING
//! until the server is up), starts the server as its own child with its
//! data and node name in a fresh temporary directory and on free ports of
//! its listening address, waits until the server takes connections, writes
//! the server's address to `<name>.endpoint` beside its address file, and
//! reports SERVING. When told to stop (a signal, or its standard input
//! closing because the orchestrator died) it stops the server (SIGTERM,
//! then SIGKILL after a grace) and removes the directory. So the server
//! gets the local and netns launchers' guarantees: started in the
//! variant's place, waited for, never left behind.
//!
//! The server's own output (RabbitMQ's banner, its warnings) goes to a log
//! file of its own, `<name>.server.log` beside the launcher's `<name>.log`
//! in a run, never to a terminal; a server that does not get ready is an
//! error that quotes the log's last lines, as a hop's is.
//!
//! RabbitMQ's node needs epmd, the Erlang port mapper; the wrapper starts
//! one of its own on a free port in the foreground (`ERL_EPMD_PORT`), so
//! the node finds it instead of daemonizing one that would outlive the run.
//!
//! The benchmarks start their servers through [`BrokerServer::start`] too.

use std::{
    ffi::OsString,
    fs::{File, OpenOptions},
    io::Write,
    net::{IpAddr, SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use tailmesh_services::{
    addr::PeerAddr,
    broker::{nats, rabbitmq},
    model::BrokerKind,
};
use tokio::{
    process::{Child, Command},
    time::{Instant, sleep, timeout},
};

use super::LogTail;

/// How long a broker server may take to take connections: RabbitMQ needs
/// 5 to 25 s on a busy 2-core machine.
pub const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a server gets to stop after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// Pause between readiness probes.
const PROBE_INTERVAL: Duration = Duration::from_millis(50);
/// Bound on one readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The executable each server needs, and its Debian package.
fn program(kind: BrokerKind) -> Option<(&'static str, &'static str)> {
    match kind {
        BrokerKind::Tailmesh => None,
        BrokerKind::Nats => Some(("nats-server", "nats-server")),
        // The Debian wrapper in /usr/sbin switches to the rabbitmq user,
        // which cannot write the run's directory; the script it runs can.
        BrokerKind::Rabbitmq => Some(("rabbitmq-server", "rabbitmq-server")),
    }
}

/// What went wrong starting or stopping a broker server.
#[derive(Debug, thiserror::Error)]
pub enum BrokerProcessError {
    /// The server's program is not installed.
    #[error(
        "broker kind \"{kind}\" needs {program}, which is not installed (Debian package {package})"
    )]
    Missing {
        kind: &'static str,
        program: &'static str,
        package: &'static str,
    },
    /// Tailmesh's own broker is no server to start: it runs in process or
    /// as `tailmesh broker`.
    #[error("broker kind \"tailmesh\" runs as `tailmesh broker`, not as a server of its own")]
    NotAServer,
    /// Files or ports could not be had.
    #[error("broker {kind}: {what}: {source}")]
    Io {
        kind: &'static str,
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The server exited before it took connections.
    #[error("broker {kind}: {program} exited before it was ready ({status}); {log}")]
    Exited {
        kind: &'static str,
        program: String,
        status: std::process::ExitStatus,
        /// The end of its log.
        log: Box<LogTail>,
    },
    /// The server did not take connections in time.
    #[error("broker {kind}: not ready after {}: {last}; {log}", tailmesh_units::duration(*waited))]
    NotReady {
        kind: &'static str,
        waited: Duration,
        #[source]
        last: BrokerProbeError,
        /// The end of its log.
        log: Box<LogTail>,
    },
    /// The endpoint file of a started broker could not be read.
    #[error("broker endpoint file {}: {source}", path.display())]
    Endpoint {
        path: PathBuf,
        #[source]
        source: EndpointError,
    },
}

/// Why an endpoint file holds no address.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// It could not be read.
    #[error(transparent)]
    Read(#[from] std::io::Error),
    /// It holds something else.
    #[error(transparent)]
    Parse(#[from] std::net::AddrParseError),
}

/// Why a broker server did not answer a readiness probe.
#[derive(Debug, thiserror::Error)]
pub enum BrokerProbeError {
    /// It answered with an error (commonly: the connection was refused).
    #[error("{}", .0.message())]
    Refused(#[source] tonic::Status),
    /// It did not answer in time.
    #[error("no answer within {}", tailmesh_units::duration(*.0))]
    Silent(Duration),
}

/// The file `tailmesh broker --kind` writes the server's address to.
pub fn endpoint_file(addr_file: &Path) -> PathBuf {
    addr_file.with_extension("endpoint")
}

/// The file `tailmesh broker --kind` sends the server's output to:
/// `<name>.server.log` beside its address file `<name>.addr`.
pub fn server_log_file(addr_file: &Path) -> PathBuf {
    addr_file.with_extension("server.log")
}

/// The server's address, as the broker process `name` started by a
/// launcher whose log directory is `log_dir` wrote it.
pub fn read_endpoint(log_dir: &Path, name: &str) -> Result<PeerAddr, BrokerProcessError> {
    let path = endpoint_file(&log_dir.join(format!("{name}.addr")));
    let read = || -> Result<SocketAddr, EndpointError> {
        Ok(std::fs::read_to_string(&path)?.trim().parse()?)
    };
    match read() {
        Ok(addr) => Ok(PeerAddr::from(addr)),
        Err(source) => Err(BrokerProcessError::Endpoint { path, source }),
    }
}

/// A free TCP port on `ip` (bound and released: the server binds it an
/// instant later).
fn free_port(ip: IpAddr) -> std::io::Result<u16> {
    Ok(TcpListener::bind((ip, 0))?.local_addr()?.port())
}

/// Which server [`BrokerServer::start`] starts, and where its output goes.
#[derive(Clone, Debug)]
pub struct ServerSpec {
    kind: BrokerKind,
    ip: IpAddr,
    program: Option<PathBuf>,
    log: Option<PathBuf>,
}

impl ServerSpec {
    /// The `kind` server, listening on `ip` on a free port; its program
    /// found on `PATH` (and in the Debian packages' own directories), its
    /// output logged in its temporary directory (gone when it stops).
    pub fn new(kind: BrokerKind, ip: IpAddr) -> Self {
        Self {
            kind,
            ip,
            program: None,
            log: None,
        }
    }

    /// Runs `program` instead of the one found on `PATH`.
    pub fn program(mut self, program: impl Into<PathBuf>) -> Self {
        self.program = Some(program.into());
        self
    }

    /// Appends the server's output (and its epmd's) to `log`, which
    /// outlives the server.
    pub fn log_to(mut self, log: impl Into<PathBuf>) -> Self {
        self.log = Some(log.into());
        self
    }
}

/// A running broker server and what the run gave it.
#[derive(Debug)]
pub struct BrokerServer {
    kind: BrokerKind,
    /// Where clients reach it.
    pub addr: SocketAddr,
    child: Child,
    epmd: Option<Child>,
    dir: PathBuf,
    log: PathBuf,
}

impl BrokerServer {
    /// Starts the server `spec` names and waits until it takes
    /// connections. Its output goes to its log only; if it exits first or
    /// is not ready within [`READY_TIMEOUT`], it is stopped and the error
    /// quotes the log's last lines.
    pub async fn start(spec: ServerSpec) -> Result<Self, BrokerProcessError> {
        let kind = spec.kind;
        let name = kind.as_str();
        let Some((program, package)) = program(kind) else {
            return Err(BrokerProcessError::NotAServer);
        };
        let path = match spec.program {
            Some(path) => path,
            None => find(program, kind).ok_or(BrokerProcessError::Missing {
                kind: name,
                program,
                package,
            })?,
        };
        let io = |what: &str| {
            let what = what.to_owned();
            move |source| BrokerProcessError::Io {
                kind: name,
                what,
                source,
            }
        };
        let dir = std::env::temp_dir().join(format!("tailmesh-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(io("create its directory"))?;
        let log = spec.log.unwrap_or_else(|| dir.join("server.log"));
        let (log_file, log_start) = open_log(&log, &path).map_err(io("open its log"))?;
        let port = free_port(spec.ip).map_err(io("find a free port"))?;
        let addr = SocketAddr::new(spec.ip, port);
        let (mut command, epmd) = match kind {
            BrokerKind::Nats => (
                nats_command(&path, &dir, addr).map_err(io("write its config"))?,
                None,
            ),
            _ => {
                let (command, epmd) = rabbitmq_command(&path, &dir, addr, &log_file)
                    .await
                    .map_err(io("prepare RabbitMQ"))?;
                (command, Some(epmd))
            }
        };
        let stderr = log_file.try_clone().map_err(io("open its log"))?;
        let child = command
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(io(&format!("start {}", path.display())))?;
        let mut server = BrokerServer {
            kind,
            addr,
            child,
            epmd,
            dir,
            log,
        };
        let started = Instant::now();
        tracing::info!(broker = name, %addr, "started, waiting until it takes connections");
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                let error = BrokerProcessError::Exited {
                    kind: name,
                    program: path.display().to_string(),
                    status,
                    log: LogTail::read(&server.log, log_start),
                };
                server.stop().await;
                return Err(error);
            }
            let last = match probe(kind, &PeerAddr::from(addr)).await {
                Ok(()) => break,
                Err(why) => why,
            };
            if started.elapsed() > READY_TIMEOUT {
                let error = BrokerProcessError::NotReady {
                    kind: name,
                    waited: started.elapsed(),
                    last,
                    log: LogTail::read(&server.log, log_start),
                };
                server.stop().await;
                return Err(error);
            }
            sleep(PROBE_INTERVAL).await;
        }
        tracing::info!(broker = name, %addr, ready_in = ?started.elapsed(), "ready");
        Ok(server)
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Where its output goes.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Resolves when the server exits on its own, with how it ended.
    pub async fn exited(&mut self) -> String {
        match self.child.wait().await {
            Ok(status) => status.to_string(),
            Err(e) => e.to_string(),
        }
    }

    /// Stops the server (SIGTERM, then SIGKILL after a grace), and its
    /// epmd, and removes its directory.
    pub async fn stop(mut self) {
        for child in std::iter::once(&mut self.child).chain(self.epmd.as_mut()) {
            // Each runs in a process group of its own: the signal reaches
            // the helpers it started too (the Erlang VM's).
            let group = child.id().and_then(|p| i32::try_from(p).ok());
            if let Some(pid) = group {
                let _ = kill(Pid::from_raw(-pid), Signal::SIGTERM);
            }
            if timeout(STOP_GRACE, child.wait()).await.is_err() {
                tracing::warn!(
                    broker = self.kind.as_str(),
                    "did not stop within {}; killing it",
                    tailmesh_units::duration(STOP_GRACE)
                );
                if let Some(pid) = group {
                    let _ = kill(Pid::from_raw(-pid), Signal::SIGKILL);
                }
                let _ = timeout(STOP_GRACE, child.wait()).await;
            } else if let Some(pid) = group {
                // Whatever of the group outlived its leader.
                let _ = kill(Pid::from_raw(-pid), Signal::SIGKILL);
            }
        }
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), "cannot remove the broker's directory: {e}");
        }
    }
}

impl Drop for BrokerServer {
    /// A server dropped without [`BrokerServer::stop`] (a panic, an early
    /// return) is killed with every process of its group (the Erlang VM
    /// that RabbitMQ's script started), and its directory removed.
    fn drop(&mut self) {
        // A child that `stop` reaped has no id any more: nothing to kill.
        for child in std::iter::once(&mut self.child).chain(self.epmd.as_mut()) {
            if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
                let _ = kill(Pid::from_raw(-pid), Signal::SIGKILL);
            }
        }
        match std::fs::remove_dir_all(&self.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::debug!(dir = %self.dir.display(), "cannot remove the broker's directory: {e}");
            }
            _ => {}
        }
    }
}

/// Opens `path` for appending, writes a header for this start, and
/// returns the file and where this start's output begins.
fn open_log(path: &Path, program: &Path) -> std::io::Result<(File, u64)> {
    let mut log = OpenOptions::new().create(true).append(true).open(path)?;
    writeln!(log, "--- starting {}", program.display())?;
    let start = log.metadata()?.len();
    Ok((log, start))
}

fn find(program: &str, kind: BrokerKind) -> Option<PathBuf> {
    let candidates: &[&str] = match kind {
        BrokerKind::Rabbitmq => &["/usr/lib/rabbitmq/bin"],
        _ => &[],
    };
    let path = std::env::var_os("PATH").unwrap_or_default();
    candidates
        .iter()
        .map(PathBuf::from)
        .chain(std::env::split_paths(&path))
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// Is the server up: NATS answers a JetStream request, RabbitMQ opens an
/// AMQP connection.
pub(crate) async fn probe(kind: BrokerKind, addr: &PeerAddr) -> Result<(), BrokerProbeError> {
    tokio::time::timeout(
        PROBE_TIMEOUT,
        tailmesh_services::broker::backend::stats(kind, addr, Default::default(), &[]),
    )
    .await
    .map_err(|_| BrokerProbeError::Silent(PROBE_TIMEOUT))?
    .map(drop)
    .map_err(BrokerProbeError::Refused)
}

fn nats_command(program: &Path, dir: &Path, addr: SocketAddr) -> std::io::Result<Command> {
    let config = dir.join("nats.conf");
    std::fs::write(
        &config,
        format!(
            "max_payload: {}\njetstream {{\n  store_dir: \"{}\"\n}}\n",
            nats::MAX_PAYLOAD,
            dir.join("jetstream").display()
        ),
    )?;
    let mut command = Command::new(program);
    command
        .arg("-c")
        .arg(&config)
        .arg("-js")
        .arg("-a")
        .arg(addr.ip().to_string())
        .arg("-p")
        .arg(addr.port().to_string());
    Ok(command)
}

/// The RabbitMQ node's command, everything it writes under `dir`, and the
/// epmd it registers with (started here, in the foreground).
async fn rabbitmq_command(
    program: &Path,
    dir: &Path,
    addr: SocketAddr,
    log: &File,
) -> std::io::Result<(Command, Child)> {
    std::fs::write(
        dir.join("rabbitmq.conf"),
        format!(
            "loopback_users = none\ndefault_user = {}\ndefault_pass = {}\nlog.console = true\nlog.console.level = warning\nlog.file = false\n",
            rabbitmq::USER,
            rabbitmq::PASSWORD
        ),
    )?;
    std::fs::write(dir.join("enabled_plugins"), "[].\n")?;
    let local = IpAddr::from([127, 0, 0, 1]);
    let epmd_port = free_port(local)?;
    let dist_port = free_port(local)?;
    let epmd_path = find("epmd", BrokerKind::Tailmesh)
        .or_else(|| {
            std::fs::read_dir("/usr/lib/erlang")
                .ok()?
                .filter_map(Result::ok)
                .map(|e| e.path().join("bin/epmd"))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| PathBuf::from("epmd"));
    let epmd = Command::new(&epmd_path)
        .arg("-port")
        .arg(epmd_port.to_string())
        .env("ERL_EPMD_ADDRESS", "127.0.0.1")
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log.try_clone()?)
        .kill_on_drop(true)
        .spawn()?;
    let node = format!("tailmesh{}@localhost", std::process::id());
    let env: Vec<(&str, OsString)> = vec![
        ("HOME", dir.into()),
        ("RABBITMQ_NODENAME", node.into()),
        ("RABBITMQ_NODE_IP_ADDRESS", addr.ip().to_string().into()),
        ("RABBITMQ_NODE_PORT", addr.port().to_string().into()),
        ("RABBITMQ_DIST_PORT", dist_port.to_string().into()),
        ("ERL_EPMD_PORT", epmd_port.to_string().into()),
        ("ERL_EPMD_ADDRESS", "127.0.0.1".into()),
        ("RABBITMQ_MNESIA_BASE", dir.join("mnesia").into()),
        ("RABBITMQ_LOG_BASE", dir.join("log").into()),
        ("RABBITMQ_PID_FILE", dir.join("rabbitmq.pid").into()),
        ("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq").into()),
        (
            "RABBITMQ_ENABLED_PLUGINS_FILE",
            dir.join("enabled_plugins").into(),
        ),
    ];
    let mut command = Command::new(program);
    command.envs(env);
    // The node inherits epmd's address; its distribution stays local.
    let _ = timeout(Duration::from_secs(1), async {
        while tokio::net::TcpStream::connect((local, epmd_port))
            .await
            .is_err()
        {
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    Ok((command, epmd))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[tokio::test]
    async fn a_server_that_exits_at_start_is_an_error_quoting_its_log_not_the_terminal() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let script = dir.path().join("fake-nats-server");
        std::fs::write(
            &script,
            "#!/bin/sh\necho 'a banner line'\necho 'fatal: cannot start' >&2\nexit 3\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("{e}"));
        let log = dir.path().join("server.log");
        let spec = ServerSpec::new(BrokerKind::Nats, IpAddr::from([127, 0, 0, 1]))
            .program(&script)
            .log_to(&log);
        let error = match BrokerServer::start(spec).await {
            Ok(_) => panic!("a server that exits at once started"),
            Err(e) => e,
        };
        let BrokerProcessError::Exited {
            status, log: tail, ..
        } = &error
        else {
            panic!("not an early exit: {error}");
        };
        assert_eq!(status.code(), Some(3), "{error}");
        assert_eq!(tail.path, log);
        assert_eq!(
            tail.lines,
            ["a banner line", "fatal: cannot start"],
            "{error}"
        );
        assert!(
            error.to_string().contains("\n  fatal: cannot start"),
            "{error}"
        );
        // Its output is in the log it was given, after this start's header.
        let text = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{e}"));
        assert!(text.starts_with("--- starting "), "{text}");
        assert!(
            text.ends_with("a banner line\nfatal: cannot start\n"),
            "{text}"
        );
    }

    #[test]
    fn the_server_log_and_endpoint_sit_beside_the_address_file() {
        let addr = Path::new("/run/logs/base/broker.addr");
        assert_eq!(
            server_log_file(addr),
            Path::new("/run/logs/base/broker.server.log")
        );
        assert_eq!(
            endpoint_file(addr),
            Path::new("/run/logs/base/broker.endpoint")
        );
    }
}
