//! `tailmesh clean`: removes what netns runs left behind when their
//! orchestrator died (namespaces, interfaces, rules).

#![deny(clippy::print_stdout, clippy::print_stderr)]

use tailmesh::say;

use super::CliError;

/// Removes the leftovers, one line per thing removed.
pub(crate) fn clean() -> Result<(), CliError> {
    for line in tailmesh_netfault::netns::clean() {
        say!("removed {line}");
    }
    Ok(())
}
