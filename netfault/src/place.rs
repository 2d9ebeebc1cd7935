//! Where a fault agent acts ([`Place`]): a member namespace of the netns
//! launcher, reached from the host namespace, or the agent's own namespace
//! (a container or a pod), and which interface its rules match there.

use std::ffi::{OsStr, OsString};

use serde::{Deserialize, Serialize};

use crate::{
    FaultError,
    netns::{MEMBER_IF, Member},
    tool::{CommandError, run_tool},
};

/// The nftables table of the agent in its own namespace.
pub(crate) const OWN_NFT_TABLE: &str = "tailmesh_agent";

/// The interface a container's agent shapes when the namespace has no
/// default route: Docker's and Kubernetes' name for it.
const DEFAULT_CONTAINER_IF: &str = "eth0";

/// Where a fault agent applies faults.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Place {
    /// A member namespace of the netns launcher, from the host namespace:
    /// commands run through `ip netns exec`, rules match its `tmeth0`,
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
    pub(crate) fn iface(&self) -> &str {
        match self {
            Self::Member { .. } => MEMBER_IF,
            Self::Own { iface } => iface,
        }
    }

    /// The nftables table of the loss rule: one per run in member
    /// namespaces, a fixed one in the agent's own namespace.
    pub(crate) fn nft_table(&self) -> String {
        match self {
            Self::Member { run_id, .. } => nft_table(run_id),
            Self::Own { .. } => OWN_NFT_TABLE.to_owned(),
        }
    }

    /// The command that runs `program args...` at this place, as
    /// `(program, arguments)`: `ip netns exec <ns> program args...` in a
    /// member namespace, `program args...` in the agent's own.
    pub(crate) fn command_line<P, I, S>(&self, program: P, args: I) -> (OsString, Vec<OsString>)
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
    pub(crate) fn run<S: AsRef<OsStr>>(
        &self,
        tool: &str,
        args: Vec<S>,
    ) -> Result<String, CommandError> {
        let (program, args) = self.command_line(tool, args);
        run_tool(program, args)
    }

    /// Checks what came from outside (the agent's environment): an
    /// interface name is one the kernel accepts and that nftables reads as
    /// a plain word.
    pub(crate) fn validate(&self) -> Result<(), FaultError> {
        match self {
            Self::Own { iface } if !valid_iface(iface) => Err(FaultError::BadInterface {
                iface: iface.clone(),
            }),
            _ => Ok(()),
        }
    }
}

/// The nftables table of run `id`.
fn nft_table(id: &str) -> String {
    format!("tailmesh_{id}")
}

/// Whether `name` is an interface name usable in the rules: 1 to 15
/// letters, digits, `.`, `_` or `-`, not starting with `-`.
fn valid_iface(name: &str) -> bool {
    (1..=15).contains(&name.len())
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The interface of this namespace's default IPv4 route (read from
/// `/proc/net/route`), or `eth0` without one: the interface a container's
/// agent shapes, whatever the runtime named it.
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

/// Places for the tests of this crate.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// An agent in its own namespace, on `eth0`.
    pub(crate) fn own() -> Place {
        Place::Own {
            iface: "eth0".to_owned(),
        }
    }

    /// Replica 1 of hop `b` in run `abc123`.
    pub(crate) fn member() -> Place {
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
}

#[cfg(test)]
mod tests {
    use super::{
        testing::{member, own},
        *,
    };

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
