//! Network faults of a replica, with real packet drops and delays, applied
//! where its fault agent acts ([`Place`]):
//!
//! - a member namespace of the netns launcher, from the host namespace:
//!   commands run through `ip netns exec <ns>`, rules match the member's
//!   interface (`tmeth0`), and netem can shape both ends of its veth;
//! - the agent's own namespace (a container or a pod with CAP_NET_ADMIN):
//!   commands run directly and rules match the given interface (`eth0`,
//!   see [`container_iface`]). There is no veth peer to shape, and netem
//!   on the interface alone would delay and drop outgoing packets only, so
//!   this place always uses the nftables and NFQUEUE mechanisms, which
//!   cover both directions.
//!
//! Mechanisms, picked at runtime per fault:
//!
//! - `netem` (member namespaces only): `tc qdisc replace ... root netem
//!   delay D J loss P%` on the replica's interface (its outgoing packets)
//!   and on its bridge port in the hub namespace (its incoming packets),
//!   when the kernel has `sch_netem` (probed by adding a netem qdisc once
//!   per run).
//! - `nftables`: without netem, loss is an nftables rule in the replica's
//!   namespace, in table `inet tailmesh_<run id>` (`inet tailmesh_agent`
//!   in the agent's own namespace: one agent per namespace): `numgen
//!   random mod 10000 < N drop` on the input and output hooks, with
//!   counters.
//! - `nfqueue_delay_line`: without netem, delay and jitter go through
//!   `tailmesh delay-line` ([`crate::delayline`]), started inside the
//!   replica's namespace, fed by iptables `-j NFQUEUE --queue-bypass`
//!   rules in the mangle table (PREROUTING from and OUTPUT to the
//!   replica's interface).
//!
//! Per-packet semantics: loss and delay apply to every packet, in each
//! direction, independently. A request and its reply cross the faulty
//! replica's link twice (in and out), so a delay D adds about 2·D to a
//! call to that replica, and each lost packet costs a TCP retransmission
//! (at least the kernel's minimum RTO, 200 ms, when it is not recovered by
//! fast retransmit).
//!
//! Every command runs without a shell, with arguments built here from
//! validated values.

use std::{
    ffi::{OsStr, OsString},
    io::{BufRead, BufReader},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use serde::{Deserialize, Serialize};

use crate::launcher::netns::{AgentEnv, MEMBER_IF, Member, NetnsError, run_tool};
use crate::scenario::NetFault;

/// Finest loss step of the nftables rule: 1/10000.
const NFT_SCALE: u32 = 10_000;

/// How a fault was applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mechanism {
    /// `tc netem` on both ends of the replica's veth.
    Netem,
    /// An nftables `numgen` drop rule inside the replica's namespace.
    NftablesNumgen,
    /// `tailmesh delay-line` on NFQUEUE inside the replica's namespace.
    NfqueueDelayLine,
}

/// The nftables table of the agent in its own namespace.
pub const OWN_NFT_TABLE: &str = "tailmesh_agent";

/// The interface a container's agent shapes when the namespace has no
/// default route: Docker's and Kubernetes' name for it.
pub const DEFAULT_CONTAINER_IF: &str = "eth0";

/// Where a fault agent applies faults.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Place {
    /// A member namespace of the netns launcher, from the host namespace:
    /// commands run through `ip netns exec`, rules match [`MEMBER_IF`],
    /// netem can shape both ends of the member's veth.
    Member {
        /// The member's namespace and veth.
        member: Member,
        /// The hub namespace (where the other end of the veth is).
        hub: String,
        /// The run id (names the nftables table).
        run_id: String,
    },
    /// The agent's own namespace (a container or a pod): commands run
    /// directly, rules match `iface`; loss and delay always use nftables
    /// and the NFQUEUE delay line, which cover both directions.
    Own {
        /// The interface to shape (see [`container_iface`]).
        iface: String,
    },
}

impl Place {
    /// The interface the rules match.
    pub fn iface(&self) -> &str {
        match self {
            Self::Member { .. } => MEMBER_IF,
            Self::Own { iface } => iface,
        }
    }

    /// The nftables table of the loss rule: one per run in member
    /// namespaces, a fixed one in the agent's own namespace.
    pub fn nft_table(&self) -> String {
        match self {
            Self::Member { run_id, .. } => nft_table(run_id),
            Self::Own { .. } => OWN_NFT_TABLE.to_owned(),
        }
    }

