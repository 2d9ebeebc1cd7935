//! How a fault is applied at its [`Place`], with real packet drops and
//! delays. Mechanisms, picked at runtime per fault:
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
//! In the agent's own namespace there is no veth peer to shape, and netem
//! on the interface alone would delay and drop outgoing packets only, so
//! that place always uses the nftables and NFQUEUE mechanisms, which cover
//! both directions.
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

use crate::{
    FaultError, Place,
    netns::MEMBER_IF,
    place::OWN_NFT_TABLE,
    tool::{CommandError, run_tool},
};

/// Finest loss step of the nftables rule: 1/10000.
const NFT_SCALE: u32 = 10_000;

/// The NFQUEUE number of the delay line (queues are per namespace).
const DELAY_QUEUE: u16 = 7;

pub use tailmesh_model::fault::Mechanism;

/// The mechanism of a name the agent reported.
pub fn mechanism_of(name: &str) -> Option<Mechanism> {
    match name {
        "netem" => Some(Mechanism::Netem),
        "nftables_numgen" => Some(Mechanism::NftablesNumgen),
        "nfqueue_delay_line" => Some(Mechanism::NfqueueDelayLine),
        _ => None,
    }
}

/// A checked network fault of one replica (the Control service validates
/// what it receives into one).
#[derive(Clone, Debug, PartialEq)]
pub struct FaultSpec {
    /// Drop probability in [0, 1].
    pub loss: f64,
    /// Added delay per packet.
    pub delay: Duration,
    /// Variation of the delay (<= delay).
    pub jitter: Duration,
}

/// What [`apply`] put in force, for [`clear`].
#[derive(Debug)]
pub(crate) struct InForce {
    /// The mechanisms, loss first.
    pub(crate) mechanisms: Vec<Mechanism>,
    /// The delay line process, if one was started.
    delay_line: Option<Child>,
}

