//! `/metrics`: the Prometheus text of the node's counters. Decisions are counted by the
//! tower layer as they happen (`ratemesh_decisions_total{policy,outcome}`); the mesh and
//! transport figures are read from the node at each scrape.

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::daemon::DaemonError;
use crate::net::MeshNet;

/// The node's Prometheus recorder.
pub(crate) struct Exporter {
    handle: PrometheusHandle,
}

impl Exporter {
    /// Install the process-wide recorder (once per process).
    pub(crate) fn install() -> Result<Exporter, DaemonError> {
        let handle = PrometheusBuilder::new()
            .install_recorder()
            .map_err(|e| DaemonError::Metrics(e.to_string()))?;
        describe();
        Ok(Exporter { handle })
    }

    /// Read the node's figures and render every metric.
    pub(crate) fn render(&self, id: u64, mesh: &MeshNet) -> String {
        let (members, node_stats, keys, running) =
            mesh.with_node(|n| (n.members(), n.stats(), n.key_count(), n.is_running()));
        let size = mesh.with_node(|n| n.config().cluster_size).max(1);
        let alive = members.iter().filter(|(_, up)| *up).count();
        let peers_up = members
            .iter()
            .filter(|(member, up)| *up && *member != id)
            .count();
        let net = mesh.stats();
        let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        metrics::gauge!("ratemesh_node_running").set(if running { 1.0 } else { 0.0 });
        metrics::gauge!("ratemesh_members").set(members.len() as f64);
        metrics::gauge!("ratemesh_peers_up").set(peers_up as f64);
        metrics::gauge!("ratemesh_mesh_keys").set(keys as f64);
        metrics::gauge!("ratemesh_overshoot_bound_estimate")
            .set(overshoot_bound_estimate(alive, size));
        metrics::counter!("ratemesh_gossip_rounds_total").absolute(node_stats.rounds);
        metrics::counter!("ratemesh_gossip_consistent_rounds_total")
            .absolute(node_stats.consistent_rounds);
        metrics::counter!("ratemesh_gossip_messages_sent_total", "kind" => "datagram")
            .absolute(load(&net.datagrams_sent));
        metrics::counter!("ratemesh_gossip_messages_sent_total", "kind" => "stream")
            .absolute(load(&net.streams_sent));
        metrics::counter!("ratemesh_gossip_bytes_sent_total").absolute(load(&net.bytes_sent));
        metrics::counter!("ratemesh_gossip_messages_received_total")
            .absolute(load(&net.frames_received));
        metrics::counter!("ratemesh_gossip_dropped_frames_total", "reason" => "invalid")
            .absolute(load(&net.frames_dropped));
        metrics::counter!("ratemesh_gossip_dropped_frames_total", "reason" => "no_connection")
            .absolute(load(&net.unroutable));
        metrics::counter!("ratemesh_peer_connections_refused_total").absolute(load(&net.refused));
        self.handle.run_upkeep();
        self.handle.render()
    }
}

/// The declared worst-case overshoot right now, as a fraction of each mesh limit, with
/// every member holding the even share: 0 while every member is heard; otherwise the
/// shares of the smaller side of a possible partition (the members this node cannot hear,
/// or this node's side when it is the smaller one). A crashed member admits nothing, so
/// the real overshoot is then lower.
pub(crate) fn overshoot_bound_estimate(alive: usize, cluster_size: usize) -> f64 {
    let dead = cluster_size.saturating_sub(alive);
    dead.min(alive) as f64 / cluster_size.max(1) as f64
}

fn describe() {
    use metrics::{describe_counter, describe_gauge};
    describe_counter!(
        "ratemesh_decisions_total",
        "Decisions by policy and outcome (allowed, denied, shadow_denied)"
    );
    describe_gauge!(
        "ratemesh_node_running",
        "1 once the node recovered its state from a majority and admits"
    );
    describe_gauge!(
        "ratemesh_members",
        "Members this node knows, itself included"
    );
    describe_gauge!("ratemesh_peers_up", "Peers this node hears");
    describe_gauge!("ratemesh_mesh_keys", "Keys the mesh node holds state for");
    describe_gauge!(
        "ratemesh_overshoot_bound_estimate",
        "Declared worst-case overshoot now, as a fraction of each mesh limit (even shares)"
    );
    describe_counter!("ratemesh_gossip_rounds_total", "Gossip rounds run");
    describe_counter!(
        "ratemesh_gossip_consistent_rounds_total",
        "Rounds with a complete, consistent view (claims allowed)"
    );
    describe_counter!(
        "ratemesh_gossip_messages_sent_total",
        "Gossip frames sent, as QUIC datagrams or streams"
    );
    describe_counter!("ratemesh_gossip_bytes_sent_total", "Gossip bytes sent");
    describe_counter!(
        "ratemesh_gossip_messages_received_total",
        "Gossip frames received and applied"
    );
    describe_counter!(
        "ratemesh_gossip_dropped_frames_total",
        "Frames dropped: refused by the decoder or validation, or for a peer with no connection"
    );
    describe_counter!(
        "ratemesh_peer_connections_refused_total",
        "Peer connections refused (certificate from another CA, none, or not a member)"
    );
}

#[cfg(test)]
mod tests {
    use super::overshoot_bound_estimate;

    #[test]
    fn bound_is_the_smaller_side() {
        assert_eq!(overshoot_bound_estimate(3, 3), 0.0);
        assert!((overshoot_bound_estimate(2, 3) - 1.0 / 3.0).abs() < 1e-9);
        assert!((overshoot_bound_estimate(1, 3) - 1.0 / 3.0).abs() < 1e-9);
        assert!((overshoot_bound_estimate(3, 5) - 2.0 / 5.0).abs() < 1e-9);
    }
}
