//! The atomics that the request path uses, routed to loom when built with `--cfg ratemesh_loom`.
//!
//! Only this module names the atomic types of the per-key cells, so the loom models in
//! `tests/loom_cells.rs` check the same compare-and-swap code that production runs.

#[cfg(ratemesh_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(ratemesh_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
