//! The bodies the proxy streams, one piece at a time and never whole: [`Relay`] passes a
//! body on, counting its bytes against a limit and ending it with an error when it pauses
//! longer than the route's timeout. On the request side it also notes, in a shared
//! [`Progress`], when the last piece went by and whether it is waiting on the client, so the
//! wait for the upstream's answer can tell a slow upstream from a slow client.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// Why a relayed body ended early.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    /// The request body is longer than the route's `max_body_bytes`.
    #[error("the request body is longer than {max} bytes")]
    TooLarge {
        /// The route's limit.
        max: u64,
    },
    /// No piece of the body for the route's timeout.
    #[error("the body paused for more than {timeout:?}")]
    Stalled {
        /// The route's timeout.
        timeout: Duration,
    },
    /// The other side's stream failed (a reset, a malformed chunk).
    #[error("the body could not be read: {0}")]
    Read(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// What the wait for a response head reads of the request body's stream.
#[derive(Debug)]
pub(crate) struct Progress {
    start: Instant,
    /// Nanoseconds from `start` to the last piece relayed.
    last: AtomicU64,
    /// The relay is waiting for the client's next piece (not for the upstream to take one).
    waiting_on_client: AtomicBool,
    /// The body has ended (all of it relayed, or an error).
    done: AtomicBool,
}

impl Progress {
    /// A body whose stream starts now.
    pub(crate) fn new() -> Arc<Progress> {
        Arc::new(Progress {
            start: Instant::now(),
            last: AtomicU64::new(0),
            waiting_on_client: AtomicBool::new(false),
            done: AtomicBool::new(false),
        })
    }

    /// When the last piece went by (or the stream started).
    pub(crate) fn last(&self) -> Instant {
        self.start + Duration::from_nanos(self.last.load(Ordering::Relaxed))
    }

    /// Tell whether the relay is waiting for the client, whose pause the relay times itself.
    pub(crate) fn waiting_on_client(&self) -> bool {
        !self.done.load(Ordering::Relaxed) && self.waiting_on_client.load(Ordering::Relaxed)
    }

    fn note(&self, now: Instant) {
        let nanos = u64::try_from((now - self.start).as_nanos()).unwrap_or(u64::MAX);
        self.last.store(nanos, Ordering::Relaxed);
    }
}

/// A body passed on piece by piece: at most `max` bytes, no pause longer than `timeout`.
pub(crate) struct Relay<B> {
    body: B,
    timeout: Duration,
    /// Bytes still allowed (`u64::MAX`: no limit).
    left: u64,
    max: u64,
    last: Instant,
    /// Created at the first pause, reset only when it fires early.
    sleep: Option<Pin<Box<Sleep>>>,
    progress: Option<Arc<Progress>>,
    /// Count its failures in `ratemesh_proxy_errors_total` (the response side; the request
    /// side's failures are counted where the request's answer is made).
    count_errors: bool,
    ended: bool,
}

impl<B> Relay<B> {
    /// A request body: at most `max` bytes (`None`: no limit), reporting to `progress`.
    pub(crate) fn request(
        body: B,
        max: Option<u64>,
        timeout: Duration,
        progress: Option<Arc<Progress>>,
    ) -> Self {
        Relay {
            body,
            timeout,
            left: max.unwrap_or(u64::MAX),
            max: max.unwrap_or(u64::MAX),
            last: Instant::now(),
            sleep: None,
            progress,
            count_errors: false,
            ended: false,
        }
    }

    /// An upstream's response body.
    pub(crate) fn response(body: B, timeout: Duration) -> Self {
        Relay {
            count_errors: true,
            ..Relay::request(body, None, timeout, None)
        }
    }

    fn end(&mut self, error: BodyError) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.ended = true;
        if let Some(progress) = &self.progress {
            progress.done.store(true, Ordering::Relaxed);
        }
        if self.count_errors {
            let reason = match error {
                BodyError::Stalled { .. } => "response_stalled",
                _ => "response_aborted",
            };
            metrics::counter!("ratemesh_proxy_errors_total", "reason" => reason).increment(1);
            tracing::debug!(%error, "upstream response cut");
        }
        Poll::Ready(Some(Err(error)))
    }

    /// Poll the pause timer; `Ready` when the body paused longer than the timeout.
    fn poll_pause(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            let deadline = self.last + self.timeout;
            let sleep = self
                .sleep
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            ready!(sleep.as_mut().poll(cx));
            if Instant::now() >= deadline {
                return Poll::Ready(());
            }
            // Pieces went by since the timer was set: wait from the last one.
            sleep.as_mut().reset(deadline);
        }
    }
}

impl<B> Body for Relay<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let len = data.len() as u64;
                    if len > this.left {
                        return this.end(BodyError::TooLarge { max: this.max });
                    }
                    this.left -= len;
                }
                this.last = Instant::now();
                if let Some(progress) = &this.progress {
                    progress.waiting_on_client.store(false, Ordering::Relaxed);
                    progress.note(this.last);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => this.end(BodyError::Read(error.into())),
            Poll::Ready(None) => {
                this.ended = true;
                if let Some(progress) = &this.progress {
                    progress.done.store(true, Ordering::Relaxed);
                }
                Poll::Ready(None)
            }
            Poll::Pending => {
                if let Some(progress) = &this.progress {
                    progress.waiting_on_client.store(true, Ordering::Relaxed);
                }
                match this.poll_pause(cx) {
                    Poll::Ready(()) => this.end(BodyError::Stalled {
                        timeout: this.timeout,
                    }),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};

    /// A body fed through a channel.
    struct Channel(tokio::sync::mpsc::Receiver<Bytes>);

    impl Body for Channel {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            self.0
                .poll_recv(cx)
                .map(|piece| piece.map(|b| Ok(Frame::data(b))))
        }
    }

    #[tokio::test]
    async fn a_body_over_the_limit_ends_with_too_large() {
        let body = Full::new(Bytes::from(vec![0u8; 10]));
        let mut relay = Relay::request(body, Some(9), Duration::from_secs(1), None);
        let error = relay.frame().await.unwrap().unwrap_err();
        assert!(matches!(error, BodyError::TooLarge { max: 9 }), "{error}");
        assert!(relay.frame().await.is_none());

        let body = Full::new(Bytes::from(vec![0u8; 10]));
        let relay = Relay::request(body, Some(10), Duration::from_secs(1), None);
        assert_eq!(relay.collect().await.unwrap().to_bytes().len(), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_longer_than_the_timeout_ends_the_body() {
        let (sender, receiver) = tokio::sync::mpsc::channel(1);
        let progress = Progress::new();
        let mut relay = Relay::request(
            Channel(receiver),
            None,
            Duration::from_secs(2),
            Some(Arc::clone(&progress)),
        );
        sender.send(Bytes::from_static(b"a")).await.unwrap();
        assert!(relay.frame().await.unwrap().is_ok());
        let before = Instant::now();
        let error = relay.frame().await.unwrap().unwrap_err();
        assert!(matches!(error, BodyError::Stalled { .. }), "{error}");
        assert_eq!(Instant::now() - before, Duration::from_secs(2));
        assert!(
            !progress.waiting_on_client(),
            "an ended body waits on no one"
        );
        drop(sender);
    }
}
