//! The network of a netns run: a namespace and an address per process, all
//! on one bridge, so a network fault hits one replica's packets only.
//!
//! Topology (everything named `tm<run id>...`, `<run id>` six hex digits):
//!
//! ```text
//! host ns:  tm<id>h 10.A.B.254/24 ──veth──┐
//! hub ns (tm<id>hub):          tm<id>u ── bridge tm<id>br ── tm<id>p<i>
//!                                                              │ veth
//! member ns (tm<id>m<i>):                       tmeth0 10.A.B.<i+1>/24
//! ```
//!
//! The bridge lives in a dedicated hub namespace, so the host gains exactly
//! one interface (`tm<id>h`, whose peer is in the hub) and its connected
//! /24 route; the orchestrator (load generator, health checks) stays in the
//! host namespace and reaches every process through it. The /24 is picked
//! per run among 10.200.0.0/16 .. 10.254.255.0/24 so that no host address
//! or route overlaps it. Default route, firewall rules and existing
//! interfaces of the host are never touched. Rules of faults live inside
//! member namespaces, so deleting the namespaces removes them.
//!
//! Ownership: `/run/tailmesh/<id>.pid` holds the orchestrator's pid while
//! the run lasts; [`clean`] removes the namespaces and host interfaces of
//! every run whose owner is gone.

use std::{
    io,
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use crate::tool::{CommandError, run_tool};

/// Where run ownership files live.
pub const RUN_DIR: &str = "/run/tailmesh";
/// The interface of a member namespace.
pub(crate) const MEMBER_IF: &str = "tmeth0";
/// Most processes one run can place (.1 to .253 of the /24).
const MAX_MEMBERS: usize = 253;

/// A problem building or removing the network of a run.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// A command failed.
    #[error(transparent)]
    Command(#[from] CommandError),
    /// No free private /24.
    #[error("no free 10.x.y.0/24 for the run: every candidate overlaps a host address or route")]
    NoSubnet,
    /// More processes than addresses.
    #[error("the netns launcher places at most {MAX_MEMBERS} processes per variant")]
    TooMany,
    /// The ownership file.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// A run id: six hex digits from the pid and the clock.
fn new_run_id() -> String {
    let now = tailmesh_units::unix_nanos();
    let nanos = (now % 1_000_000_000) as u32 ^ ((now / 1_000_000_000) as u32).rotate_left(7);
    format!(
        "{:06x}",
        (nanos ^ std::process::id().rotate_left(11)) & 0xff_ffff
    )
}

/// The network of one run: hub namespace, bridge, host interface and one
/// member namespace per process. Removed by [`Network::remove`] or on drop.
#[derive(Debug)]
pub struct Network {
    id: String,
    subnet: [u8; 3],
    members: Vec<Member>,
    removed: bool,
}

/// One process's namespace.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Member {
    /// The process name (`hop-b-1`).
    pub name: String,
    /// Its namespace.
    pub ns: String,
    /// Its address.
    pub addr: Ipv4Addr,
    /// The bridge port of its veth, in the hub namespace.
    pub(crate) hub_port: String,
}

impl Network {
    /// Creates the hub namespace, the bridge and the host interface of a
    /// new run, and records this process as its owner. On failure nothing
    /// is left behind.
    pub fn create() -> Result<Self, NetnsError> {
        let id = new_run_id();
        let subnet = pick_subnet(&id)?;
        let mut net = Self {
            id,
            subnet,
            members: Vec::new(),
            removed: false,
        };
        if let Err(e) = net.build_hub() {
            net.remove();
            return Err(e);
        }
        Ok(net)
    }

    fn build_hub(&mut self) -> Result<(), NetnsError> {
        std::fs::create_dir_all(RUN_DIR).map_err(|source| NetnsError::Io {
            path: RUN_DIR.into(),
            source,
        })?;
        let owner = owner_file(&self.id);
        std::fs::write(&owner, format!("{}\n", std::process::id())).map_err(|source| {
            NetnsError::Io {
                path: owner.clone(),
                source,
            }
        })?;
        let hub = self.hub();
        let bridge = format!("tm{}br", self.id);
        let host_if = self.host_if();
        let uplink = format!("tm{}u", self.id);
        run_tool("ip", ["netns", "add", &hub])?;
        run_tool("ip", ["-n", &hub, "link", "set", "lo", "up"])?;
        run_tool("ip", ["-n", &hub, "link", "add", &bridge, "type", "bridge"])?;
        run_tool("ip", ["-n", &hub, "link", "set", &bridge, "up"])?;
        run_tool(
            "ip",
            [
                "link", "add", &host_if, "type", "veth", "peer", "name", &uplink, "netns", &hub,
            ],
        )?;
        run_tool(
            "ip",
            ["-n", &hub, "link", "set", &uplink, "master", &bridge, "up"],
        )?;
        let host_addr = format!("{}/24", self.host_addr());
        run_tool("ip", ["addr", "add", &host_addr, "dev", &host_if])?;
        run_tool("ip", ["link", "set", &host_if, "up"])?;
        Ok(())
    }

    /// The run id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The hub namespace.
    pub fn hub(&self) -> String {
        format!("tm{}hub", self.id)
    }

    /// The host's interface into the hub.
    fn host_if(&self) -> String {
        format!("tm{}h", self.id)
    }

    /// The host's address on the run's network (.254, on `tm<id>h`): the
    /// one host address every member can reach.
    pub fn host_addr(&self) -> Ipv4Addr {
        self.addr(254)
    }

    /// The members created so far.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    fn addr(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(self.subnet[0], self.subnet[1], self.subnet[2], host)
    }

    /// Creates the namespace of process `name`, joined to the bridge.
    pub fn add_member(&mut self, name: &str) -> Result<Member, NetnsError> {
        let index = self.members.len();
        if index >= MAX_MEMBERS {
            return Err(NetnsError::TooMany);
        }
        let member = Member {
            name: name.to_owned(),
            ns: format!("tm{}m{index}", self.id),
            addr: self.addr(u8::try_from(index + 1).map_err(|_| NetnsError::TooMany)?),
            hub_port: format!("tm{}p{index}", self.id),
        };
        // Recorded first, so a failure half-way is still removed.
        self.members.push(member.clone());
        let hub = self.hub();
        let bridge = format!("tm{}br", self.id);
        let ns = member.ns.as_str();
        run_tool("ip", ["netns", "add", ns])?;
        run_tool("ip", ["-n", ns, "link", "set", "lo", "up"])?;
        run_tool(
            "ip",
            [
                "-n",
                &hub,
                "link",
                "add",
                &member.hub_port,
                "type",
                "veth",
                "peer",
                "name",
                MEMBER_IF,
                "netns",
                ns,
            ],
        )?;
        run_tool(
            "ip",
            [
                "-n",
                &hub,
                "link",
                "set",
                &member.hub_port,
                "master",
                &bridge,
                "up",
            ],
        )?;
        let cidr = format!("{}/24", member.addr);
        run_tool("ip", ["-n", ns, "addr", "add", &cidr, "dev", MEMBER_IF])?;
        run_tool("ip", ["-n", ns, "link", "set", MEMBER_IF, "up"])?;
        Ok(member)
    }

    /// Removes every namespace and the host interface of the run, and its
    /// ownership file. Errors are ignored: each part is tried.
    pub fn remove(&mut self) {
        if self.removed {
            return;
        }
        self.removed = true;
        remove_run(&self.id);
    }
}

