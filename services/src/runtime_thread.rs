//! A current-thread tokio runtime on its own OS thread, for work that must
//! never run on the thread serving requests (span export, the embedded
//! trace receiver). Started with a body that reports readiness once; stops
//! (and joins) when dropped.

use std::{future::Future, sync::mpsc, thread::JoinHandle};

use tokio::sync::oneshot;

/// Reports the started body's value (or why it could not start) once.
pub type Ready<T> = mpsc::Sender<Result<T, String>>;

/// The running thread; dropping it stops the body and joins the thread.
pub struct RuntimeThread {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl RuntimeThread {
    /// Starts thread `name` with a current-thread runtime running
    /// `body(ready, stopped)`: the body sends its value (or an error) on
    /// `ready` once it is up, and should end when `stopped` resolves.
    /// Returns the value once the body sent it.
    pub fn spawn<T, F, Fut>(name: &str, body: F) -> Result<(T, RuntimeThread), String>
    where
        T: Send + 'static,
        F: FnOnce(Ready<T>, oneshot::Receiver<()>) -> Fut + Send + 'static,
        Fut: Future<Output = ()>,
    {
        let (ready, started) = mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime.block_on(body(ready, stopped)),
                    Err(e) => {
                        let _ = ready.send(Err(format!("runtime: {e}")));
                    }
                }
            })
            .map_err(|e| format!("{name}: thread: {e}"))?;
        let value = started
            .recv()
            .map_err(|_| format!("{name}: the thread ended at start"))??;
        Ok((
            value,
            RuntimeThread {
                stop: Some(stop),
                thread: Some(thread),
            },
        ))
    }
}

impl Drop for RuntimeThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_value_comes_back_and_drop_stops_the_body() {
        let (done_tx, done_rx) = mpsc::channel();
        let (value, thread) = RuntimeThread::spawn("t", move |ready, stopped| async move {
            let _ = ready.send(Ok(42));
            let _ = stopped.await;
            let _ = done_tx.send(());
        })
        .expect("starts");
        assert_eq!(value, 42);
        assert!(done_rx.try_recv().is_err(), "still running");
        drop(thread);
        assert!(done_rx.try_recv().is_ok(), "stopped and joined on drop");
    }

    #[test]
    fn a_body_that_fails_to_start_says_why() {
        let err = RuntimeThread::spawn::<(), _, _>("t", |ready, _| async move {
            let _ = ready.send(Err("no port".into()));
        })
        .err();
        assert_eq!(err.as_deref(), Some("no port"));
    }
}
