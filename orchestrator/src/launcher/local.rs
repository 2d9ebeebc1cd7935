//! The local launcher: child processes on this machine, each in its own
//! process group, each holding a pipe to the launcher on its stdin.
//!
//! Why a process group: Ctrl-C in a terminal signals the foreground group,
//! so it reaches only the orchestrator, which then stops the children in
//! order instead of all of them dying mid-request at once.
//!
//! Why the stdin pipe: the launcher holds its write end and never writes.
//! When the launcher's process ends for any reason (SIGKILL included) the
//! kernel closes that end, every child reads EOF and shuts down. That is the
//! orphan guarantee, without `prctl` or unsafe code. Rust creates the pipe
//! close-on-exec, so a later child never inherits an earlier child's pipe.

use std::{
    fs::{File, OpenOptions},
    io::{self, Write},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    time::Duration,
};

use futures::future::join_all;
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use tokio::{
    process::{Child, ChildStdin, Command},
    time::{Instant, sleep, sleep_until, timeout, timeout_at},
};

use tailmesh_services::serving::CONTROL_TOKEN_ENV;

use super::{ExitedChild, Killed, LaunchError, Launched, LogTail, ProcessSpec, health};

/// How long [`LocalLauncher::launch`] waits for a child to answer SERVING,
/// unless set with [`LocalLauncher::with_ready_timeout`].
pub(super) const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(15);

/// Pause between readiness probes: short, since a hop is usually ready in
/// milliseconds and every launch waits for it.
const PROBE_INTERVAL: Duration = Duration::from_millis(25);

/// Bound on one health check, so a child that accepts connections but never
/// answers is retried rather than waited on until the deadline.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The least time a service of `[hop.service]` gets to exit after SIGTERM,
/// even when the run stops without a grace period.
pub(super) const SERVICE_GRACE: Duration = Duration::from_secs(2);

/// How long to wait for a SIGKILLed child to be reaped before giving up on
/// it (a process in uninterruptible sleep can outlive SIGKILL for a while).
const REAP_TIMEOUT: Duration = Duration::from_secs(5);

/// Starts processes on this machine and owns every child it started until
/// it has reaped it: [`LocalLauncher::shutdown`] stops them gracefully, and
/// dropping the launcher kills whatever is left.
///
/// For each child it writes, in its log directory, `<name>.log` (stdout and
/// stderr, appended), `<name>.addr` (written by the child) and `<name>.pid`;
/// the address and pid files are removed when the child is reaped.
#[derive(Debug)]
pub struct LocalLauncher {
    log_dir: PathBuf,
    ready_timeout: Duration,
    children: Vec<Supervised>,
    /// The token of the children's Control services, when they serve one.
    control_token: Option<String>,
}

/// A running child and the write end of its stdin pipe.
#[derive(Debug)]
struct Supervised {
    launched: Launched,
    /// What it was started from, for [`LocalLauncher::kill`]'s restart.
    spec: ProcessSpec,
    child: Child,
    /// Never written; dropping it (or our death) tells the child to exit.
    _stdin: Option<ChildStdin>,
    addr_file: PathBuf,
    pid_file: PathBuf,
}

impl Supervised {
    fn reaped(self, status: ExitStatus, forced: bool) -> ExitedChild {
        remove_quietly(&self.addr_file);
        remove_quietly(&self.pid_file);
        ExitedChild {
            name: self.launched.name,
            addr: self.launched.addr,
            pid: self.launched.pid,
            status,
            forced,
        }
    }
}

/// How the wait for readiness ended.
enum Readiness {
    Ready(SocketAddr),
    Exited(io::Result<ExitStatus>),
    TimedOut,
}

impl LocalLauncher {
    /// A launcher that keeps its children's files in `log_dir` (created on
    /// the first launch).
    pub fn new(log_dir: PathBuf) -> Self {
        Self {
            log_dir,
            ready_timeout: DEFAULT_READY_TIMEOUT,
            children: Vec::new(),
            control_token: None,
        }
    }

    /// Gives every child a Control service (a fresh token in its
    /// environment), so its application-level faults can be set at
    /// runtime; it has no network fault agent (no namespace of its own).
    pub fn with_control(mut self) -> Self {
        self.control_token = Some(super::new_token());
        self
    }

    /// The token the children's Control services accept, if they have one.
    pub fn token(&self) -> Option<&str> {
        self.control_token.as_deref()
    }

    /// Sets how long [`LocalLauncher::launch`] waits for each child to
    /// answer SERVING.
    pub fn with_ready_timeout(mut self, ready_timeout: Duration) -> Self {
        self.ready_timeout = ready_timeout;
        self
    }

