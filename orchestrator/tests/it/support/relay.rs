//! A TCP relay on 127.0.0.1 that counts the connections through it: put
//! between a caller and what it calls, it tells how many connections the
//! caller opened and how many are still open, whatever the protocol.

use std::{net::SocketAddr, time::Duration};

use tokio::{
    net::{TcpListener, TcpStream},
    sync::watch,
    task::{JoinHandle, JoinSet},
};

/// Connections through a relay so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Through {
    /// Accepted from the caller.
    pub(crate) opened: usize,
    /// Ended (by either side, or because the target refused them).
    pub(crate) closed: usize,
}

impl Through {
    /// Opened and not yet ended.
    pub(crate) fn open(&self) -> usize {
        self.opened - self.closed
    }
}

/// The relay; dropping it ends every connection through it.
pub(crate) struct Relay {
    addr: SocketAddr,
    counts: watch::Receiver<Through>,
    task: JoinHandle<()>,
}

impl Relay {
    /// A relay to `target`, listening on an ephemeral port of 127.0.0.1;
    /// it runs on the calling runtime.
    pub(crate) async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback listener for the relay");
        let addr = listener.local_addr().expect("the relay's address");
        let (counts_tx, counts) = watch::channel(Through::default());
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                let (mut caller, _) = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(_) => continue,
                    },
                    // Reap the finished ones as they end.
                    Some(_) = connections.join_next(), if !connections.is_empty() => continue,
                };
                counts_tx.send_modify(|c| c.opened += 1);
                let counts_tx = counts_tx.clone();
                connections.spawn(async move {
                    if let Ok(mut target) = TcpStream::connect(target).await {
                        let _ = caller.set_nodelay(true);
                        let _ = target.set_nodelay(true);
                        let _ = tokio::io::copy_bidirectional(&mut caller, &mut target).await;
                    }
                    counts_tx.send_modify(|c| c.closed += 1);
                });
            }
        });
        Relay { addr, counts, task }
    }

    /// Where callers connect.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The counts now.
    pub(crate) fn through(&self) -> Through {
        *self.counts.borrow()
    }

    /// Waits, at most `within`, until `done` holds for the counts; fails
    /// the test with them (and `what`) otherwise.
    pub(crate) async fn wait_for(
        &self,
        what: &str,
        within: Duration,
        done: impl FnMut(&Through) -> bool,
    ) -> Through {
        let mut counts = self.counts.clone();
        match tokio::time::timeout(within, counts.wait_for(done)).await {
            Ok(Ok(through)) => *through,
            _ => panic!(
                "waited {within:?} for {what}; connections through the relay: {:?}",
                self.through()
            ),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}
