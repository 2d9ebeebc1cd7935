//! The contract between a supervised service process (a hop replica, the
//! broker) and the launcher that started it:
//!
//! - the process binds its listener, then writes the bound address to the
//!   `--addr-file` the launcher named ([`write_addr_file`]), atomically;
//! - it serves the gRPC health service and reports SERVING once ready;
//! - it shuts down gracefully on SIGTERM or SIGINT, and when its standard
//!   input reaches end-of-file ([`shutdown_signal`]): the launcher holds the
//!   write end of that pipe, so if the launcher dies, even by SIGKILL, every
//!   process it started sees EOF and exits. No orphans, no unsafe code.

use std::{
    io::{self, Read},
    net::SocketAddr,
    path::Path,
};

/// Writes `addr` to `path` through a temporary file and a rename, so a
/// reader never sees a partial address.
pub fn write_addr_file(path: &Path, addr: SocketAddr) -> io::Result<()> {
    let tmp = path.with_extension("addr.tmp");
    std::fs::write(&tmp, format!("{addr}\n"))?;
    std::fs::rename(&tmp, path)
}

/// Resolves when the process should shut down: on SIGTERM, on SIGINT, or
/// (when `watch_stdin`) when standard input reaches end-of-file.
pub async fn shutdown_signal(watch_stdin: bool) {
    let stdin_eof = async {
        if !watch_stdin {
            return std::future::pending::<()>().await;
        }
        // A blocking read on a detached thread: tokio's stdin would park a
        // pool thread that the runtime waits for on drop, so the process
        // could not exit on SIGTERM while the launcher keeps stdin open.
        let (eof, at_eof) = tokio::sync::oneshot::channel::<()>();
        let spawned = std::thread::Builder::new()
            .name("tailmesh-stdin-watch".into())
            .spawn(move || {
                let mut stdin = io::stdin().lock();
                let mut buf = [0u8; 64];
                while let Ok(n) = stdin.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                }
                let _ = eof.send(());
            });
        match spawned {
            Ok(_) => {
                let _ = at_eof.await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sig) => {
                sig.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = stdin_eof => {}
        _ = terminate => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
