//! Stopping on ctrl-c or SIGTERM, listened for from the moment a long-running command starts.
//!
//! A worker's start can take seconds (opening a store another engine is writing, migrating
//! it), and a SIGTERM that came before anything listened would end the process outright
//! instead of letting it stop cleanly. So the signals are registered when the command begins,
//! before its store is opened; one that comes early is kept and answered once the command
//! waits for it.

#[cfg(unix)]
use tokio::signal::unix::{Signal, SignalKind, signal};

/// The signals a command stops on, registered from its creation on.
#[derive(Debug)]
pub(crate) struct Shutdown {
    #[cfg(unix)]
    term: Option<Signal>,
    #[cfg(unix)]
    interrupt: Option<Signal>,
}

impl Shutdown {
    /// Starts listening now. Must be called inside the tokio runtime.
    pub(crate) fn listen() -> Self {
        #[cfg(unix)]
        {
            Shutdown {
                term: signal(SignalKind::terminate()).ok(),
                interrupt: signal(SignalKind::interrupt()).ok(),
            }
        }
        #[cfg(not(unix))]
        {
            Shutdown {}
        }
    }

    /// Returns once ctrl-c or SIGTERM came (also one that came before this was called).
    pub(crate) async fn wait(self) {
        #[cfg(unix)]
        {
            let Shutdown { term, interrupt } = self;
            match (term, interrupt) {
                (Some(mut term), Some(mut interrupt)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = interrupt.recv() => {}
                    }
                }
                (Some(mut one), None) | (None, Some(mut one)) => {
                    let _ = one.recv().await;
                }
                (None, None) => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