impl Drop for Network {
    /// Removes the run's network on every exit path (an error, a panic).
    fn drop(&mut self) {
        self.remove();
    }
}

fn owner_file(id: &str) -> PathBuf {
    Path::new(RUN_DIR).join(format!("{id}.pid"))
}

/// Removes the namespaces (`tm<id>...`), the host interface and the owner
/// file of run `id`; returns what was removed.
fn remove_run(id: &str) -> Vec<String> {
    let mut removed = Vec::new();
    let prefix = format!("tm{id}");
    // Members first: deleting a namespace destroys its veths and rules.
    let mut namespaces: Vec<String> = list_namespaces()
        .into_iter()
        .filter(|ns| ns.starts_with(&prefix))
        .collect();
    namespaces.sort_by_key(|ns| ns.ends_with("hub"));
    for ns in namespaces {
        if run_tool("ip", ["netns", "del", &ns]).is_ok() {
            removed.push(format!("namespace {ns}"));
        }
    }
    let host_if = format!("tm{id}h");
    if link_exists(&host_if) && run_tool("ip", ["link", "del", &host_if]).is_ok() {
        removed.push(format!("interface {host_if}"));
    }
    let _ = std::fs::remove_file(owner_file(id));
    removed
}

/// Names of the network namespaces (`ip netns list`).
pub fn list_namespaces() -> Vec<String> {
    run_tool("ip", ["netns", "list"])
        .map(|out| {
            out.lines()
                .filter_map(|l| l.split_whitespace().next())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Host interfaces whose name starts with `tm`.
pub fn host_tm_links() -> Vec<String> {
    run_tool("ip", ["-o", "link", "show"])
        .map(|out| {
            out.lines()
                .filter_map(|l| l.split(':').nth(1))
                .map(|n| n.trim().split('@').next().unwrap_or("").to_owned())
                .filter(|n| n.starts_with("tm"))
                .collect()
        })
        .unwrap_or_default()
}

fn link_exists(name: &str) -> bool {
    run_tool("ip", ["link", "show", "dev", name]).is_ok()
}

/// The run id of a tailmesh namespace or interface name, if it is one.
fn run_id_of(name: &str) -> Option<&str> {
    let id = name.strip_prefix("tm")?.get(..6)?;
    (id.bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        && name.len() > 8)
        .then_some(id)
}

fn owner_alive(id: &str) -> bool {
    let Ok(text) = std::fs::read_to_string(owner_file(id)) else {
        return false;
    };
    let Ok(pid) = text.trim().parse::<u32>() else {
        return false;
    };
    std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|cmd| cmd.contains("tailmesh"))
}

/// Removes the leftovers (namespaces, host interfaces, owner files) of
/// every tailmesh run whose orchestrator is gone; returns what it removed.
pub fn clean() -> Vec<String> {
    let mut ids: Vec<String> = list_namespaces()
        .iter()
        .chain(host_tm_links().iter())
        .filter_map(|n| run_id_of(n).map(str::to_owned))
        .collect();
    if let Ok(dir) = std::fs::read_dir(RUN_DIR) {
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(id) = name.strip_suffix(".pid") {
                ids.push(id.to_owned());
            }
        }
    }
    ids.sort();
    ids.dedup();
    let mut removed = Vec::new();
    for id in ids {
        if !owner_alive(&id) {
            removed.extend(remove_run(&id));
        }
    }
    removed
}

/// A /24 in 10.200.0.0 .. 10.254.255.0 that no host address or route
/// overlaps, starting from one derived from the run id.
fn pick_subnet(id: &str) -> Result<[u8; 3], NetnsError> {
    let routes = run_tool("ip", ["-4", "route", "show", "table", "all"])?;
    let addrs = run_tool("ip", ["-4", "-o", "addr", "show"])?;
    let start = u32::from_str_radix(id, 16).unwrap_or(0);
    // Bounded: at most 64 candidates.
    for k in 0..64u32 {
        let n = start.wrapping_add(k.wrapping_mul(7919)) % (55 * 256);
        let subnet = [10, 200 + (n / 256) as u8, (n % 256) as u8];
        if !overlaps(subnet, &routes) && !overlaps(subnet, &addrs) {
            return Ok(subnet);
        }
    }
    Err(NetnsError::NoSubnet)
}

/// Whether any IPv4 prefix written in `text` overlaps 10.a.b.0/24.
fn overlaps(subnet: [u8; 3], text: &str) -> bool {
    let ours = u32::from(Ipv4Addr::new(subnet[0], subnet[1], subnet[2], 0));
    text.split_whitespace().any(|word| {
        let (addr, len) = match word.split_once('/') {
            Some((a, l)) => (a, l.parse::<u32>().ok()),
            None => (word, Some(32)),
        };
        let (Ok(addr), Some(len)) = (addr.parse::<Ipv4Addr>(), len) else {
            return false;
        };
        if len > 32 {
            return false;
        }
        // Overlap: the shorter prefix contains the other's network.
        let common = len.min(24);
        let mask = if common == 0 {
            0
        } else {
            u32::MAX << (32 - common)
        };
        (u32::from(addr) & mask) == (ours & mask)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_recognised_only_in_our_names() {
        assert_eq!(run_id_of("tm0a1b2chub"), Some("0a1b2c"));
        assert_eq!(run_id_of("tm0a1b2cm3"), Some("0a1b2c"));
        assert_eq!(run_id_of("tm0a1b2ch"), Some("0a1b2c"));
        assert_eq!(run_id_of("tm0a1b2c"), None);
        assert_eq!(run_id_of("tmux-thing"), None);
        assert_eq!(run_id_of("eth0"), None);
        assert_eq!(run_id_of("tm0A1B2Chub"), None);
        let id = new_run_id();
        assert_eq!(id.len(), 6);
        assert_eq!(run_id_of(&format!("tm{id}hub")), Some(id.as_str()));
    }

    #[test]
    fn subnets_overlapping_host_prefixes_are_detected() {
        let routes = "default via 192.0.2.1 dev eth0\n10.0.0.0/8 dev x\n";
        assert!(overlaps([10, 200, 3], routes));
        let routes = "default via 192.0.2.1 dev eth0\n10.200.3.0/24 dev y\n";
        assert!(overlaps([10, 200, 3], routes));
        assert!(!overlaps([10, 200, 4], routes));
        assert!(overlaps([10, 200, 4], "inet 10.200.4.17/32 scope host"));
        assert!(!overlaps(
            [10, 200, 4],
            "192.0.2.0/24 dev eth0 src 192.0.2.2"
        ));
    }
}