    /// Where the children's files go.
    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }

    /// The children started and not yet reaped, in launch order.
    pub fn running(&self) -> impl Iterator<Item = &Launched> {
        self.children.iter().map(|c| &c.launched)
    }

    /// Starts `spec` and waits until it answers gRPC health SERVING.
    ///
    /// The child runs `program args... --addr-file <log_dir>/<name>.addr
    /// --supervised` in its own process group, with stdout and stderr
    /// appended to `<log_dir>/<name>.log`. If it exits first, or does not
    /// answer SERVING within the ready timeout (it is then killed), the
    /// error names it, its address if known, and quotes its last log lines.
    /// Dropping the returned future mid-wait kills the child being started.
    pub async fn launch(&mut self, spec: ProcessSpec) -> Result<Launched, LaunchError> {
        let name = spec.name.clone();
        let kept_spec = spec.clone();
        check_name(&name)?;
        if self.children.iter().any(|c| c.launched.name == name) {
            return Err(LaunchError::InvalidName {
                name,
                reason: "a process with this name is already running",
            });
        }
        let files_error = |path: &Path| {
            let name = name.clone();
            let path = path.to_path_buf();
            move |source| LaunchError::Files { name, path, source }
        };
        std::fs::create_dir_all(&self.log_dir).map_err(files_error(&self.log_dir))?;
        let log_path = self.log_dir.join(format!("{name}.log"));
        let addr_file = self.log_dir.join(format!("{name}.addr"));
        let pid_file = self.log_dir.join(format!("{name}.pid"));
        // A stale address from an earlier run would send the probe to
        // whatever listens there now.
        match std::fs::remove_file(&addr_file) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(files_error(&addr_file)(e));
            }
            _ => {}
        }

        let (stdout, stderr, log_start) =
            open_log(&log_path, &spec).map_err(files_error(&log_path))?;

        let mut command = match &spec.service {
            None => {
                let mut command = Command::new(&spec.program);
                command
                    .args(&spec.args)
                    .arg("--addr-file")
                    .arg(&addr_file)
                    .arg("--supervised")
                    .envs(self.control_token.iter().map(|t| (CONTROL_TOKEN_ENV, t)))
                    .stdin(Stdio::piped());
                command
            }
            Some(service) => service_command(&spec, service),
        };
        command
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdout(stdout)
            .stderr(stderr)
            .process_group(0)
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|source| LaunchError::Spawn {
            name: name.clone(),
            program: spec.program.clone(),
            source,
        })?;
        let stdin = child.stdin.take();
        let Some(pid) = child.id() else {
            // Only a reaped child has no id, and nothing has reaped it yet.
            return Err(LaunchError::Wait {
                name,
                pid: 0,
                source: io::Error::other("the child has no process id right after spawn"),
            });
        };
        if let Err(e) = write_atomically(&pid_file, &format!("{pid}\n")) {
            let _ = child.start_kill();
            let _ = timeout(REAP_TIMEOUT, child.wait()).await;
            return Err(files_error(&pid_file)(e));
        }
        tracing::debug!(%name, pid, "started, waiting for it to answer health checks");

        let started = Instant::now();
        let deadline = started
            + match (&spec.service, spec.ready_timeout) {
                // A service's own ready_timeout is the bound, exactly.
                (Some(_), Some(timeout)) => timeout,
                (_, timeout) => timeout
                    .unwrap_or(self.ready_timeout)
                    .max(self.ready_timeout),
            };
        let mut addr = spec.service.as_ref().map(|s| s.addr);
        let mut last_problem = None;
        let readiness = {
            let probe = async {
                match addr {
                    Some(known) if spec.service.is_some() => {
                        wait_service(known, &mut last_problem).await
                    }
                    _ => wait_serving(&addr_file, &mut addr, &mut last_problem).await,
                }
            };
            tokio::select! {
                ready = probe => Readiness::Ready(ready),
                status = child.wait() => Readiness::Exited(status),
                () = sleep_until(deadline) => Readiness::TimedOut,
            }
        };

        let error = match readiness {
            Readiness::Ready(addr) => {
                let launched = Launched {
                    name,
                    addr,
                    pid,
                    log: log_path,
                };
                tracing::info!(name = %launched.name, %addr, pid, "ready");
                self.children.push(Supervised {
                    launched: launched.clone(),
                    spec: kept_spec,
                    child,
                    _stdin: stdin,
                    addr_file,
                    pid_file,
                });
                return Ok(launched);
            }
            Readiness::Exited(Ok(status)) => LaunchError::ExitedBeforeReady {
                name,
                pid,
                addr,
                status,
                log: LogTail::read(&log_path, log_start),
            },
            Readiness::Exited(Err(source)) => {
                let _ = child.start_kill();
                let _ = timeout(REAP_TIMEOUT, child.wait()).await;
                LaunchError::Wait { name, pid, source }
            }
            Readiness::TimedOut => {
                if spec.service.is_some() {
                    // A service's own children too (still unreaped: ours).
                    signal_group(&child, Signal::SIGKILL);
                }
                let _ = child.start_kill();
                // Reaped before reading the log, so the quote is complete.
                let _ = timeout(REAP_TIMEOUT, child.wait()).await;
                LaunchError::NotReady {
                    name,
                    pid,
                    addr,
                    waited: started.elapsed(),
                    last_problem,
                    log: LogTail::read(&log_path, log_start),
                }
            }
        };
        remove_quietly(&addr_file);
        remove_quietly(&pid_file);
        Err(error)
    }

    /// Reaps, without blocking, the children that have exited since they
    /// were launched, and reports each one once.
    pub fn exited(&mut self) -> Vec<ExitedChild> {
        let mut exited = Vec::new();
        let mut i = 0;
        while i < self.children.len() {
            match self.children[i].child.try_wait() {
                Ok(Some(status)) => {
                    let child = self.children.remove(i);
                    exited.push(child.reaped(status, false));
                }
                Ok(None) => i += 1,
                Err(e) => {
                    tracing::warn!(name = %self.children[i].launched.name, "cannot check whether it exited: {e}");
                    i += 1;
                }
            }
        }
        exited
    }

    /// SIGKILLs the child `name` by its process id (only a child this
    /// launcher started and has not reaped, so the id is still its), and
    /// reaps it. The child is not reported by [`LocalLauncher::exited`]:
    /// its death was asked for. [`LocalLauncher::relaunch`] starts it again.
    pub async fn kill(&mut self, name: &str) -> Result<Killed, LaunchError> {
        let Some(i) = self.children.iter().position(|c| c.launched.name == name) else {
            return Err(LaunchError::InvalidName {
                name: name.to_owned(),
                reason: "no process with this name is running",
            });
        };
        let mut supervised = self.children.remove(i);
        let pid = supervised.launched.pid;
        // `id()` is `Some` only while unreaped, so the pid is still ours.
        if let Some(raw) = supervised.child.id().and_then(|p| i32::try_from(p).ok())
            && let Err(e) = kill(Pid::from_raw(raw), Signal::SIGKILL)
        {
            tracing::debug!(%name, pid, "SIGKILL: {e}");
        }
        let status = match timeout(REAP_TIMEOUT, supervised.child.wait()).await {
            Ok(Ok(status)) => status,
            Ok(Err(source)) => {
                self.children.push(supervised);
                return Err(LaunchError::Wait {
                    name: name.to_owned(),
                    pid,
                    source,
                });
            }
            Err(_) => {
                self.children.push(supervised);
                return Err(LaunchError::Wait {
                    name: name.to_owned(),
                    pid,
                    source: io::Error::other(format!(
                        "not reaped {} after SIGKILL",
                        tailmesh_units::duration(REAP_TIMEOUT)
                    )),
                });
            }
        };
        let spec = supervised.spec.clone();
        Ok(Killed {
            exited: supervised.reaped(status, false),
            spec,
        })
    }

    /// Starts `killed` again from its spec, listening at the address it
    /// had (its callers know that address only).
    pub async fn relaunch(&mut self, killed: &Killed) -> Result<Launched, LaunchError> {
        self.launch(killed.spec_at_its_address()).await
    }

    /// Stops every child: SIGTERM to all (latest launched first, so callers
    /// stop before the services they call), up to `grace` for them to exit,
    /// SIGKILL for the rest, and reaps them. Returns every child reaped,
    /// including those that had already exited. Calling it again returns
    /// only what was launched since.
    ///
    /// The services of `[hop.service]` are stopped after every other child
    /// (the hops that call them finish their requests in flight first),
    /// with at least 2 s (`SERVICE_GRACE`) to exit, so they can flush their
    /// spans.
    pub async fn shutdown(&mut self, grace: Duration) -> Vec<ExitedChild> {
        let (services, others): (Vec<_>, Vec<_>) = self
            .children
            .drain(..)
            .partition(|c| c.spec.service.is_some());
        self.children = others;
        let mut reaped = self.stop_children(grace).await;
        let kept = std::mem::replace(&mut self.children, services);
        reaped.extend(self.stop_children(grace.max(SERVICE_GRACE)).await);
        self.children.extend(kept);
        reaped
    }

    /// [`LocalLauncher::shutdown`] of `self.children`.
    async fn stop_children(&mut self, grace: Duration) -> Vec<ExitedChild> {
        for supervised in self.children.iter().rev() {
            if supervised.spec.service.is_some() {
                // A service (a shell script, a runtime with workers) may
                // have children of its own, in its process group.
                signal_group(&supervised.child, Signal::SIGTERM);
                continue;
            }
            // `id()` is `Some` only while unreaped, so the pid is still ours.
            if let Some(pid) = supervised.child.id().and_then(|p| i32::try_from(p).ok())
                && let Err(e) = kill(Pid::from_raw(pid), Signal::SIGTERM)
            {
                tracing::debug!(name = %supervised.launched.name, "SIGTERM: {e}");
            }
        }
        let deadline = Instant::now() + grace;
        let graceful: Vec<_> = join_all(
            self.children
                .iter_mut()
                .map(|c| timeout_at(deadline, c.child.wait())),
        )
        .await
        .into_iter()
        .map(|waited| waited.ok().and_then(Result::ok))
        .collect();

        // (status, forced): who is still running gets SIGKILL, then a bounded
        // wait to be reaped.
        let mut outcomes: Vec<(Option<ExitStatus>, bool)> =
            graceful.into_iter().map(|status| (status, false)).collect();
        for (supervised, outcome) in self.children.iter_mut().zip(&mut outcomes) {
            if outcome.0.is_none() {
                tracing::warn!(
                    name = %supervised.launched.name,
                    pid = supervised.launched.pid,
                    "did not stop within {}, killing it",
                    tailmesh_units::duration(grace)
                );
                if supervised.spec.service.is_some() {
                    signal_group(&supervised.child, Signal::SIGKILL);
                }
                let _ = supervised.child.start_kill();
                outcome.1 = true;
            }
        }
        let kill_deadline = Instant::now() + REAP_TIMEOUT;
        for (supervised, outcome) in self.children.iter_mut().zip(&mut outcomes) {
            if outcome.1 {
                outcome.0 = timeout_at(kill_deadline, supervised.child.wait())
                    .await
                    .ok()
                    .and_then(Result::ok);
            }
        }

        let mut reaped = Vec::new();
        let mut kept = Vec::new();
        for (supervised, (status, forced)) in self.children.drain(..).zip(outcomes) {
            match status {
                Some(status) => reaped.push(supervised.reaped(status, forced)),
                None => {
                    tracing::error!(
                        name = %supervised.launched.name,
                        pid = supervised.launched.pid,
                        "still not reaped {} after SIGKILL",
                        tailmesh_units::duration(REAP_TIMEOUT)
                    );
                    kept.push(supervised);
                }
            }
        }
        // Whatever could not be reaped stays owned, so Drop tries again.
        self.children = kept;
        reaped
    }
}

