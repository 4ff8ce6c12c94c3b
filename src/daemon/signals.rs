//! The signals a node answers: SIGHUP (reload), SIGTERM (drain), SIGINT (stop now).
//! Installed before the node reports ready, so none of them ever kills it by default.

/// One signal the node received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    /// SIGHUP: re-read the policy file.
    Hangup,
    /// SIGTERM: drain.
    Terminate,
    /// SIGINT (Ctrl-C): stop at once.
    Interrupt,
}

/// The node's signal handlers.
pub(crate) struct Signals {
    #[cfg(unix)]
    hangup: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    /// Install the handlers (inside a Tokio runtime).
    pub(crate) fn install() -> std::io::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Signals {
                hangup: signal(SignalKind::hangup())?,
                terminate: signal(SignalKind::terminate())?,
                interrupt: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        {
            Ok(Signals {})
        }
    }

    /// Wait for the next signal.
    pub(crate) async fn next(&mut self) -> Signal {
        #[cfg(unix)]
        {
            tokio::select! {
                Some(()) = self.hangup.recv() => Signal::Hangup,
                Some(()) = self.terminate.recv() => Signal::Terminate,
                Some(()) = self.interrupt.recv() => Signal::Interrupt,
                else => std::future::pending().await,
            }
        }
        #[cfg(not(unix))]
        {
            match tokio::signal::ctrl_c().await {
                Ok(()) => Signal::Interrupt,
                Err(_) => std::future::pending().await,
            }
        }
    }
}
