//! A whole gateway node in your own process: what `ratemesh node` runs (feature `node`).
//!
//! [`NodeFile::from_file`] reads and checks a node file (the format is in
//! `docs/operations.md`); [`check`] checks its certificates and compiles its policies
//! without starting (`ratemesh node --check-config`); [`start`] binds its HTTP and QUIC ports, joins the cluster and serves
//! when [`RunningNode::serve`] is awaited, until the process gets SIGTERM (then it drains and
//! hands its keys over).
//!
//! ```no_run
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let file = ratemesh::node::NodeFile::from_file("node.toml")?;
//! let node = ratemesh::node::start(&file).await?;
//! println!("serving HTTP on {}, the mesh on {}", node.http_addr(), node.quic_addr());
//! node.serve().await;
//! # Ok(()) }
//! ```

pub use crate::daemon::node_file::{
    Admin, EnvoyRls, ForwardAuth, Forwarded, HttpSettings, NodeFile, ProxyRoute, State, TlsFiles,
    Traces,
};
pub use crate::daemon::{DaemonError, RunningNode, check, start};