impl Drop for LocalLauncher {
    /// Best effort and synchronous, for paths that never reach
    /// [`LocalLauncher::shutdown`] (an error, a panic): SIGKILL every child
    /// and reap it, waiting a bounded time.
    fn drop(&mut self) {
        if self.children.is_empty() {
            return;
        }
        for supervised in &mut self.children {
            if supervised.spec.service.is_some() {
                signal_group(&supervised.child, Signal::SIGKILL);
            }
            let _ = supervised.child.start_kill();
        }
        let give_up = std::time::Instant::now() + REAP_TIMEOUT;
        for supervised in &mut self.children {
            loop {
                match supervised.child.try_wait() {
                    Ok(None) if std::time::Instant::now() < give_up => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    _ => break,
                }
            }
            remove_quietly(&supervised.addr_file);
            remove_quietly(&supervised.pid_file);
        }
    }
}

/// Waits until the address file names an address that answers SERVING,
/// leaving in `addr` and `last_problem` what it learned on the way, for the
/// error message if it never gets there.
async fn wait_serving(
    addr_file: &Path,
    addr: &mut Option<SocketAddr>,
    last_problem: &mut Option<String>,
) -> SocketAddr {
    loop {
        if addr.is_none() {
            match tokio::fs::read_to_string(addr_file).await {
                Ok(text) => match text.trim().parse() {
                    Ok(parsed) => *addr = Some(parsed),
                    Err(_) => {
                        *last_problem = Some(format!(
                            "its address file {} holds {:?}, not an address",
                            addr_file.display(),
                            text.trim()
                        ));
                    }
                },
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    *last_problem = Some(format!("cannot read {}: {e}", addr_file.display()));
                }
            }
        }
        if let Some(addr) = *addr {
            match health::check(&addr.into(), PROBE_TIMEOUT, health::Readiness::PROCESS).await {
                Ok(()) => return addr,
                Err(e) => *last_problem = Some(e.to_string()),
            }
        }
        sleep(PROBE_INTERVAL).await;
    }
}

