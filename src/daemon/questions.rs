//! The questions peers ask this node for the admin API, over the mesh (`net::admin`),
//! answered from the node's own rules whether or not it has an `[admin]` port: a local
//! policy's key on this node (read, or reset), overrides to take, and a page of this node's
//! overrides (the pull of `daemon::overrides`' anti-entropy, which runs here too).

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::daemon::overrides::{Overrides, PAGE, Record};
use crate::http::RateLimitLayer;
use crate::mesh::{ASK_APP, NodeId};
use crate::net::{MeshNet, Question};

/// A local policy's key on the node asked: read it, or reset it ([`LocalKeyAsk`]).
pub(crate) const ASK_LOCAL_KEY: u32 = ASK_APP + 1;

/// Overrides to take (a JSON list of records), answered with how many changed the table.
pub(crate) const ASK_OVERRIDES: u32 = ASK_APP + 2;

/// A page of the node's overrides ([`PullAsk`]), unless its table's digest is the asker's.
pub(crate) const ASK_OVERRIDES_PAGE: u32 = ASK_APP + 3;

/// A policy's heaviest keys on the node asked ([`TopAsk`]), answered with a [`TopAnswer`].
pub(crate) const ASK_TOP: u32 = ASK_APP + 4;

/// The most keys a node lists in a [`TopAnswer`] (within a question's 16 KiB).
pub(crate) const MAX_TOP: usize = 100;

/// A policy's heaviest keys, as asked of a node.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TopAsk {
    pub(crate) policy: String,
    pub(crate) denied: bool,
    pub(crate) n: usize,
}

/// A node's summary of a policy's heaviest keys: `(key, count, error)` by count.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TopAnswer {
    pub(crate) total: u64,
    pub(crate) floor: u64,
    pub(crate) entries: Vec<(u64, u64, u64)>,
    /// Bytes the policy's sketches take on the node.
    #[serde(default)]
    pub(crate) memory_bytes: usize,
}

/// How often a node pulls a random peer's overrides.
const PULL_EVERY: Duration = Duration::from_secs(10);

/// How long a question waits for its answer.
pub(crate) const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// A page of overrides asked for.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PullAsk {
    /// The asker's digest: equal, the answer is `{"same": true}`.
    digest: u64,
    after: Option<(String, u64)>,
}

/// A page of overrides.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Page {
    #[serde(default)]
    same: bool,
    #[serde(default)]
    records: Vec<Record>,
    #[serde(default)]
    more: bool,
}

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

/// Answer the questions peers ask, and pull a random peer's overrides every 10 s (applying
/// what changed, dropping what ended), until the node stops (the tasks are aborted).
pub(crate) fn serve(
    mesh: Arc<MeshNet>,
    layer: RateLimitLayer,
    overrides: Arc<Overrides>,
) -> [tokio::task::JoinHandle<()>; 2] {
    let mut questions = mesh.admin_questions();
    let answering = {
        let (mesh, layer, overrides) = (Arc::clone(&mesh), layer.clone(), Arc::clone(&overrides));
        tokio::spawn(async move {
            while let Some(question) = questions.recv().await {
                let body = answer(&layer, &overrides, &question);
                mesh.answer(&question, body);
            }
        })
    };
    let pulling = tokio::spawn(async move {
        let mut every = tokio::time::interval(PULL_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let now = layer.now_ns();
            let rules = layer.rules();
            for (policy, key) in overrides.sweep(now / 1_000_000) {
                let _ = rules.set_override(&policy, key, None, now);
            }
            rules.sweep_overrides(now);
            let me = mesh.with_node(|n| n.config().id);
            let peers: Vec<NodeId> = mesh
                .with_node(|n| n.members())
                .into_iter()
                .filter(|&(id, alive)| alive && id != me)
                .map(|(id, _)| id)
                .collect();
            if peers.is_empty() {
                continue;
            }
            let peer = peers[fastrand::usize(..peers.len())];
            pull(&mesh, &layer, &overrides, peer).await;
        }
    });
    [answering, pulling]
}

