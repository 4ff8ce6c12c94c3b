//! A concurrency policy's slots, held by an admitted request until its response ends:
//! [`Held`] gives them back when dropped (the service failed, the client went away before
//! the answer), and [`HoldingBody`] carries it in the response's body, giving them back
//! when the body's last frame is read or the body is dropped (the client went away while
//! it streamed).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use http_body::{Frame, SizeHint};

use crate::clock::Clock;
use crate::rules::{Outcome, Pending, Rules};

/// The slots an admitted request holds, given back once, when dropped.
pub(crate) struct Held {
    rules: Arc<Rules>,
    clock: Arc<dyn Clock>,
    pending: Vec<Pending>,
}

impl Held {
    /// The slots `outcome` holds (charged by `rules`), if any.
    pub(crate) fn of(
        outcome: &Outcome,
        rules: &Arc<Rules>,
        clock: &Arc<dyn Clock>,
    ) -> Option<Held> {
        let pending: Vec<Pending> = outcome
            .pending
            .iter()
            .filter(|p| p.holds_slots())
            .copied()
            .collect();
        (!pending.is_empty()).then(|| Held {
            rules: Arc::clone(rules),
            clock: Arc::clone(clock),
            pending,
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let now = self.clock.now_ns();
        for pending in &self.pending {
            if !pending.needs_io() {
                let _ = self.rules.release(pending, now);
                continue;
            }
            // A `redis` policy's slots go back in a task of their own; without a runtime
            // (the program is stopping) they are reclaimed at `max_hold`.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let (rules, pending) = (Arc::clone(&self.rules), *pending);
                runtime.spawn(async move {
                    if let Some(refund) = rules.release(&pending, now) {
                        // A failure is counted and logged where it happened.
                        let _ = refund.await;
                    }
                });
            }
        }
    }
}

/// A response body that holds its request's slots until its end.
pub(crate) struct HoldingBody {
    body: Body,
    held: Option<Held>,
}

impl HoldingBody {
    /// `body`, holding `held` until it ends.
    pub(crate) fn wrap(body: Body, held: Held) -> Body {
        Body::new(HoldingBody {
            body,
            held: Some(held),
        })
    }
}

impl HttpBody for HoldingBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            this.held = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
