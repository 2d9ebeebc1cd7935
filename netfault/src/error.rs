//! [`FaultError`]: why a network fault cannot be applied.

use crate::tool::CommandError;

/// A fault that cannot be applied.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    /// Delay or jitter on a kernel without netem and without iptables.
    #[error(
        "{link}: delay and jitter need the kernel's sch_netem, which \
         this kernel lacks, or the NFQUEUE delay line, which needs the iptables command \
         (Debian package iptables)"
    )]
    NoDelayMechanism {
        /// Whose link: `hop "b" replica 1`, `load generator 0`.
        link: String,
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
    /// The replica shares the host's network (the local launcher): there
    /// is nothing of its own to shape.
    #[error("this replica has no network namespace of its own (local launcher)")]
    NoNamespace,
    /// A command failed.
    #[error(transparent)]
    Command(#[from] CommandError),
}