/// Sends `signal` to the process group `child` leads (every child is
/// started in a group of its own), while `child` is unreaped: its id, and
/// so its group's, cannot have been reused.
fn signal_group(child: &Child, signal: Signal) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok())
        && let Err(e) = nix::sys::signal::killpg(Pid::from_raw(pid), signal)
    {
        tracing::debug!(pid, "{signal} to its process group: {e}");
    }
}

/// Waits until the service at `addr` is ready ([`health::check`] with
/// [`health::Readiness::SERVICE`]), leaving in `last_problem` the last
/// reason it was not.
async fn wait_service(addr: SocketAddr, last_problem: &mut Option<String>) -> SocketAddr {
    loop {
        match health::check(&addr.into(), PROBE_TIMEOUT, health::Readiness::SERVICE).await {
            Ok(()) => return addr,
            Err(e) => *last_problem = Some(e.to_string()),
        }
        sleep(PROBE_INTERVAL).await;
    }
}

/// The command that starts the service `spec`: under `setpriv --pdeathsig
/// KILL` where that works, so the service dies with the launcher even when
/// the launcher is SIGKILLed (a service does not watch its stdin as
/// tailmesh's processes do); in the service's folder, with an empty stdin.
fn service_command(spec: &ProcessSpec, service: &super::ServiceProcess) -> Command {
    let mut command = match pdeathsig_wrapper() {
        Some(setpriv) => {
            let mut command = Command::new(setpriv);
            command
                .args(["--pdeathsig", "KILL", "--"])
                .arg(&spec.program);
            command
        }
        None => Command::new(&spec.program),
    };
    command.args(&spec.args).stdin(Stdio::null());
    if !service.dir.as_os_str().is_empty() {
        command.current_dir(&service.dir);
    }
    command
}