/// Take `peer`'s overrides that this node lacks, page by page.
async fn pull(mesh: &MeshNet, layer: &RateLimitLayer, overrides: &Overrides, peer: NodeId) {
    let mut after = None;
    loop {
        let ask = PullAsk {
            digest: overrides.digest(),
            after: after.clone(),
        };
        let body = serde_json::to_vec(&ask).unwrap_or_default();
        let Ok(answer) = mesh.ask(peer, ASK_OVERRIDES_PAGE, body, ASK_TIMEOUT).await else {
            return;
        };
        let Ok(page) = serde_json::from_slice::<Page>(&answer) else {
            return;
        };
        if page.same {
            return;
        }
        after = page.records.last().map(|r| (r.policy.clone(), r.key));
        take(layer, overrides, page.records);
        if !page.more || after.is_none() {
            return;
        }
    }
}

/// Merge `records` into the table (on disk first) and apply those that changed it; return
/// how many did.
pub(crate) fn take(layer: &RateLimitLayer, overrides: &Overrides, records: Vec<Record>) -> usize {
    // What no node would set itself is not taken (counted, logged once per batch).
    let (records, refused): (Vec<Record>, Vec<Record>) =
        records.into_iter().partition(|r| r.check().is_ok());
    if let Some(first) = refused.first() {
        let why = first.check().err().unwrap_or_default();
        tracing::warn!(
            refused = refused.len(),
            why,
            "overrides from a peer not taken"
        );
        metrics::counter!("ratemesh_overrides_refused_total").increment(refused.len() as u64);
    }
    match overrides.merge(records, true) {
        Ok(changed) => {
            let rules = layer.rules();
            let now = layer.now_ns();
            for record in &changed {
                Overrides::apply(&rules, record, now);
            }
            changed.len()
        }
        Err(error) => {
            tracing::error!(%error, "overrides not taken");
            0
        }
    }
}

/// Send `records` to every live member but this node: the members that took them, and
/// those that did not answer (they pull them later).
pub(crate) async fn send_overrides(
    mesh: &Arc<MeshNet>,
    records: &[Record],
) -> (Vec<NodeId>, Vec<NodeId>) {
    let me = mesh.with_node(|n| n.config().id);
    let body = serde_json::to_vec(records).unwrap_or_default();
    let mut asks = tokio::task::JoinSet::new();
    for (node, alive) in mesh.with_node(|n| n.members()) {
        if node == me || !alive {
            continue;
        }
        let (mesh, body) = (Arc::clone(mesh), body.clone());
        asks.spawn(async move { (node, mesh.ask(node, ASK_OVERRIDES, body, ASK_TIMEOUT).await) });
    }
    let (mut took, mut missed) = (vec![me], Vec::new());
    while let Some(Ok((node, answer))) = asks.join_next().await {
        match answer {
            Ok(_) => took.push(node),
            Err(_) => missed.push(node),
        }
    }
    took.sort_unstable();
    missed.sort_unstable();
    (took, missed)
}

/// The answer to `question` (JSON; `{"error": …}` for one this node cannot answer).
fn answer(layer: &RateLimitLayer, overrides: &Overrides, question: &Question) -> Vec<u8> {
    let refused = |why: &str| serde_json::json!({ "error": why }).to_string().into_bytes();
    match question.kind {
        ASK_OVERRIDES => match serde_json::from_slice::<Vec<Record>>(&question.body) {
            Ok(records) if records.len() <= PAGE => {
                let changed = take(layer, overrides, records);
                serde_json::json!({ "changed": changed })
                    .to_string()
                    .into_bytes()
            }
            _ => refused("bad_question"),
        },
        ASK_TOP => {
            let Ok(ask) = serde_json::from_slice::<TopAsk>(&question.body) else {
                return refused("bad_question");
            };
            let n = ask.n.min(MAX_TOP);
            let Some((summary, memory_bytes)) =
                layer
                    .rules()
                    .top(&ask.policy, ask.denied, n, layer.now_ns())
            else {
                return refused("unknown_policy");
            };
            serde_json::to_vec(&TopAnswer {
                total: summary.total,
                floor: summary.floor,
                entries: summary
                    .entries
                    .iter()
                    .map(|e| (e.key, e.count, e.error))
                    .collect(),
                memory_bytes,
            })
            .unwrap_or_default()
        }
        ASK_OVERRIDES_PAGE => {
            let Ok(ask) = serde_json::from_slice::<PullAsk>(&question.body) else {
                return refused("bad_question");
            };
            let page = if ask.after.is_none() && ask.digest == overrides.digest() {
                Page {
                    same: true,
                    ..Page::default()
                }
            } else {
                let (records, more) = overrides.page(ask.after.as_ref(), PAGE);
                Page {
                    same: false,
                    records,
                    more,
                }
            };
            serde_json::to_vec(&page).unwrap_or_default()
        }
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