    /// The command that runs `program args...` at this place, as
    /// `(program, arguments)`: `ip netns exec <ns> program args...` in a
    /// member namespace, `program args...` in the agent's own.
    pub fn command_line<P, I, S>(&self, program: P, args: I) -> (OsString, Vec<OsString>)
    where
        P: AsRef<OsStr>,
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args = args.into_iter().map(|a| a.as_ref().to_owned());
        match self {
            Self::Member { member, .. } => {
                let mut full: Vec<OsString> = vec![
                    "netns".into(),
                    "exec".into(),
                    member.ns.clone().into(),
                    program.as_ref().to_owned(),
                ];
                full.extend(args);
                ("ip".into(), full)
            }
            Self::Own { .. } => (program.as_ref().to_owned(), args.collect()),
        }
    }

    /// Runs `tool args...` here and returns its stdout.
    fn run<S: AsRef<OsStr>>(&self, tool: &str, args: Vec<S>) -> Result<String, NetnsError> {
        let (program, args) = self.command_line(tool, args);
        run_tool(program, args)
    }

    /// Checks what came from outside (the agent's environment): an
    /// interface name is one the kernel accepts and that nftables reads as
    /// a plain word.
    pub fn validate(&self) -> Result<(), FaultError> {
        match self {
            Self::Own { iface } if !valid_iface(iface) => Err(FaultError::BadInterface {
                iface: iface.clone(),
            }),
            _ => Ok(()),
        }
    }
}

/// Whether `name` is an interface name usable in the rules: 1 to 15
/// letters, digits, `.`, `_` or `-`, not starting with `-`.
pub fn valid_iface(name: &str) -> bool {
    (1..=15).contains(&name.len())
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The interface of this namespace's default IPv4 route (read from
/// `/proc/net/route`), or [`DEFAULT_CONTAINER_IF`] without one: the
/// interface a container's agent shapes, whatever the runtime named it.
pub fn container_iface() -> String {
    std::fs::read_to_string("/proc/net/route")
        .ok()
        .and_then(|table| default_route_iface(&table))
        .unwrap_or_else(|| DEFAULT_CONTAINER_IF.to_owned())
}

/// The interface of the default route (destination and mask 0, up) with
/// the lowest metric in a `/proc/net/route` listing, if any.
pub fn default_route_iface(table: &str) -> Option<String> {
    const RTF_UP: u32 = 0x1;
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            // Iface Destination Gateway Flags RefCnt Use Metric Mask ...
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [iface, destination, _, flags, _, _, metric, mask, ..] = fields.as_slice() else {
                return None;
            };
            let up = u32::from_str_radix(flags, 16).ok()? & RTF_UP != 0;
            let default = u32::from_str_radix(destination, 16).ok()? == 0
                && u32::from_str_radix(mask, 16).ok()? == 0;
            let metric: u32 = metric.parse().ok()?;
            (up && default).then_some((metric, *iface))
        })
        .min_by_key(|(metric, _)| *metric)
        .map(|(_, iface)| iface.to_owned())
}

/// The NFQUEUE number of the delay line (queues are per namespace).
pub const DELAY_QUEUE: u16 = 7;

/// What [`apply`] did, for [`clear`].
#[derive(Debug)]
pub struct Applied {
    /// The mechanisms, loss first.
    pub mechanisms: Vec<Mechanism>,
    /// The delay line process, if one was started.
    pub delay_line: Option<Child>,
}

/// One fault as recorded in summary.json.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FaultRecord {
    /// The hop.
    pub hop: String,
    /// The replica, 0-based.
    pub replica: u32,
    /// Its namespace.
    pub namespace: String,
    /// Drop probability per packet per direction.
    pub loss: f64,
    /// Added delay per packet per direction, in microseconds.
    pub delay_us: u64,
    /// Jitter of that delay, in microseconds.
    pub jitter_us: u64,
    /// When it started, from the start of the load (ms).
    pub start_ms: u64,
    /// How long it lasted (ms); absent: until the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// How it was applied: one mechanism (netem), or the loss and the
    /// delay mechanisms of the fallback.
    pub mechanisms: Vec<Mechanism>,
    /// Packets the drop rule saw and dropped (nftables only), read when the
    /// fault was cleared: `[seen, dropped]` over both directions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packets: Option<[u64; 2]>,
}

