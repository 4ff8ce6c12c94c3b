//! The accepting side of the peer port. A handshake whose certificate the cluster CA signed
//! and that names exactly one node (`node-<id>.ratemesh`) is a member's, known or new: the
//! id comes from the certificate and goes to the driver with the connection (a new member
//! is added to the node and told to the others). Anything else is dropped quietly: counted by reason
//! (`ratemesh_quic_refused_handshakes_total{reason}`), and logged in at most one line per
//! [`LOG_EVERY`] that sums up what was dropped, never one line per packet. The acceptor runs
//! in its own task, so a flood of junk does not hold up the driver that carries the gossip,
//! and at most [`MAX_HANDSHAKES`] handshakes are in progress at once (quinn itself holds at
//! most [`crate::net::tls::MAX_PENDING_HANDSHAKES`] not yet looked at).
//!
//! Datagrams that do not even parse as a QUIC Initial (too short, another version, a short
//! header for no known connection) never reach the acceptor: quinn drops them without a
//! word, and they are not counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, mpsc};

use crate::mesh::NodeId;
use crate::net::tls::peer_id;
use crate::net::{Input, NetShared};

/// At most one log line about refused handshakes per this interval.
pub(crate) const LOG_EVERY: Duration = Duration::from_secs(10);

/// The most handshakes in progress at once; beyond it new ones are ignored (`busy`).
pub(crate) const MAX_HANDSHAKES: usize = 256;

/// Why a handshake on the peer port was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The first packet looked like a QUIC Initial but did not decrypt: not QUIC.
    NotQuic,
    /// The TLS handshake failed (a certificate from another CA, none, or a bad one).
    Tls,
    /// The handshake started and never finished.
    Timeout,
    /// A valid certificate of the cluster CA that names no node (`node-<id>.ratemesh`), or
    /// several.
    UnknownMember,
    /// Too many handshakes in progress at once.
    Busy,
}

impl Refusal {
    /// Every reason, in the order of `Refusals::counts`.
    pub const ALL: [Refusal; 5] = [
        Refusal::NotQuic,
        Refusal::Tls,
        Refusal::Timeout,
        Refusal::UnknownMember,
        Refusal::Busy,
    ];

    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::NotQuic => "not_quic",
            Refusal::Tls => "tls",
            Refusal::Timeout => "timeout",
            Refusal::UnknownMember => "unknown_member",
            Refusal::Busy => "busy",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// Tell whether this is a peer that tried to join and was refused (as opposed to noise).
    fn is_peer(self) -> bool {
        matches!(self, Refusal::Tls | Refusal::UnknownMember)
    }
}

/// The refused handshakes: counters, and what the next log line will sum up.
#[derive(Debug, Default)]
pub struct Refusals {
    /// Refused handshakes by reason, in the order of [`Refusal::ALL`].
    pub counts: [AtomicU64; 5],
    log: Mutex<LogWindow>,
}

#[derive(Debug, Default)]
struct LogWindow {
    last_line: Option<Instant>,
    pending: [u64; 5],
    last_detail: String,
}

impl Refusals {
    /// Count one refusal; log a summary line when none was written in the last
    /// [`LOG_EVERY`].
    fn refuse(&self, reason: Refusal, detail: impl FnOnce() -> String) {
        self.counts[reason.index()].fetch_add(1, Ordering::Relaxed);
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.pending[reason.index()] += 1;
        if reason.is_peer() || log.last_detail.is_empty() {
            log.last_detail = detail();
        }
        if log.last_line.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
            log.write();
        }
    }

    /// Log what was refused since the last line, if anything and if the last line is
    /// older than [`LOG_EVERY`].
    fn flush(&self) {
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        if log.pending.iter().any(|&n| n > 0)
            && log.last_line.is_none_or(|at| at.elapsed() >= LOG_EVERY)
        {
            log.write();
        }
    }

    /// The count of `reason`.
    pub fn count(&self, reason: Refusal) -> u64 {
        self.counts[reason.index()].load(Ordering::Relaxed)
    }
}

impl LogWindow {
    fn write(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        let detail = std::mem::take(&mut self.last_detail);
        let total: u64 = pending.iter().sum();
        let by_reason = Refusal::ALL
            .iter()
            .zip(pending)
            .filter(|(_, n)| *n > 0)
            .map(|(r, n)| format!("{}={n}", r.label()))
            .collect::<Vec<_>>()
            .join(" ");
        let every = LOG_EVERY.as_secs();
        tracing::warn!(
            refused = total,
            %by_reason,
            last = %detail,
            "peer port: refused {total} handshake(s) that were not QUIC from a cluster member \
             ({by_reason}); at most one such line every {every}s"
        );
        self.last_line = Some(Instant::now());
    }
}

/// Accept connections on `endpoint` until it closes: a member's goes to the driver as
/// [`Input::Connected`]; anything else is refused and counted in `shared`. A connection
/// from this node itself (a seed address that is its own) is closed without a word.
pub(crate) async fn accept_loop(
    endpoint: quinn::Endpoint,
    me: NodeId,
    inputs: mpsc::UnboundedSender<Input>,
    shared: Arc<NetShared>,
) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    let mut flush = tokio::time::interval(LOG_EVERY);
    flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let incoming = tokio::select! {
            incoming = endpoint.accept() => incoming,
            _ = flush.tick() => {
                shared.refusals.flush();
                continue;
            }
        };
        let Some(incoming) = incoming else { return };
        let Ok(permit) = Arc::clone(&handshakes).try_acquire_owned() else {
            incoming.ignore();
            shared.refusals.refuse(Refusal::Busy, || {
                format!("more than {MAX_HANDSHAKES} handshakes in progress")
            });
            continue;
        };
        let remote = incoming.remote_address();
        let connecting = match incoming.accept() {
            Ok(connecting) => connecting,
            Err(error) => {
                shared
                    .refusals
                    .refuse(Refusal::NotQuic, || format!("from {remote}: {error}"));
                continue;
            }
        };
        let inputs = inputs.clone();
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let _permit = permit;
            let connection = match connecting.await {
                Ok(connection) => connection,
                Err(error) => {
                    let reason = if matches!(error, quinn::ConnectionError::TimedOut) {
                        Refusal::Timeout
                    } else {
                        shared.stats.refused.fetch_add(1, Ordering::Relaxed);
                        Refusal::Tls
                    };
                    shared
                        .refusals
                        .refuse(reason, || format!("from {remote}: {error}"));
                    return;
                }
            };
            match peer_id(&connection) {
                Ok(id) if id == me => connection.close(3u32.into(), b"this is you"),
                Ok(id) => {
                    let _ = inputs.send(Input::Connected(id, connection));
                }
                Err(error) => {
                    shared.stats.refused.fetch_add(1, Ordering::Relaxed);
                    shared
                        .refusals
                        .refuse(Refusal::UnknownMember, || format!("from {remote}: {error}"));
                    connection.close(2u32.into(), b"not a member");
                }
            }
        });
    }
}
