//! A global decision: ready at once, or on its way (a mesh node's answer after the key's
//! owner granted). What the transport returns and the policy file's `mesh` backend awaits,
//! apart from both.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::{Decision, MeshCharge};

/// A global decision, and for an admission what it took (`None`: nothing to give back, or
/// the backend cannot give it back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeshAnswer {
    /// The decision.
    pub decision: Decision,
    /// What an admission took, for [`crate::backend::mesh::GlobalLimits::refund`].
    pub charge: Option<MeshCharge>,
}

impl From<Decision> for MeshAnswer {
    fn from(decision: Decision) -> Self {
        MeshAnswer {
            decision,
            charge: None,
        }
    }
}

/// A global decision: ready at once (the node's lease decided), or on its way from the key's
/// owner.
#[derive(Debug)]
pub enum MeshDecision {
    /// Decided.
    Ready(Option<MeshAnswer>),
    /// The request waits for the owner's answer; `fallback` answers if the node stops first.
    Waiting {
        /// Where the answer arrives.
        answer: tokio::sync::oneshot::Receiver<MeshAnswer>,
        /// The decision if no answer ever comes (the node shut down).
        fallback: Decision,
    },
}

impl MeshDecision {
    /// The decision if it is ready, or `fallback` without waiting.
    pub fn now_or(self, fallback: Decision) -> Decision {
        self.answer_now_or(fallback).decision
    }

    /// The answer (the decision and what it took) if it is ready, or `fallback` without
    /// waiting.
    pub fn answer_now_or(self, fallback: Decision) -> MeshAnswer {
        match self {
            MeshDecision::Ready(Some(a)) => a,
            MeshDecision::Ready(None) => fallback.into(),
            MeshDecision::Waiting { mut answer, .. } => {
                answer.try_recv().unwrap_or_else(|_| fallback.into())
            }
        }
    }

    /// The answer: the decision, and what an admission took (awaiting the decision alone
    /// gives only the decision).
    pub async fn answer(self) -> MeshAnswer {
        match self {
            // No answer at all: nothing was admitted.
            MeshDecision::Ready(a) => a.unwrap_or_else(|| Decision::cannot_fit(0).into()),
            MeshDecision::Waiting { answer, fallback } => {
                answer.await.unwrap_or_else(|_| fallback.into())
            }
        }
    }
}

impl Future for MeshDecision {
    type Output = Decision;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Decision> {
        match self.get_mut() {
            MeshDecision::Ready(a) => {
                Poll::Ready(a.take().expect("polled after completion").decision)
            }
            MeshDecision::Waiting { answer, fallback } => match Pin::new(answer).poll(cx) {
                Poll::Ready(Ok(a)) => Poll::Ready(a.decision),
                Poll::Ready(Err(_)) => Poll::Ready(*fallback),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}