/// A fault that cannot be applied.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    /// Delay or jitter on a kernel without netem and without iptables.
    #[error(
        "hop \"{hop}\" replica {replica}: delay and jitter need the kernel's sch_netem, which \
         this kernel lacks, or the NFQUEUE delay line, which needs the iptables command \
         (Debian package iptables)"
    )]
    NoDelayMechanism {
        /// The hop.
        hop: String,
        /// The replica.
        replica: u32,
    },
    /// An interface name the rules cannot use.
    #[error(
        "fault agent: interface name {iface:?}: expected 1 to 15 letters, digits, '.', '_' or \
         '-'"
    )]
    BadInterface {
        /// The name given.
        iface: String,
    },
    /// A command failed.
    #[error(transparent)]
    Command(#[from] NetnsError),
}

/// The nftables table of run `id`.
pub fn nft_table(id: &str) -> String {
    format!("tailmesh_{id}")
}

/// `tc` arguments that put `fault` on `dev` of namespace `ns` (netem).
pub fn netem_args(ns: &str, dev: &str, fault: &NetFault) -> Vec<String> {
    let mut args: Vec<String> = ["-n", ns, "qdisc", "replace", "dev", dev, "root", "netem"]
        .map(str::to_owned)
        .to_vec();
    if !fault.delay.is_zero() {
        args.push("delay".into());
        args.push(format!("{}us", fault.delay.as_micros()));
        if !fault.jitter.is_zero() {
            args.push(format!("{}us", fault.jitter.as_micros()));
        }
    }
    if fault.loss > 0.0 {
        args.push("loss".into());
        // tc reads a percentage with up to 7 decimals: 0.01 -> "1%".
        args.push(format!("{}%", trim_float(fault.loss * 100.0)));
    }
    args
}

fn trim_float(x: f64) -> String {
    let s = format!("{x:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_owned()
}

/// The drop threshold out of [`NFT_SCALE`] for a loss probability.
pub fn nft_threshold(loss: f64) -> u32 {
    (loss.clamp(0.0, 1.0) * f64::from(NFT_SCALE)).round() as u32
}

/// `nft` argument lists (one command each) that create table `table` in a
/// namespace with a random drop of `loss` on input from and output to
/// interface `iface`.
pub fn nft_loss_commands(table: &str, iface: &str, loss: f64) -> Vec<Vec<String>> {
    let threshold = nft_threshold(loss).to_string();
    let mut commands = vec![vec![
        "add".into(),
        "table".into(),
        "inet".into(),
        table.into(),
    ]];
    for (chain, hook) in [("tm_in", "input"), ("tm_out", "output")] {
        commands.push(
            [
                "add", "chain", "inet", table, chain, "{", "type", "filter", "hook", hook,
                "priority", "0", ";", "}",
            ]
            .map(str::to_owned)
            .to_vec(),
        );
        let iface_key = if hook == "input" {
            "iifname"
        } else {
            "oifname"
        };
        // First rule counts every packet on the interface, the second drops.
        commands.push(
            [
                "add", "rule", "inet", table, chain, "meta", iface_key, iface, "counter",
            ]
            .map(str::to_owned)
            .to_vec(),
        );
        commands.push(
            [
                "add",
                "rule",
                "inet",
                table,
                chain,
                "meta",
                iface_key,
                iface,
                "numgen",
                "random",
                "mod",
                &NFT_SCALE.to_string(),
                "<",
                &threshold,
                "counter",
                "drop",
            ]
            .map(str::to_owned)
            .to_vec(),
        );
    }
    commands
}

/// Whether the kernel has netem: adds and removes a netem qdisc on the
/// hub side of the host's veth (`dev` in namespace `hub`).
pub fn netem_available(hub: &str, dev: &str) -> bool {
    let probe = run_tool(
        "tc",
        [
            "-n", hub, "qdisc", "add", "dev", dev, "root", "netem", "delay", "0us",
        ],
    );
    if probe.is_ok() {
        let _ = run_tool("tc", ["-n", hub, "qdisc", "del", "dev", dev, "root"]);
        true
    } else {
        false
    }
}

/// Checks up front that `fault` can be applied with what the kernel has.
pub fn check(
    hop: &str,
    replica: u32,
    fault: &NetFault,
    netem: bool,
    iptables: bool,
) -> Result<(), FaultError> {
    if !netem && !iptables && !fault.delay.is_zero() {
        return Err(FaultError::NoDelayMechanism {
            hop: hop.to_owned(),
            replica,
        });
    }
    Ok(())
}

/// `iptables` arguments adding (`-A`) or deleting (`-D`) the NFQUEUE rules
/// of the delay line on interface `iface`, one list per direction.
pub fn nfqueue_rules(iface: &str, op: &str) -> Vec<Vec<String>> {
    let queue = DELAY_QUEUE.to_string();
    [("PREROUTING", "-i"), ("OUTPUT", "-o")]
        .into_iter()
        .map(|(chain, dir)| {
            [
                "-w",
                "-t",
                "mangle",
                op,
                chain,
                dir,
                iface,
                "-j",
                "NFQUEUE",
                "--queue-num",
                &queue,
                "--queue-bypass",
            ]
            .map(str::to_owned)
            .to_vec()
        })
        .collect()
}

/// How to start the delay line: the tailmesh executable and a log file.
#[derive(Clone, Debug)]
pub struct DelayLineSpawn<'a> {
    /// `tailmesh` itself.
    pub exe: &'a Path,
    /// Where its output goes.
    pub log: &'a Path,
    /// Its seed.
    pub seed: u64,
}