/// `tc` arguments that put `fault` on `dev` of namespace `ns` (netem).
fn netem_args(ns: &str, dev: &str, fault: &FaultSpec) -> Vec<String> {
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
fn nft_threshold(loss: f64) -> u32 {
    (loss.clamp(0.0, 1.0) * f64::from(NFT_SCALE)).round() as u32
}

/// `nft` argument lists (one command each) that create table `table` in a
/// namespace with a random drop of `loss` on input from and output to
/// interface `iface`.
fn nft_loss_commands(table: &str, iface: &str, loss: f64) -> Vec<Vec<String>> {
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
        // Every packet (loss = 1): no draw, as `numgen ... < 10000` is out
        // of nft's range for a modulus of 10000.
        let all = nft_threshold(loss) >= NFT_SCALE;
        let mut drop: Vec<String> = [
            "add", "rule", "inet", table, chain, "meta", iface_key, iface,
        ]
        .map(str::to_owned)
        .to_vec();
        if !all {
            drop.extend(
                [
                    "numgen",
                    "random",
                    "mod",
                    &NFT_SCALE.to_string(),
                    "<",
                    &threshold,
                ]
                .map(str::to_owned),
            );
        }
        drop.extend(["counter", "drop"].map(str::to_owned));
        commands.push(drop);
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

/// Checks up front that `fault` can be applied with what the kernel has;
/// `link` names whose link it is in the error (`hop "b" replica 1`).
pub fn check(link: &str, fault: &FaultSpec, netem: bool, iptables: bool) -> Result<(), FaultError> {
    if !netem && !iptables && !fault.delay.is_zero() {
        return Err(FaultError::NoDelayMechanism {
            link: link.to_owned(),
        });
    }
    Ok(())
}

/// `iptables` arguments adding (`-A`) or deleting (`-D`) the NFQUEUE rules
/// of the delay line on interface `iface`, one list per direction.
fn nfqueue_rules(iface: &str, op: &str) -> Vec<Vec<String>> {
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
pub(crate) struct DelayLineSpawn<'a> {
    /// `tailmesh` itself.
    pub(crate) exe: &'a Path,
    /// Where its output goes.
    pub(crate) log: &'a Path,
    /// Its seed.
    pub(crate) seed: u64,
}

/// The arguments of `tailmesh delay-line` for `fault`.
fn delay_line_args(fault: &FaultSpec, seed: u64) -> Vec<String> {
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
pub(crate) fn apply(
    place: &Place,
    fault: &FaultSpec,
    netem: bool,
    spawn: &DelayLineSpawn<'_>,
) -> Result<InForce, CommandError> {
    if netem && let Place::Member { member, hub, .. } = place {
        run_tool("tc", netem_args(&member.ns, MEMBER_IF, fault))?;
        if let Err(e) = run_tool("tc", netem_args(hub, &member.hub_port, fault)) {
            let _ = run_tool(
                "tc",
                ["-n", &member.ns, "qdisc", "del", "dev", MEMBER_IF, "root"],
            );
            return Err(e);
        }
        return Ok(InForce {
            mechanisms: vec![Mechanism::Netem],
            delay_line: None,
        });
    }
    let mut applied = InForce {
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
    fault: &FaultSpec,
    spawn: &DelayLineSpawn<'_>,
) -> Result<Child, CommandError> {
    let (program, args) = place.command_line(spawn.exe, delay_line_args(fault, spawn.seed));
    let failed = |message: String| CommandError {
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
fn nft_counters(place: &Place) -> Option<[u64; 2]> {
    let out = place
        .run("nft", vec!["list", "table", "inet", &place.nft_table()])
        .ok()?;
    Some(parse_counters(&out))
}

/// Sums `counter packets N` of counting rules (no `drop`) and drop rules.
fn parse_counters(listing: &str) -> [u64; 2] {
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

/// Reads `[seen, dropped]` of the netem qdisc on `dev` of namespace `ns`
/// from `tc -s qdisc show`: the packets it passed plus those it dropped,
/// and those it dropped.
fn netem_counters(ns: &str, dev: &str) -> Option<[u64; 2]> {
    let out = run_tool("tc", ["-s", "-n", ns, "qdisc", "show", "dev", dev]).ok()?;
    parse_qdisc_stats(&out)
}

/// `[sent + dropped, dropped]` packets from the statistics line of a
/// netem qdisc: ` Sent 1234 bytes 56 pkt (dropped 7, overlimits 0 requeues 0)`.
fn parse_qdisc_stats(listing: &str) -> Option<[u64; 2]> {
    let mut lines = listing.lines();
    lines.find(|l| l.starts_with("qdisc netem "))?;
    let stats = lines.next()?.trim();
    let number_after = |key: &str| -> Option<u64> {
        stats
            .split(key)
            .nth(1)?
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    let sent = number_after("bytes ")?;
    let dropped = number_after("(dropped ")?;
    Some([sent + dropped, dropped])
}

/// Removes what [`apply`] added (errors ignored: a member namespace is
/// removed at the end of the run anyway, and the agent's own namespace is
/// swept by [`remove_leftovers`]); returns the packets seen and dropped
/// by the loss rules or the netem qdiscs.
pub(crate) fn clear(place: &Place, applied: InForce) -> Option<[u64; 2]> {
    let mut counters = None;
    for mechanism in &applied.mechanisms {
        match mechanism {
            Mechanism::Netem => {
                if let Place::Member { member, hub, .. } = place {
                    let ends = [
                        (member.ns.as_str(), MEMBER_IF),
                        (hub.as_str(), &member.hub_port),
                    ];
                    counters = ends.iter().try_fold([0, 0], |[seen, dropped], (ns, dev)| {
                        let [s, d] = netem_counters(ns, dev)?;
                        Some([seen + s, dropped + d])
                    });
                    for (ns, dev) in ends {
                        let _ = run_tool("tc", ["-n", ns, "qdisc", "del", "dev", dev, "root"]);
                    }
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
pub(crate) fn remove_leftovers(place: &Place) {
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

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;
    use crate::place::testing::{member, own};

    fn fault(loss: f64, delay_us: u64, jitter_us: u64) -> FaultSpec {
        FaultSpec {
            loss,
            delay: Duration::from_micros(delay_us),
            jitter: Duration::from_micros(jitter_us),
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
    fn netem_counters_are_read_from_tc_statistics() {
        let listing = "qdisc netem 8001: root refcnt 2 limit 1000 delay 10ms loss 20%\n \
                       Sent 91234 bytes 1234 pkt (dropped 310, overlimits 0 requeues 0) \n \
                       backlog 0b 0p requeues 0\n";
        assert_eq!(parse_qdisc_stats(listing), Some([1544, 310]));
        // Another qdisc than netem (it was replaced or never applied).
        assert_eq!(
            parse_qdisc_stats(
                "qdisc noqueue 0: root refcnt 2\n Sent 0 bytes 0 pkt (dropped 0, overlimits 0 requeues 0)\n"
            ),
            None
        );
        assert_eq!(parse_qdisc_stats(""), None);
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
        // A black hole drops every packet without a draw.
        let all = nft_loss_commands("tailmesh_abc123", MEMBER_IF, 1.0);
        assert_eq!(
            all[3].join(" "),
            "add rule inet tailmesh_abc123 tm_in meta iifname tmeth0 counter drop"
        );
    }

    #[test]
    fn counters_are_split_into_seen_and_dropped() {
        let listing = "table inet tailmesh_x {\n chain tm_in {\n  type filter hook input priority filter; policy accept;\n  iifname \"tmeth0\" counter packets 100 bytes 9000\n  iifname \"tmeth0\" numgen random mod 10000 < 2000 counter packets 21 bytes 10 drop\n }\n chain tm_out {\n  oifname \"tmeth0\" counter packets 50 bytes 1\n  oifname \"tmeth0\" numgen random mod 10000 < 2000 counter packets 9 bytes 1 drop\n }\n}\n";
        assert_eq!(parse_counters(listing), [150, 30]);
    }

    #[test]
    fn delay_needs_netem_or_iptables_and_loss_needs_neither() {
        let link = "hop \"b\" replica 1";
        assert!(check(link, &fault(0.1, 0, 0), false, false).is_ok());
        let e = check(link, &fault(0.0, 1000, 0), false, false).expect_err("delay needs a way");
        assert!(e.to_string().starts_with("hop \"b\" replica 1: "), "{e}");
        assert!(check(link, &fault(0.0, 1000, 0), true, false).is_ok());
        assert!(check(link, &fault(0.0, 1000, 0), false, true).is_ok());
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
}
