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
//! Sans-IO throughout (no sockets, no clock): [`node::Node`] is the per-node state machine,
//! made of [`membership`] (liveness, ownership, headers), [`timing`] (peers' clock offsets),
//! [`holder`] (a key's lease and waiting requests on one node), [`authority`] (a key's
//! budget), [`lease`] (the atomic cell the request path decides on), [`cells`] (the map of
//! cells shared with the request path), [`keymap`] (the hasher of the node's maps),
//! [`outbox`] (frames, and the checks on incoming ones), [`message`] (what travels), [`wire`] (the only parser of peer bytes) and
//! [`baseline`] (the rules the simulator compares with).

pub mod authority;
pub mod baseline;
pub mod cells;
pub mod counter;
pub mod holder;
pub mod keymap;
pub mod lease;
pub mod membership;
pub mod message;
pub mod node;
pub mod outbox;
pub mod timing;
pub mod wire;

pub use authority::MeshKind;
pub use baseline::Admission;
pub use cells::Cells;
pub use node::{Admit, Event, MeshError, Node, NodeConfig, NodeStats};
pub use outbox::{FrameError, Transmit};

pub use crate::ids::NodeId;