/// The arguments of `tailmesh delay-line` for `fault`.
pub fn delay_line_args(fault: &NetFault, seed: u64) -> Vec<String> {
    vec![
        "delay-line".into(),
        "--queue".into(),
        DELAY_QUEUE.to_string(),
        "--delay".into(),
        format!("{}us", fault.delay.as_micros()),
        "--jitter".into(),
        format!("{}us", fault.jitter.as_micros()),
        "--seed".into(),
        seed.to_string(),
    ]
}

/// Applies `fault` at `place`, with netem when `netem` (the kernel has it)
/// and the place has both ends of a veth to shape. On error, what was
/// applied is removed.
pub fn apply(
    place: &Place,
    fault: &NetFault,
    netem: bool,
    spawn: &DelayLineSpawn<'_>,
) -> Result<Applied, NetnsError> {
    if netem && let Place::Member { member, hub, .. } = place {
        run_tool("tc", netem_args(&member.ns, MEMBER_IF, fault))?;
        if let Err(e) = run_tool("tc", netem_args(hub, &member.hub_port, fault)) {
            let _ = run_tool(
                "tc",
                ["-n", &member.ns, "qdisc", "del", "dev", MEMBER_IF, "root"],
            );
            return Err(e);
        }
        return Ok(Applied {
            mechanisms: vec![Mechanism::Netem],
            delay_line: None,
        });
    }
    let mut applied = Applied {
        mechanisms: Vec::new(),
        delay_line: None,
    };
    if fault.loss > 0.0 {
        applied.mechanisms.push(Mechanism::NftablesNumgen);
        for args in nft_loss_commands(&place.nft_table(), place.iface(), fault.loss) {
            if let Err(e) = place.run("nft", args) {
                clear(place, applied);
                return Err(e);
            }
        }
    }
    if !fault.delay.is_zero() {
        applied.mechanisms.push(Mechanism::NfqueueDelayLine);
        match start_delay_line(place, fault, spawn) {
            Ok(child) => applied.delay_line = Some(child),
            Err(e) => {
                clear(place, applied);
                return Err(e);
            }
        }
        for args in nfqueue_rules(place.iface(), "-A") {
            if let Err(e) = place.run("iptables", args) {
                clear(place, applied);
                return Err(e);
            }
        }
    }
    Ok(applied)
}

/// Starts `tailmesh delay-line` at `place` and waits for its `ready` line
/// (it has bound the queue).
fn start_delay_line(
    place: &Place,
    fault: &NetFault,
    spawn: &DelayLineSpawn<'_>,
) -> Result<Child, NetnsError> {
    let (program, args) = place.command_line(spawn.exe, delay_line_args(fault, spawn.seed));
    let failed = |message: String| NetnsError::Command {
        command: format!(
            "{} {}",
            program.to_string_lossy(),
            args.iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" ")
        ),
        message,
    };
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(spawn.log)
        .map_err(|e| failed(format!("{}: {e}", spawn.log.display())))?;
    let mut child = Command::new(&program)
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .process_group(0)
        .spawn()
        .map_err(|e| failed(e.to_string()))?;
    let mut line = String::new();
    let ready = child
        .stdout
        .take()
        .map(|out| BufReader::new(out).read_line(&mut line));
    if !matches!(ready, Some(Ok(n)) if n > 0 && line.trim() == "ready") {
        let _ = child.kill();
        let _ = child.wait();
        return Err(failed(format!(
            "it did not start; see {}",
            spawn.log.display()
        )));
    }
    Ok(child)
}

