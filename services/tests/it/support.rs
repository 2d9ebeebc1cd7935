//! What the loopback tests share: a deadline for every wait, and a server
//! task (a hop replica, the broker) with the means to stop it.

use std::{net::SocketAddr, time::Duration};

use tokio::{sync::oneshot, task::JoinHandle, time::timeout};

/// Longest any single condition may take before the test fails.
pub(crate) const WAIT: Duration = Duration::from_secs(20);

/// Awaits `fut` or fails the test after [`WAIT`] (real time).
pub(crate) async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    timeout(WAIT, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// A server task on loopback and the means to stop it.
pub(crate) struct Running {
    pub(crate) addr: SocketAddr,
    pub(crate) stop: oneshot::Sender<()>,
    pub(crate) done: JoinHandle<Result<(), String>>,
}

impl Running {
    /// Stops the server and waits for its task, which must end cleanly.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(());
        within("the server to stop", self.done)
            .await
            .expect("server task")
            .expect("the server stops cleanly");
    }
}
