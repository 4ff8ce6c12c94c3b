//! The questions peers ask this node for the admin API, over the mesh (`net::admin`),
//! answered from the node's own rules whether or not it has an `[admin]` port: a local
//! policy's key on this node (read, or reset), and the heaviest keys of a policy here.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::http::RateLimitLayer;
use crate::mesh::ASK_APP;
use crate::net::{MeshNet, Question};

/// A local policy's key on the node asked: read it, or reset it ([`LocalKeyAsk`]).
pub(crate) const ASK_LOCAL_KEY: u32 = ASK_APP + 1;

/// A local policy's key, as asked of a node.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LocalKeyAsk {
    pub(crate) policy: String,
    pub(crate) key: u64,
    pub(crate) reset: bool,
}

/// What a node answers of a local policy's key.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct LocalKeyAnswer {
    pub(crate) known: bool,
    pub(crate) limit: u64,
    pub(crate) remaining: u64,
    pub(crate) reset_after_ms: u64,
    pub(crate) lockout_ms: u64,
}

/// Answer the questions peers ask, until the node stops (the task is aborted with it).
pub(crate) fn serve(mesh: Arc<MeshNet>, layer: RateLimitLayer) -> tokio::task::JoinHandle<()> {
    let mut questions = mesh.admin_questions();
    tokio::spawn(async move {
        while let Some(question) = questions.recv().await {
            let body = answer(&layer, &question);
            mesh.answer(&question, body);
        }
    })
}

/// The answer to `question` (JSON; `{"error": …}` for one this node cannot answer).
fn answer(layer: &RateLimitLayer, question: &Question) -> Vec<u8> {
    let refused = |why: &str| serde_json::json!({ "error": why }).to_string().into_bytes();
    match question.kind {
        ASK_LOCAL_KEY => {
            let Ok(ask) = serde_json::from_slice::<LocalKeyAsk>(&question.body) else {
                return refused("bad_question");
            };
            let rules = layer.rules();
            let now = layer.now_ns();
            let Some(state) = rules.local_key(&ask.policy, ask.key, now, ask.reset) else {
                return refused("unknown_policy");
            };
            if ask.reset {
                tracing::info!(
                    target: "ratemesh::admin",
                    policy = ask.policy,
                    key = format_args!("{:016x}", ask.key),
                    asked_by = question.from,
                    "local key reset"
                );
                metrics::counter!("ratemesh_admin_resets_total", "policy" => ask.policy.clone(), "backend" => "local")
                    .increment(1);
            }
            let d = state.decision;
            serde_json::to_vec(&LocalKeyAnswer {
                known: state.known,
                limit: d.limit,
                remaining: if ask.reset { d.limit } else { d.remaining },
                reset_after_ms: if ask.reset {
                    0
                } else {
                    d.reset_after_ns.div_ceil(1_000_000)
                },
                lockout_ms: if ask.reset {
                    0
                } else {
                    state.lockout_ns.div_ceil(1_000_000)
                },
            })
            .unwrap_or_default()
        }
        _ => refused("unknown_question"),
    }
}