/// Reads `[seen, dropped]` of the nftables rules at `place`.
pub fn nft_counters(place: &Place) -> Option<[u64; 2]> {
    let out = place
        .run("nft", vec!["list", "table", "inet", &place.nft_table()])
        .ok()?;
    Some(parse_counters(&out))
}

/// Sums `counter packets N` of counting rules (no `drop`) and drop rules.
pub fn parse_counters(listing: &str) -> [u64; 2] {
    let mut seen = 0;
    let mut dropped = 0;
    for line in listing.lines() {
        let Some(rest) = line.split("counter packets ").nth(1) else {
            continue;
        };
        let n: u64 = rest
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        if line.trim_end().ends_with("drop") {
            dropped += n;
        } else {
            seen += n;
        }
    }
    [seen, dropped]
}

/// Removes what [`apply`] added (errors ignored: a member namespace is
/// removed at the end of the run anyway, and the agent's own namespace is
/// swept by [`remove_leftovers`]); returns the loss rule's counters.
pub fn clear(place: &Place, applied: Applied) -> Option<[u64; 2]> {
    let mut counters = None;
    for mechanism in &applied.mechanisms {
        match mechanism {
            Mechanism::Netem => {
                if let Place::Member { member, hub, .. } = place {
                    let _ = run_tool(
                        "tc",
                        ["-n", &member.ns, "qdisc", "del", "dev", MEMBER_IF, "root"],
                    );
                    let _ = run_tool(
                        "tc",
                        ["-n", hub, "qdisc", "del", "dev", &member.hub_port, "root"],
                    );
                }
            }
            Mechanism::NftablesNumgen => {
                counters = nft_counters(place);
                let _ = place.run("nft", vec!["delete", "table", "inet", &place.nft_table()]);
            }
            Mechanism::NfqueueDelayLine => {
                for args in nfqueue_rules(place.iface(), "-D") {
                    let _ = place.run("iptables", args);
                }
            }
        }
    }
    if let Some(mut child) = applied.delay_line {
        // EOF on its stdin: it accepts what it holds and exits.
        drop(child.stdin.take());
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        loop {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if std::time::Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }
    counters
}

/// Most copies of one NFQUEUE rule [`remove_leftovers`] deletes.
const MAX_LEFTOVER_RULES: usize = 16;

/// Removes what an earlier agent in the agent's own namespace may have
/// left (it was killed before clearing): the [`OWN_NFT_TABLE`] table and
/// the delay line's NFQUEUE rules. Nothing to do in a member namespace,
/// which is new for every run. Errors mean there was nothing to remove.
pub fn remove_leftovers(place: &Place) {
    if let Place::Own { .. } = place {
        let _ = place.run("nft", vec!["delete", "table", "inet", OWN_NFT_TABLE]);
        for args in nfqueue_rules(place.iface(), "-D") {
            // `-D` removes one copy per call; bounded.
            for _ in 0..MAX_LEFTOVER_RULES {
                if place.run("iptables", args.clone()).is_err() {
                    break;
                }
            }
        }
    }
}

/// The fault agent's backend: applies faults at its [`Place`] with the
/// mechanisms above (netem probed once, in member namespaces only).
#[derive(Debug)]
pub struct NetBackend {
    agent: AgentEnv,
    exe: PathBuf,
    seed: u64,
    netem: bool,
    applied: std::sync::Mutex<Option<Applied>>,
}

impl NetBackend {
    /// A backend for the agent described by `agent`; `exe` is `tailmesh`
    /// itself (for the delay line), `seed` the delay line's. In the
    /// agent's own namespace it first removes an earlier agent's leftovers.
    pub fn new(agent: AgentEnv, exe: PathBuf, seed: u64) -> Result<Self, FaultError> {
        agent.place.validate()?;
        let netem = match &agent.place {
            Place::Member { hub, run_id, .. } => netem_available(hub, &format!("tm{run_id}u")),
            Place::Own { .. } => {
                remove_leftovers(&agent.place);
                false
            }
        };
        Ok(Self {
            agent,
            exe,
            seed,
            netem,
            applied: std::sync::Mutex::new(None),
        })
    }

    /// A backend for an agent inside its own namespace (a container or a
    /// pod with CAP_NET_ADMIN) shaping interface `iface` (see
    /// [`container_iface`]); the delay line writes to `log`.
    pub fn own(iface: String, log: PathBuf, exe: PathBuf, seed: u64) -> Result<Self, FaultError> {
        Self::new(
            AgentEnv {
                place: Place::Own { iface },
                log,
            },
            exe,
            seed,
        )
    }

    /// Where it applies faults.
    pub fn place(&self) -> &Place {
        &self.agent.place
    }

    fn take(&self) -> Option<Applied> {
        self.applied
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

impl Drop for NetBackend {
    /// In its own namespace the agent removes its fault when the hop stops
    /// (nobody deletes a container's namespace between two runs of its
    /// hop); member namespaces are removed with the run.
    fn drop(&mut self) {
        if let Place::Own { .. } = self.agent.place
            && let Some(applied) = self.take()
        {
            clear(&self.agent.place, applied);
        }
    }
}

fn names(mechanisms: &[Mechanism]) -> Vec<String> {
    mechanisms
        .iter()
        .map(|m| match m {
            Mechanism::Netem => "netem",
            Mechanism::NftablesNumgen => "nftables_numgen",
            Mechanism::NfqueueDelayLine => "nfqueue_delay_line",
        })
        .map(str::to_owned)
        .collect()
}

impl tailmesh_services::control::FaultBackend for NetBackend {
    fn apply(
        &self,
        spec: &tailmesh_services::control::FaultSpec,
    ) -> Result<tailmesh_services::control::Applied, String> {
        if let Some(previous) = self.take() {
            clear(&self.agent.place, previous);
        }
        let fault = NetFault {
            loss: spec.loss,
            delay: spec.delay,
            jitter: spec.jitter,
            start: Duration::ZERO,
            duration: None,
        };
        let spawn = DelayLineSpawn {
            exe: &self.exe,
            log: &self.agent.log,
            seed: self.seed,
        };
        let applied =
            apply(&self.agent.place, &fault, self.netem, &spawn).map_err(|e| e.to_string())?;
        let mechanisms = names(&applied.mechanisms);
        *self
            .applied
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(applied);
        Ok(tailmesh_services::control::Applied {
            mechanisms,
            packets: None,
        })
    }

    fn clear(&self) -> Result<tailmesh_services::control::Applied, String> {
        let Some(applied) = self.take() else {
            return Ok(tailmesh_services::control::Applied::default());
        };
        let mechanisms = names(&applied.mechanisms);
        let packets = clear(&self.agent.place, applied);
        Ok(tailmesh_services::control::Applied {
            mechanisms,
            packets,
        })
    }
}

/// The mechanism of a name the agent reported.
pub fn mechanism_of(name: &str) -> Option<Mechanism> {
    match name {
        "netem" => Some(Mechanism::Netem),
        "nftables_numgen" => Some(Mechanism::NftablesNumgen),
        "nfqueue_delay_line" => Some(Mechanism::NfqueueDelayLine),
        _ => None,
    }
}

/// Milliseconds of a duration, for records.
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(loss: f64, delay_us: u64, jitter_us: u64) -> NetFault {
        NetFault {
            loss,
            delay: Duration::from_micros(delay_us),
            jitter: Duration::from_micros(jitter_us),
            start: Duration::ZERO,
            duration: None,
        }
    }

    #[test]
    fn netem_commands_carry_delay_jitter_and_loss() {
        assert_eq!(
            netem_args("tmabc123m0", "tmeth0", &fault(0.01, 2000, 500)).join(" "),
            "-n tmabc123m0 qdisc replace dev tmeth0 root netem delay 2000us 500us loss 1%"
        );
        assert_eq!(
            netem_args("h", "p0", &fault(0.0, 10_000, 0)).join(" "),
            "-n h qdisc replace dev p0 root netem delay 10000us"
        );
        assert_eq!(
            netem_args("h", "p0", &fault(0.0005, 0, 0)).join(" "),
            "-n h qdisc replace dev p0 root netem loss 0.05%"
        );
    }

    #[test]
    fn nft_rules_drop_the_right_share_on_both_hooks() {
        assert_eq!(nft_threshold(0.2), 2000);
        assert_eq!(nft_threshold(0.0001), 1);
        assert_eq!(nft_threshold(1.0), 10_000);
        assert_eq!(nft_threshold(0.0), 0);
        let commands = nft_loss_commands("tailmesh_abc123", MEMBER_IF, 0.05);
        assert_eq!(commands.len(), 7);
        assert_eq!(commands[0].join(" "), "add table inet tailmesh_abc123");
        assert_eq!(
            commands[1].join(" "),
            "add chain inet tailmesh_abc123 tm_in { type filter hook input priority 0 ; }"
        );
        assert_eq!(
            commands[3].join(" "),
            "add rule inet tailmesh_abc123 tm_in meta iifname tmeth0 numgen random mod 10000 \
             < 500 counter drop"
        );
        assert_eq!(
            commands[6].join(" "),
            "add rule inet tailmesh_abc123 tm_out meta oifname tmeth0 numgen random mod 10000 \
             < 500 counter drop"
        );
    }

    #[test]
    fn counters_are_split_into_seen_and_dropped() {
        let listing = "table inet tailmesh_x {\n chain tm_in {\n  type filter hook input priority filter; policy accept;\n  iifname \"tmeth0\" counter packets 100 bytes 9000\n  iifname \"tmeth0\" numgen random mod 10000 < 2000 counter packets 21 bytes 10 drop\n }\n chain tm_out {\n  oifname \"tmeth0\" counter packets 50 bytes 1\n  oifname \"tmeth0\" numgen random mod 10000 < 2000 counter packets 9 bytes 1 drop\n }\n}\n";
        assert_eq!(parse_counters(listing), [150, 30]);
    }

    #[test]
    fn delay_needs_netem_or_iptables_and_loss_needs_neither() {
        assert!(check("b", 1, &fault(0.1, 0, 0), false, false).is_ok());
        let e = check("b", 1, &fault(0.0, 1000, 0), false, false).expect_err("delay needs a way");
        assert!(e.to_string().contains("hop \"b\" replica 1"), "{e}");
        assert!(check("b", 1, &fault(0.0, 1000, 0), true, false).is_ok());
        assert!(check("b", 1, &fault(0.0, 1000, 0), false, true).is_ok());
    }

    #[test]
    fn nfqueue_rules_cover_both_directions_and_bypass_without_a_reader() {
        let rules = nfqueue_rules(MEMBER_IF, "-A");
        assert_eq!(
            rules[0].join(" "),
            "-w -t mangle -A PREROUTING -i tmeth0 -j NFQUEUE --queue-num 7 --queue-bypass"
        );
        assert_eq!(
            rules[1].join(" "),
            "-w -t mangle -A OUTPUT -o tmeth0 -j NFQUEUE --queue-num 7 --queue-bypass"
        );
        assert_eq!(nfqueue_rules(MEMBER_IF, "-D")[1][3], "-D");
    }

    fn own() -> Place {
        Place::Own {
            iface: "eth0".to_owned(),
        }
    }

    fn member() -> Place {
        Place::Member {
            member: Member {
                name: "hop-b-1".to_owned(),
                ns: "tmabc123m1".to_owned(),
                addr: std::net::Ipv4Addr::new(10, 200, 3, 2),
                hub_port: "tmabc123p1".to_owned(),
            },
            hub: "tmabc123hub".to_owned(),
            run_id: "abc123".to_owned(),
        }
    }

    /// A command line as one string, for comparisons.
    fn line((program, args): (OsString, Vec<OsString>)) -> String {
        std::iter::once(program)
            .chain(args)
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn commands_run_through_ip_netns_exec_in_a_member_and_directly_in_the_own_namespace() {
        let args = ["list", "table", "inet", "t"];
        assert_eq!(
            line(member().command_line("nft", args)),
            "ip netns exec tmabc123m1 nft list table inet t"
        );
        assert_eq!(
            line(own().command_line("nft", args)),
            "nft list table inet t"
        );
        let spawn = delay_line_args(&fault(0.0, 25_000, 1_000), 9);
        assert_eq!(
            line(own().command_line("/usr/local/bin/tailmesh", &spawn)),
            "/usr/local/bin/tailmesh delay-line --queue 7 --delay 25000us --jitter 1000us --seed 9"
        );
        assert_eq!(
            line(member().command_line("/usr/local/bin/tailmesh", &spawn)),
            "ip netns exec tmabc123m1 /usr/local/bin/tailmesh delay-line --queue 7 --delay \
             25000us --jitter 1000us --seed 9"
        );
    }

    #[test]
    fn the_own_namespace_has_one_fixed_table_and_its_rules_match_its_interface() {
        assert_eq!(member().nft_table(), "tailmesh_abc123");
        assert_eq!(member().iface(), "tmeth0");
        let place = own();
        assert_eq!(place.nft_table(), "tailmesh_agent");
        assert_eq!(place.iface(), "eth0");
        let commands = nft_loss_commands(&place.nft_table(), place.iface(), 0.2);
        assert_eq!(commands.len(), 7);
        assert_eq!(commands[0].join(" "), "add table inet tailmesh_agent");
        assert_eq!(
            commands[2].join(" "),
            "add rule inet tailmesh_agent tm_in meta iifname eth0 counter"
        );
        assert_eq!(
            commands[3].join(" "),
            "add rule inet tailmesh_agent tm_in meta iifname eth0 numgen random mod 10000 \
             < 2000 counter drop"
        );
        assert_eq!(
            commands[4].join(" "),
            "add chain inet tailmesh_agent tm_out { type filter hook output priority 0 ; }"
        );
        assert_eq!(
            commands[6].join(" "),
            "add rule inet tailmesh_agent tm_out meta oifname eth0 numgen random mod 10000 \
             < 2000 counter drop"
        );
        let rules = nfqueue_rules(place.iface(), "-A");
        assert_eq!(
            rules[0].join(" "),
            "-w -t mangle -A PREROUTING -i eth0 -j NFQUEUE --queue-num 7 --queue-bypass"
        );
        assert_eq!(
            rules[1].join(" "),
            "-w -t mangle -A OUTPUT -o eth0 -j NFQUEUE --queue-num 7 --queue-bypass"
        );
        assert_eq!(
            nfqueue_rules(place.iface(), "-D")[0].join(" "),
            "-w -t mangle -D PREROUTING -i eth0 -j NFQUEUE --queue-num 7 --queue-bypass"
        );
    }

    #[test]
    fn the_agent_env_names_its_place_in_json() {
        let env: AgentEnv = serde_json::from_str(
            r#"{"place":{"kind":"own","iface":"ens4"},"log":"/tmp/delay-line.log"}"#,
        )
        .expect("an own-namespace agent env");
        assert_eq!(
            env.place,
            Place::Own {
                iface: "ens4".to_owned()
            }
        );
        let netns = AgentEnv {
            place: member(),
            log: "/r/delay-line-hop-b-1.log".into(),
        };
        let json = serde_json::to_string(&netns).expect("serializes");
        assert!(
            json.starts_with(r#"{"place":{"kind":"member","member":{"#),
            "{json}"
        );
        let back: AgentEnv = serde_json::from_str(&json).expect("round trip");
        assert_eq!(back, netns);
        assert!(serde_json::from_str::<AgentEnv>(r#"{"place":{"kind":"own"},"log":"l"}"#).is_err());
    }

    #[test]
    fn interface_names_outside_the_rules_syntax_are_refused() {
        for good in ["eth0", "ens4", "veth-a_1.2", "abcdefghijklmno"] {
            assert!(valid_iface(good), "{good}");
        }
        for bad in [
            "",
            "abcdefghijklmnop",
            "-i",
            "eth0 drop",
            "a;b",
            "eth0@if5",
            "a\"b",
            "é",
        ] {
            assert!(!valid_iface(bad), "{bad}");
        }
        let e = Place::Own {
            iface: "x y".to_owned(),
        }
        .validate()
        .expect_err("a space");
        assert!(e.to_string().contains("\"x y\""), "{e}");
        assert!(own().validate().is_ok() && member().validate().is_ok());
    }

    #[test]
    fn the_container_interface_is_the_default_routes() {
        const HEAD: &str =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n";
        let docker = format!(
            "{HEAD}eth0\t00000000\t010011AC\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
             eth0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n"
        );
        assert_eq!(default_route_iface(&docker).as_deref(), Some("eth0"));
        // Two defaults: the lower metric wins; a route that is not up or
        // not a default never does.
        let two = format!(
            "{HEAD}wan1\t00000000\t0100A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0\n\
             down0\t00000000\t0100A8C0\t0002\t0\t0\t0\t00000000\t0\t0\t0\n\
             net1\t0000000A\t00000000\t0001\t0\t0\t0\t000000FF\t0\t0\t0\n\
             ens4\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
        );
        assert_eq!(default_route_iface(&two).as_deref(), Some("ens4"));
        let none = format!("{HEAD}eth0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n");
        assert_eq!(default_route_iface(&none), None);
        assert_eq!(default_route_iface(""), None);
        assert_eq!(default_route_iface("garbage\nmore garbage here\n"), None);
        assert!(valid_iface(&container_iface()));
    }
}
