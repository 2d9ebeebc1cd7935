//! Network faults of a replica, applied inside its own namespace (netns
//! launcher) with real packet drops and delays.
//!
//! Mechanisms, picked at runtime per fault:
//!
//! - `netem`: `tc qdisc replace ... root netem delay D J loss P%` on the
//!   replica's interface (its outgoing packets) and on its bridge port in
//!   the hub namespace (its incoming packets), when the kernel has
//!   `sch_netem` (probed by adding a netem qdisc once per run).
//! - `nftables`: without netem, loss is an nftables rule in the replica's
//!   namespace, in table `inet tailmesh_<run id>`: `numgen random mod 10000
//!   < N drop` on the input and output hooks, with counters.
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
    io::{BufRead, BufReader},
    os::unix::process::CommandExt,
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use serde::{Deserialize, Serialize};

use crate::launcher::netns::{MEMBER_IF, Member, NetnsError, run_tool};
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

/// `ip netns exec <ns> <tool> <args>`: the arguments for `ip` that run
/// `tool` inside namespace `ns`.
fn in_namespace(ns: &str, tool: &str, args: Vec<String>) -> Vec<String> {
    let mut full = vec![
        "netns".to_owned(),
        "exec".into(),
        ns.to_owned(),
        tool.into(),
    ];
    full.extend(args);
    full
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
/// namespace with a random drop of `loss` on input and output.
pub fn nft_loss_commands(table: &str, loss: f64) -> Vec<Vec<String>> {
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
                "add", "rule", "inet", table, chain, "meta", iface_key, MEMBER_IF, "counter",
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
                MEMBER_IF,
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
/// of the delay line, one list per direction.
pub fn nfqueue_rules(op: &str) -> Vec<Vec<String>> {
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
                MEMBER_IF,
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

/// Applies `fault` to `member`; `hub` is the hub namespace, `run_id` names
/// the nftables table. On error, what was applied is removed.
pub fn apply(
    member: &Member,
    hub: &str,
    run_id: &str,
    fault: &NetFault,
    netem: bool,
    spawn: &DelayLineSpawn<'_>,
) -> Result<Applied, NetnsError> {
    if netem {
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
        for args in nft_loss_commands(&nft_table(run_id), fault.loss) {
            let full = in_namespace(&member.ns, "nft", args);
            if let Err(e) = run_tool("ip", &full) {
                clear(member, hub, run_id, applied);
                return Err(e);
            }
        }
    }
    if !fault.delay.is_zero() {
        applied.mechanisms.push(Mechanism::NfqueueDelayLine);
        match start_delay_line(member, fault, spawn) {
            Ok(child) => applied.delay_line = Some(child),
            Err(e) => {
                clear(member, hub, run_id, applied);
                return Err(e);
            }
        }
        for args in nfqueue_rules("-A") {
            let full = in_namespace(&member.ns, "iptables", args);
            if let Err(e) = run_tool("ip", &full) {
                clear(member, hub, run_id, applied);
                return Err(e);
            }
        }
    }
    Ok(applied)
}

/// Starts `tailmesh delay-line` in the member's namespace and waits for
/// its `ready` line (it has bound the queue).
fn start_delay_line(
    member: &Member,
    fault: &NetFault,
    spawn: &DelayLineSpawn<'_>,
) -> Result<Child, NetnsError> {
    let failed = |message: String| NetnsError::Command {
        command: format!("ip netns exec {} tailmesh delay-line", member.ns),
        message,
    };
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(spawn.log)
        .map_err(|e| failed(format!("{}: {e}", spawn.log.display())))?;
    let mut child = Command::new("ip")
        .args(["netns", "exec", &member.ns])
        .arg(spawn.exe)
        .args([
            "delay-line",
            "--queue",
            &DELAY_QUEUE.to_string(),
            "--delay",
            &format!("{}us", fault.delay.as_micros()),
            "--jitter",
            &format!("{}us", fault.jitter.as_micros()),
            "--seed",
            &spawn.seed.to_string(),
        ])
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

/// Reads `[seen, dropped]` of the nftables rules of `member`.
pub fn nft_counters(member: &Member, run_id: &str) -> Option<[u64; 2]> {
    let table = nft_table(run_id);
    let out = run_tool(
        "ip",
        [
            "netns", "exec", &member.ns, "nft", "list", "table", "inet", &table,
        ],
    )
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

/// Removes what [`apply`] added (errors ignored: the namespace is removed
/// at the end of the run anyway); returns the loss rule's counters.
pub fn clear(member: &Member, hub: &str, run_id: &str, applied: Applied) -> Option<[u64; 2]> {
    let mut counters = None;
    for mechanism in &applied.mechanisms {
        match mechanism {
            Mechanism::Netem => {
                let _ = run_tool(
                    "tc",
                    ["-n", &member.ns, "qdisc", "del", "dev", MEMBER_IF, "root"],
                );
                let _ = run_tool(
                    "tc",
                    ["-n", hub, "qdisc", "del", "dev", &member.hub_port, "root"],
                );
            }
            Mechanism::NftablesNumgen => {
                counters = nft_counters(member, run_id);
                let table = nft_table(run_id);
                let _ = run_tool(
                    "ip",
                    [
                        "netns", "exec", &member.ns, "nft", "delete", "table", "inet", &table,
                    ],
                );
            }
            Mechanism::NfqueueDelayLine => {
                for args in nfqueue_rules("-D") {
                    let full = in_namespace(&member.ns, "iptables", args);
                    let _ = run_tool("ip", &full);
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

/// The fault agent's backend: applies faults to its own replica's
/// namespace with the mechanisms above (netem probed once).
#[derive(Debug)]
pub struct NetBackend {
    agent: crate::launcher::netns::AgentEnv,
    exe: std::path::PathBuf,
    seed: u64,
    netem: bool,
    applied: std::sync::Mutex<Option<Applied>>,
}

impl NetBackend {
    /// A backend for the replica described by `agent`.
    pub fn new(
        agent: crate::launcher::netns::AgentEnv,
        exe: std::path::PathBuf,
        seed: u64,
    ) -> Self {
        let netem = netem_available(&agent.hub, &format!("tm{}u", agent.run_id));
        Self {
            agent,
            exe,
            seed,
            netem,
            applied: std::sync::Mutex::new(None),
        }
    }

    fn take(&self) -> Option<Applied> {
        self.applied
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
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
            clear(
                &self.agent.member,
                &self.agent.hub,
                &self.agent.run_id,
                previous,
            );
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
        let applied = apply(
            &self.agent.member,
            &self.agent.hub,
            &self.agent.run_id,
            &fault,
            self.netem,
            &spawn,
        )
        .map_err(|e| e.to_string())?;
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
        let packets = clear(
            &self.agent.member,
            &self.agent.hub,
            &self.agent.run_id,
            applied,
        );
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
        let commands = nft_loss_commands("tailmesh_abc123", 0.05);
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
        let rules = nfqueue_rules("-A");
        assert_eq!(
            rules[0].join(" "),
            "-w -t mangle -A PREROUTING -i tmeth0 -j NFQUEUE --queue-num 7 --queue-bypass"
        );
        assert_eq!(
            rules[1].join(" "),
            "-w -t mangle -A OUTPUT -o tmeth0 -j NFQUEUE --queue-num 7 --queue-bypass"
        );
        assert_eq!(nfqueue_rules("-D")[1][3], "-D");
    }
}
