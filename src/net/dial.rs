//! Dialing peers: one attempt at a time per peer, retried with backoff (100 ms doubling to
//! 5 s), and the reason of a failure logged without flooding the log: at the first failure,
//! when the reason changes, when the backoff reaches its ceiling, and then once a minute
//! while the peer stays unreachable; a line again when it is reached. A connection whose
//! handshake the peer refused after ours completed (our certificate rejected on its side)
//! closes before the peer sends anything, and counts as a failed attempt too.

use std::time::{Duration, Instant};

/// The first retry delay.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest retry delay.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// While the backoff is at its ceiling, at most one log line per peer per this interval.
pub(crate) const LOG_AT_CEILING_EVERY: Duration = Duration::from_secs(60);

/// What kind of failure, to tell a change of reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The TLS handshake failed, on our side or the peer's.
    Tls,
    /// No answer.
    Timeout,
    /// The peer's certificate names another node.
    WrongIdentity,
    /// Anything else (closed, reset, no route).
    Other,
}

/// Why a connection failed: its kind and a sentence for the log.
pub(crate) fn describe(error: &quinn::ConnectionError) -> (Failure, String) {
    use quinn::ConnectionError as E;
    let crypto = |code: u64| (0x100..0x200).contains(&code);
    match error {
        E::TimedOut => (
            Failure::Timeout,
            "timeout: no answer (is it running, and is its address right?)".to_string(),
        ),
        E::TransportError(e) if crypto(u64::from(e.code)) => {
            (Failure::Tls, format!("TLS refused by this node: {e}"))
        }
        E::ConnectionClosed(close) if crypto(u64::from(close.error_code)) => (
            Failure::Tls,
            format!("TLS refused by the peer: {close} (is this node's certificate from its CA?)"),
        ),
        other => (Failure::Other, other.to_string()),
    }
}

/// The retry delay after `failures` failed attempts in a row.
pub(crate) fn backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    FIRST_BACKOFF
        .saturating_mul(1 << doublings)
        .min(MAX_BACKOFF)
}

/// One peer's dialing: failures in a row and what was logged about them.
#[derive(Debug, Default)]
pub(crate) struct DialState {
    /// Failed attempts since the peer was last heard.
    pub failures: u32,
    /// An attempt is scheduled or in progress.
    pub dialing: bool,
    /// When the last line about this peer was logged, with the kind and delay it named.
    logged: Option<(Instant, Failure, Duration)>,
}

impl DialState {
    /// Count a failed attempt of `kind` at `now`; return the next retry delay and whether
    /// to log it.
    pub(crate) fn failed(&mut self, kind: Failure, now: Instant) -> (Duration, bool) {
        self.failures = self.failures.saturating_add(1);
        let delay = backoff(self.failures);
        let log = match self.logged {
            None => true,
            Some((at, last_kind, last_delay)) => {
                last_kind != kind
                    || (delay == MAX_BACKOFF && last_delay < MAX_BACKOFF)
                    || now.duration_since(at) >= LOG_AT_CEILING_EVERY
            }
        };
        if log {
            self.logged = Some((now, kind, delay));
        }
        (delay, log)
    }

    /// The peer was heard: forget the failures; return how many there were.
    pub(crate) fn reached(&mut self) -> u32 {
        self.logged = None;
        std::mem::take(&mut self.failures)
    }
}
