//! The mesh: how gateway nodes enforce one global limit per key without a central store.
//!
//! Every key has one *authority*, kept by the key's owner (rendezvous hashing over the live
//! members) and backed up on its successor. The authority runs the policy's algorithm for
//! the whole cluster and leases tokens to the nodes that use the key; a node admits locally
//! from its lease (one compare-and-swap), and asks for more when it runs short. So the
//! cluster never admits more than the authority granted, and a node under its limit only
//! ever waits for its owner, never gets denied because the limit is shared.
//! `docs/overshoot.md` states the bound and its proof.
//!
//! Sans-IO throughout (no sockets, no clock): [`Node`] is the per-node state machine; a
//! transport feeds it frames and timer ticks and sends what it returns ([`Transmit`]).
//! The frames between nodes (`message`), their codec and checks (`wire`, the only parser of
//! peer bytes) and a holding's grow-only counts (`tally`, a CRDT) are private: the wire is
//! described in `docs/operations.md`, and a refused frame is a typed [`FrameError`].
//!
//! Inside (private modules, for readers of the source): `membership` (liveness, ownership,
//! headers), `timing` (peers' clock offsets), `holder` (a key's lease and waiting requests
//! on one node), `authority` (a key's budget), `lease` (the atomic cell the request path
//! decides on), `cells` (the map of cells shared with the request path), `keymap` (the hasher
//! of the node's maps), `windows` (where a policy's windows fall: lengths or calendar
//! periods), and `outbox` (frames, and the checks on incoming ones).

pub(crate) mod authority;
pub(crate) mod cells;
pub(crate) mod holder;
pub(crate) mod keymap;
pub(crate) mod lease;
pub(crate) mod locks;
pub(crate) mod membership;
pub(crate) mod message;
pub(crate) mod node;
pub(crate) mod outbox;
pub(crate) mod tally;
pub(crate) mod timing;
pub(crate) mod windows;
pub(crate) mod wire;

pub use crate::decision::MeshCharge;
pub use cells::{Behind, Cells};
pub use lease::{LeaseCell, Miss};
pub use membership::weight as rendezvous_weight;
pub use node::{
    ASK_APP, ASK_KEY, ASK_RESET, AdminMessage, Admit, DEFAULT_GOSSIP_BUDGET_BYTES_PER_S, Event,
    KeyView, LeaseState, Leased, Leases, MeshError, Node, NodeConfig, NodeStats, SavedKey,
    WhileJoining,
};
pub use outbox::Transmit;
pub use wire::WireError;
pub use wire::check::FrameError;

pub use crate::ids::{KeyHasher, NodeId};
