//! The system's network tools (`ip`, `tc`, `nft`, `iptables`): running
//! them without a shell, finding them on PATH, and whether this process
//! may use them at all.

use std::{
    ffi::{OsStr, OsString},
    path::PathBuf,
    process::Command,
};

/// A command that failed.
#[derive(Debug, thiserror::Error)]
#[error("{command}: {message}")]
pub struct CommandError {
    /// The command line, for the message.
    pub(crate) command: String,
    /// Its stderr, or why it could not start.
    pub(crate) message: String,
}

/// Whether this process may create namespaces and interfaces: effective
/// CAP_NET_ADMIN (bit 12 of `CapEff`) and CAP_SYS_ADMIN (21, for `ip netns
/// add`'s mount), read from `/proc/self/status`.
pub fn has_privilege() -> bool {
    has_capabilities(&[12, 21])
}

/// Whether this process has each of the capabilities numbered `bits` in
/// effect (`CapEff` of `/proc/self/status`).
pub fn has_capabilities(bits: &[u32]) -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| bits.iter().all(|&bit| caps & (1 << bit) != 0))
}

/// The programs the netns launcher and the fault mechanisms run, each with
/// the Debian package that has it; returns those missing from PATH.
pub fn missing_tools() -> Vec<(&'static str, &'static str)> {
    [("ip", "iproute2"), ("tc", "iproute2"), ("nft", "nftables")]
        .into_iter()
        .filter(|(tool, _)| find_in_path(tool).is_none())
        .collect()
}

/// Whether `tool` is on PATH (or in /usr/sbin, /sbin).
pub fn tool_available(tool: &str) -> bool {
    find_in_path(tool).is_some()
}

/// Where `tool` is: the first match on PATH, then /usr/sbin and /sbin
/// (often missing from a non-root PATH).
pub fn find_in_path(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|dir| dir.join(tool))
        .find(|p| p.is_file())
}

/// Runs `program args...` (never through a shell) and returns its stdout.
pub fn run_tool<P, I, S>(program: P, args: I) -> Result<String, CommandError>
where
    P: AsRef<OsStr>,
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let program = program.as_ref();
    let args: Vec<OsString> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let line = || {
        let mut line = program.to_string_lossy().into_owned();
        for a in &args {
            line.push(' ');
            line.push_str(&a.to_string_lossy());
        }
        line
    };
    let output = Command::new(program)
        .args(&args)
        .output()
        .map_err(|e| CommandError {
            command: line(),
            message: e.to_string(),
        })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(CommandError {
            command: line(),
            message: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}
