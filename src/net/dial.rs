//! Dialing peers: one attempt at a time per peer, each given at most [`ATTEMPT_TIMEOUT`],
//! retried with backoff (100 ms doubling to 2 s), and the reason of a failure logged without
//! flooding the log: at the first failure, when the reason changes, when the backoff reaches
//! its ceiling, and then once a minute while the peer stays unreachable; a line again when it
//! is reached. A connection whose handshake the peer refused after ours completed (our
//! certificate rejected on its side) closes before the peer sends anything, and counts as a
//! failed attempt too.
//!
//! Short attempts and a low ceiling bound how long a link stays down after a partition heals
//! (about one ceiling plus one attempt); a member reported alive by another is dialed at once
//! ([`DialState::hurry`]), so that the links follow the membership. An attempt costs one
//! handshake's first packets: one every 2 s per unreachable peer is little.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// The first retry delay.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest retry delay.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// An attempt whose handshake has not completed by then counts as failed (a timeout), and
/// the next one starts afresh: a handshake begun while the peer was cut off would otherwise
/// retransmit at ever longer intervals (up to the idle timeout) after the cut is lifted.
pub(crate) const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
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
    /// Wakes a scheduled attempt that waits out its backoff.
    pub wake: Arc<Notify>,
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

    /// Another member reported the peer alive: the backoff starts over, and an attempt
    /// waiting out its delay is made now. Returns whether an attempt is scheduled or under
    /// way (none is: the caller dials). What was logged is kept, so that a peer reported
    /// alive again and again does not log a line each time.
    pub(crate) fn hurry(&mut self) -> bool {
        self.failures = 0;
        if self.dialing {
            self.wake.notify_waiters();
        }
        self.dialing
    }

    /// The peer was heard: forget the failures; return how many there were.
    pub(crate) fn reached(&mut self) -> u32 {
        self.logged = None;
        std::mem::take(&mut self.failures)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_to_its_ceiling() {
        let delays: Vec<Duration> = (1..=7).map(backoff).collect();
        let ms = |n| Duration::from_millis(n);
        assert_eq!(
            delays,
            [
                ms(100),
                ms(200),
                ms(400),
                ms(800),
                ms(1600),
                ms(2000),
                ms(2000)
            ]
        );
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }

    #[test]
    fn a_peer_reported_alive_starts_its_backoff_over_without_logging_again() {
        let start = Instant::now();
        let mut state = DialState::default();
        let mut logged = 0;
        for i in 0..8 {
            let (_, log) = state.failed(Failure::Timeout, start + Duration::from_secs(i));
            logged += usize::from(log);
        }
        // The first failure and the ceiling were logged.
        assert_eq!(logged, 2);
        assert_eq!(state.failed(Failure::Timeout, start).0, MAX_BACKOFF);
        // Nothing scheduled: the caller is to dial.
        assert!(!state.hurry());
        state.dialing = true;
        assert!(state.hurry());
        let (delay, log) = state.failed(Failure::Timeout, start + Duration::from_secs(9));
        assert_eq!(delay, FIRST_BACKOFF);
        assert!(
            !log,
            "the same reason within the minute is not logged again"
        );
    }

    #[tokio::test]
    async fn hurry_wakes_an_attempt_waiting_out_its_backoff() {
        let mut state = DialState {
            dialing: true,
            ..DialState::default()
        };
        let wake = Arc::clone(&state.wake);
        let waiting = tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(3600)) => false,
                () = wake.notified() => true,
            }
        });
        // Until the task waits, a wake-up is not stored for it: hurry until it is woken.
        for _ in 0..1000 {
            if waiting.is_finished() {
                break;
            }
            state.hurry();
            tokio::task::yield_now().await;
        }
        assert!(waiting.is_finished(), "still waiting out its backoff");
        assert!(waiting.await.unwrap());
    }
}