/// util-linux's `setpriv`, if it is installed and knows `--pdeathsig`;
/// found once.
fn pdeathsig_wrapper() -> Option<&'static Path> {
    static SETPRIV: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    SETPRIV
        .get_or_init(|| {
            let setpriv = tailmesh_netfault::tool::find_in_path("setpriv")?;
            let works = std::process::Command::new(&setpriv)
                .args(["--pdeathsig", "KILL", "--", "true"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !works {
                tracing::warn!(
                    "{} has no --pdeathsig: services of [hop.service] outlive a killed \
                     orchestrator",
                    setpriv.display()
                );
            }
            works.then_some(setpriv)
        })
        .as_deref()
}

/// Names become file names: keep them plain.
fn check_name(name: &str) -> Result<(), LaunchError> {
    let reason = if name.is_empty() {
        Some("a process name cannot be empty")
    } else if name.starts_with('.') {
        Some("a process name cannot start with '.'")
    } else if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        Some("a process name may hold only ASCII letters, digits, '-', '_' and '.'")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(LaunchError::InvalidName {
            name: name.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

/// Opens the log for appending, writes a header for this launch, and
/// returns the child's stdout and stderr handles and where this launch's
/// output starts.
fn open_log(path: &Path, spec: &ProcessSpec) -> io::Result<(File, File, u64)> {
    let mut log = OpenOptions::new().create(true).append(true).open(path)?;
    let now = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let mut header = format!(
        "--- {now} launching {}: {}",
        spec.name,
        spec.program.display()
    );
    for arg in &spec.args {
        header.push(' ');
        header.push_str(&arg.to_string_lossy());
    }
    header.push('\n');
    log.write_all(header.as_bytes())?;
    let start = log.metadata()?.len();
    let stderr = log.try_clone()?;
    Ok((log, stderr, start))
}

/// Through a temporary file and a rename, as the child writes its address.
fn write_atomically(path: &Path, contents: &str) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)
}

fn remove_quietly(path: &Path) {
    if let Err(e) = std::fs::remove_file(path)
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::debug!("cannot remove {}: {e}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_plain_file_names() {
        for good in ["hop-b-1", "broker", "hop_a.0"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "../etc", "a/b", "a b", "hé"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
