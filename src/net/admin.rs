//! The admin API's questions between nodes, over the mesh's streams: a mesh key's state or
//! reset from its owner ([`MeshNet::key_state`]), and the embedding program's own questions
//! to a peer ([`MeshNet::ask`]) and from peers ([`MeshNet::admin_questions`],
//! [`MeshNet::answer`]). A question waits at most its timeout; an answer that comes later is
//! dropped.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::MeshNet;
use crate::clock::Clock;
use crate::mesh::{ASK_KEY, ASK_RESET, AdminMessage, KeyView, NodeId};

/// The most questions from peers waiting for the program to take them.
const QUESTIONS_QUEUED: usize = 1024;

/// The most questions to peers waiting for their answers.
const MAX_WAITING: usize = 4096;

/// A question from a peer (or this node) for the program: answer it with
/// [`MeshNet::answer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// Who asks.
    pub from: NodeId,
    /// Its number for the question.
    pub id: u64,
    /// What is asked (from [`crate::mesh::ASK_APP`] on).
    pub kind: u32,
    /// The question.
    pub body: Vec<u8>,
}

/// Why a question to a peer got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdminError {
    /// No mesh policy of that number.
    #[error("no mesh policy number {0}")]
    UnknownPolicy(u32),
    /// The question could not be sent (too long, or too many wait).
    #[error("the question could not be sent: {0}")]
    NotSent(&'static str),
    /// No answer in time (the peer is unreachable, or the node stopped).
    #[error("node {node} did not answer within {waited_ms} ms")]
    NoAnswer {
        /// The node asked.
        node: NodeId,
        /// How long the question waited.
        waited_ms: u64,
    },
    /// The peer answered with nothing it understood, or something this node cannot read.
    #[error("node {0} did not understand the question")]
    NotUnderstood(NodeId),
}

/// Questions waiting for answers, and the channel questions from peers go to.
#[derive(Default)]
pub(super) struct AdminWaiters {
    waiting: HashMap<u64, oneshot::Sender<(NodeId, Vec<u8>)>>,
    questions: Option<mpsc::Sender<Question>>,
}

impl AdminWaiters {
    /// Route a message the node gave: an answer to its waiter, a question to the program
    /// (dropped if it takes none, or too many wait).
    pub(super) fn deliver(&mut self, message: AdminMessage) {
        match message {
            AdminMessage::Answered { from, id, body } => {
                if let Some(waiter) = self.waiting.remove(&id) {
                    let _ = waiter.send((from, body));
                }
            }
            AdminMessage::Asked {
                from,
                id,
                kind,
                body,
            } => {
                if let Some(questions) = &self.questions {
                    let _ = questions.try_send(Question {
                        from,
                        id,
                        kind,
                        body,
                    });
                }
            }
        }
    }

    fn wait(&mut self, id: u64) -> Result<oneshot::Receiver<(NodeId, Vec<u8>)>, AdminError> {
        if self.waiting.len() >= MAX_WAITING {
            // Drop the waiters whose callers gave up.
            self.waiting.retain(|_, w| !w.is_closed());
            if self.waiting.len() >= MAX_WAITING {
                return Err(AdminError::NotSent("too many questions wait"));
            }
        }
        let (tx, rx) = oneshot::channel();
        self.waiting.insert(id, tx);
        Ok(rx)
    }
}

impl MeshNet {
    /// Ask the owner of `key` under mesh policy `policy` for its state, or to reset it
    /// (`reset`), waiting at most `timeout` for the answer.
    pub async fn key_state(
        &self,
        policy: u32,
        key: u64,
        reset: bool,
        timeout: Duration,
    ) -> Result<KeyView, AdminError> {
        let kind = if reset { ASK_RESET } else { ASK_KEY };
        let (answer, owner) = {
            let mut inner = self.shared.inner.lock();
            let now = self.shared.clock.now_ns();
            let (id, owner) = inner
                .node
                .ask_owner(now, policy, key, kind)
                .ok_or(AdminError::UnknownPolicy(policy))?;
            let answer = inner.admin.wait(id)?;
            // An owner that is this node answered at once.
            while let Some(message) = inner.node.poll_admin() {
                inner.admin.deliver(message);
            }
            (answer, owner)
        };
        self.shared.wake.notify_one();
        let (from, body) = self.await_answer(answer, owner, timeout).await?;
        KeyView::decode(&body).ok_or(AdminError::NotUnderstood(from))
    }

    /// Ask `to` question `kind` (from [`crate::mesh::ASK_APP`] on) with `body`; wait at
    /// most `timeout` for its answer.
    pub async fn ask(
        &self,
        to: NodeId,
        kind: u32,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, AdminError> {
        let answer = {
            let mut inner = self.shared.inner.lock();
            let id = inner
                .node
                .ask_peer(to, kind, body)
                .ok_or(AdminError::NotSent("the question is too long"))?;
            let answer = inner.admin.wait(id)?;
            while let Some(message) = inner.node.poll_admin() {
                inner.admin.deliver(message);
            }
            answer
        };
        self.shared.wake.notify_one();
        let (_, body) = self.await_answer(answer, to, timeout).await?;
        Ok(body)
    }

    /// Take the questions peers (and this node, through [`MeshNet::ask`]) ask the program,
    /// from now on: the last caller gets them.
    pub fn admin_questions(&self) -> mpsc::Receiver<Question> {
        let (tx, rx) = mpsc::channel(QUESTIONS_QUEUED);
        let mut inner = self.shared.inner.lock();
        inner.admin.questions = Some(tx);
        rx
    }

    /// Answer `question` with `body` (at most 16 KiB; longer is answered empty).
    pub fn answer(&self, question: &Question, body: Vec<u8>) {
        {
            let mut inner = self.shared.inner.lock();
            inner.node.reply(question.from, question.id, body);
            while let Some(message) = inner.node.poll_admin() {
                inner.admin.deliver(message);
            }
        }
        self.shared.wake.notify_one();
    }

    /// Enforce `limit` on `key` of mesh policy `policy` from now on, or (`None`) the
    /// policy's own limit again (see [`crate::mesh::Node::set_override`]).
    pub fn set_override(&self, policy: u32, key: u64, limit: Option<u64>) {
        {
            let mut inner = self.shared.inner.lock();
            let now = self.shared.clock.now_ns();
            inner.node.set_override(now, policy, key, limit);
        }
        self.shared.wake.notify_one();
    }

    /// What changed among the long-window counts worth saving
    /// ([`crate::mesh::Node::snapshot_changes`]).
    pub fn snapshot_changes(&self) -> Vec<crate::mesh::SavedKey> {
        let now = self.shared.clock.now_ns();
        self.shared.inner.lock().node.snapshot_changes(now)
    }

    /// Take back what was saved before a restart ([`crate::mesh::Node::restore_saved`]);
    /// return how many keys were taken.
    pub fn restore_saved(&self, saved: Vec<crate::mesh::SavedKey>) -> usize {
        let now = self.shared.clock.now_ns();
        self.shared.inner.lock().node.restore_saved(saved, now)
    }

    async fn await_answer(
        &self,
        answer: oneshot::Receiver<(NodeId, Vec<u8>)>,
        node: NodeId,
        timeout: Duration,
    ) -> Result<(NodeId, Vec<u8>), AdminError> {
        let no_answer = AdminError::NoAnswer {
            node,
            waited_ms: timeout.as_millis() as u64,
        };
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok((from, body))) if body.is_empty() => Err(AdminError::NotUnderstood(from)),
            Ok(Ok(answered)) => Ok(answered),
            _ => Err(no_answer),
        }
    }
}
