//! A global decision: ready at once, or on its way (a mesh node's answer after the key's
//! owner granted). What the transport returns and the policy file's `mesh` backend awaits,
//! apart from both.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::Decision;

/// A global decision: ready at once (the node's lease decided), or on its way from the key's
/// owner.
#[derive(Debug)]
pub enum MeshDecision {
    /// Decided.
    Ready(Option<Decision>),
    /// The request waits for the owner's answer; `fallback` answers if the node stops first.
    Waiting {
        /// Where the answer arrives.
        answer: tokio::sync::oneshot::Receiver<Decision>,
        /// The decision if no answer ever comes (the node shut down).
        fallback: Decision,
    },
}

impl MeshDecision {
    /// The decision if it is ready, or `fallback` without waiting.
    pub fn now_or(self, fallback: Decision) -> Decision {
        match self {
            MeshDecision::Ready(Some(d)) => d,
            MeshDecision::Ready(None) => fallback,
            MeshDecision::Waiting { mut answer, .. } => answer.try_recv().unwrap_or(fallback),
        }
    }
}

impl Future for MeshDecision {
    type Output = Decision;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Decision> {
        match self.get_mut() {
            MeshDecision::Ready(d) => Poll::Ready(d.take().expect("polled after completion")),
            MeshDecision::Waiting { answer, fallback } => match Pin::new(answer).poll(cx) {
                Poll::Ready(Ok(d)) => Poll::Ready(d),
                Poll::Ready(Err(_)) => Poll::Ready(*fallback),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}
