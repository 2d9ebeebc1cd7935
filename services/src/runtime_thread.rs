//! A current-thread tokio runtime on its own OS thread, for work that must
//! never run on the thread serving requests (span export, the embedded
//! trace receiver). Started with a body that reports readiness once; stops
//! (and joins) when dropped.

use std::{future::Future, io, sync::mpsc, thread::JoinHandle};

use tokio::sync::oneshot;

/// Reports the started body's value (or why it could not start) once.
pub type Ready<T, E> = mpsc::Sender<Result<T, E>>;

/// Why the thread could not run its body at all.
#[derive(Debug, thiserror::Error)]
pub enum ThreadError {
    /// The OS refused a new thread.
    #[error("{name}: thread: {source}")]
    Spawn {
        /// The thread's name.
        name: String,
        /// The operating system's error.
        source: io::Error,
    },
    /// The thread's runtime could not be built.
    #[error("runtime: {0}")]
    Runtime(#[source] io::Error),
    /// The body ended without saying whether it started.
    #[error("{name}: the thread ended at start")]
    Ended {
        /// The thread's name.
        name: String,
    },
}

/// The running thread; dropping it stops the body and joins the thread.
pub struct RuntimeThread {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<io::Result<()>>>,
}

impl RuntimeThread {
    /// Starts thread `name` with a current-thread runtime running
    /// `body(ready, stopped)`: the body sends its value (or its error) on
    /// `ready` once it is up, and should end when `stopped` resolves.
    /// Returns the value once the body sent it.
    pub fn spawn<T, E, F, Fut>(name: &str, body: F) -> Result<(T, RuntimeThread), E>
    where
        T: Send + 'static,
        E: From<ThreadError> + Send + 'static,
        F: FnOnce(Ready<T, E>, oneshot::Receiver<()>) -> Fut + Send + 'static,
        Fut: Future<Output = ()>,
    {
        let (ready, started) = mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(body(ready, stopped));
                Ok(())
            })
            .map_err(|source| ThreadError::Spawn {
                name: name.to_string(),
                source,
            })?;
        let value = match started.recv() {
            Ok(value) => value?,
            // The body never reported: the runtime could not be built, or
            // the body returned (or panicked) without a word.
            Err(_) => {
                return Err(match thread.join() {
                    Ok(Err(e)) => ThreadError::Runtime(e),
                    _ => ThreadError::Ended {
                        name: name.to_string(),
                    },
                }
                .into());
            }
        };
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

    /// A body's own reason for not starting.
    #[derive(Debug, thiserror::Error)]
    enum Refused {
        #[error("no port")]
        NoPort,
        #[error(transparent)]
        Thread(#[from] ThreadError),
    }

    #[test]
    fn the_value_comes_back_and_drop_stops_the_body() {
        let (done_tx, done_rx) = mpsc::channel();
        let (value, thread) =
            RuntimeThread::spawn::<_, Refused, _, _>("t", move |ready, stopped| async move {
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
        let err = RuntimeThread::spawn::<(), Refused, _, _>("t", |ready, _| async move {
            let _ = ready.send(Err(Refused::NoPort));
        })
        .err();
        assert_eq!(err.map(|e| e.to_string()).as_deref(), Some("no port"));
    }

    #[test]
    fn a_body_that_ends_without_a_word_is_named() {
        let err = RuntimeThread::spawn::<(), Refused, _, _>("quiet", |_, _| async move {}).err();
        assert_eq!(
            err.map(|e| e.to_string()).as_deref(),
            Some("quiet: the thread ended at start")
        );
    }
}
