//! What the loopback tests share: a deadline for every wait ([`within`]
//! for a future, [`wait_until`] for a condition polled), and a server task
//! (a hop replica, the broker) with the means to stop it.

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

/// How often [`wait_until`] re-checks its condition.
const POLL: Duration = Duration::from_millis(5);

/// Polls `condition` every [`POLL`] until it yields a value, and returns
/// it; fails the test, saying `what` it waited for, after [`WAIT`].
pub(crate) async fn wait_until<T>(what: &str, mut condition: impl FnMut() -> Option<T>) -> T {
    within(what, async {
        loop {
            if let Some(found) = condition() {
                return found;
            }
            tokio::time::sleep(POLL).await;
        }
    })
    .await
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
