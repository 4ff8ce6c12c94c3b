//! `/metrics`: the Prometheus text of the node's counters. Decisions are counted by the
//! tower layer as they happen (`ratemesh_decisions_total{policy,outcome}`); the mesh and
//! transport figures are read from the node at each scrape.

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::daemon::DaemonError;
use crate::net::MeshNet;
use crate::net::accept::Refusal;

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

    /// Read the node's figures and render every metric; `policy_sha256` gives the hash of the
    /// policy file in force (`ratemesh_config_info`). It is read after the counters, so a
    /// scrape that shows a reload's `ratemesh_config_reloads_total` also shows its hash
    /// (a reload stores the hash before it counts itself).
    pub(crate) fn render(
        &self,
        id: u64,
        mesh: &MeshNet,
        policy_sha256: impl FnOnce() -> String,
    ) -> String {
        let (
            members,
            suspected,
            deaths,
            node_stats,
            keys,
            authorities,
            running,
            joined,
            majority,
            lag,
        ) = mesh.with_node(|n| {
            let m = n.membership();
            (
                m.alive_count(),
                m.peers()
                    .values()
                    .filter(|p| p.alive && p.suspect_since.is_some())
                    .count(),
                m.peers().values().map(|p| u64::from(p.deaths)).sum::<u64>(),
                n.stats(),
                n.key_count(),
                n.authority_count(),
                n.is_running(),
                n.is_joined(),
                m.has_majority(),
                n.lag_score(),
            )
        });
        let peers_up = mesh.peers_up().iter().filter(|&&peer| peer != id).count();
        let mismatch = mesh.config_mismatch().len();
        metrics::gauge!("ratemesh_config_mismatch").set(mismatch as f64);
        metrics::counter!("ratemesh_mesh_policy_changes_total").absolute(node_stats.policy_changes);
        let net = mesh.stats();
        let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        metrics::gauge!("ratemesh_node_running").set(if running { 1.0 } else { 0.0 });
        metrics::gauge!("ratemesh_members").set(members as f64);
        metrics::gauge!("ratemesh_mesh_members").set(members as f64);
        metrics::gauge!("ratemesh_mesh_suspected").set(suspected as f64);
        metrics::counter!("ratemesh_peer_deaths_total").absolute(deaths);
        if let Some(bytes) = resident_bytes() {
            metrics::gauge!("process_resident_memory_bytes").set(bytes as f64);
        }
        metrics::gauge!("ratemesh_mesh_lag_score").set(f64::from(lag));
        metrics::gauge!("ratemesh_mesh_joining").set(if joined { 0.0 } else { 1.0 });
        metrics::counter!("ratemesh_mesh_joining_decisions_total")
            .absolute(node_stats.joining_decisions);
        metrics::gauge!("ratemesh_peers_up").set(peers_up as f64);
        metrics::gauge!("ratemesh_majority").set(if majority { 1.0 } else { 0.0 });
        metrics::gauge!("ratemesh_mesh_keys").set(keys as f64);
        metrics::gauge!("ratemesh_mesh_authorities").set(authorities as f64);
        metrics::counter!("ratemesh_gossip_rounds_total").absolute(node_stats.rounds);
        metrics::counter!("ratemesh_mesh_waits_total").absolute(node_stats.waits);
        metrics::counter!("ratemesh_mesh_first_credit_total").absolute(node_stats.credited);
        metrics::counter!("ratemesh_mesh_wait_timeouts_total")
            .absolute(node_stats.timeouts + load(&net.late));
        metrics::counter!("ratemesh_mesh_grants_total").absolute(node_stats.grants);
        metrics::counter!("ratemesh_mesh_lockouts_total").absolute(node_stats.lockouts);
        metrics::counter!("ratemesh_mesh_overflow_decisions_total")
            .absolute(mesh.cells().overflowed());
        metrics::counter!("ratemesh_mesh_shed_decisions_total").absolute(load(&net.shed));
        metrics::counter!("ratemesh_mesh_takeovers_total").absolute(node_stats.promotions);
        metrics::counter!("ratemesh_mesh_handoffs_total", "direction" => "sent")
            .absolute(node_stats.handoffs_sent);
        metrics::counter!("ratemesh_mesh_handoffs_total", "direction" => "received")
            .absolute(node_stats.handoffs_received);
        metrics::counter!("ratemesh_gossip_messages_sent_total", "kind" => "datagram")
            .absolute(load(&net.datagrams_sent));
        metrics::counter!("ratemesh_gossip_messages_sent_total", "kind" => "stream")
            .absolute(load(&net.streams_sent));
        metrics::counter!("ratemesh_gossip_bytes_sent_total").absolute(load(&net.bytes_sent));
        metrics::counter!("ratemesh_gossip_held_back_items_total")
            .absolute(node_stats.gossip_held_back);
        metrics::counter!("ratemesh_gossip_messages_received_total")
            .absolute(node_stats.frames_received);
        metrics::counter!("ratemesh_gossip_dropped_frames_total", "reason" => "invalid")
            .absolute(node_stats.frames_dropped);
        metrics::counter!("ratemesh_gossip_dropped_frames_total", "reason" => "no_connection")
            .absolute(load(&net.unroutable));
        metrics::counter!("ratemesh_gossip_dropped_frames_total", "reason" => "reliable_lost")
            .absolute(load(&net.reliable_lost));
        metrics::counter!("ratemesh_reliable_frames_held_total").absolute(load(&net.reliable_held));
        metrics::counter!("ratemesh_peer_connections_refused_total").absolute(load(&net.refused));
        metrics::counter!("ratemesh_peer_dial_failures_total").absolute(load(&net.dial_failures));
        for reason in Refusal::ALL {
            metrics::counter!("ratemesh_quic_refused_handshakes_total", "reason" => reason.label())
                .absolute(mesh.refusals().count(reason));
        }
        self.handle.run_upkeep();
        let mut text = self.handle.render();
        let policy_sha256 = policy_sha256();
        // One series only, whose label changes on reload: written here rather than through
        // the recorder, which would keep the old label's series.
        text.push_str(
            "# HELP ratemesh_config_info The policy file in force: the SHA-256 of its bytes\n\
             # TYPE ratemesh_config_info gauge\n",
        );
        text.push_str(&format!(
            "ratemesh_config_info{{hash=\"{policy_sha256}\"}} 1\n"
        ));
        text
    }
}

/// The process's resident memory (Linux: `/proc/self/statm`, in pages).
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf takes no pointer.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(page).ok().map(|page| pages * page)
}

fn describe() {
    use metrics::{describe_counter, describe_gauge};
    describe_counter!(
        "ratemesh_decisions_total",
        "Decisions by policy and outcome (allowed, denied, shadow_denied)"
    );
    describe_counter!(
        "ratemesh_concurrency_reclaimed_total",
        "Slots of a concurrency policy reclaimed after max_hold, their response still running (the only way past its limit)"
    );
    describe_gauge!(
        "ratemesh_config_mismatch",
        "Live peers whose configuration digest (mesh policies, key_secret, env) differs from \
         this node's; while any does, each mesh policy is enforced with the lowest limit among them"
    );
    describe_counter!(
        "ratemesh_mesh_policy_changes_total",
        "Changes of the limits mesh policies are enforced with (reloads, peers' differing limits)"
    );
    describe_gauge!(
        "ratemesh_node_running",
        "1 once every peer answered this node's start (or was declared dead)"
    );
    describe_gauge!(
        "ratemesh_members",
        "Live members as this node sees them, itself included (same as ratemesh_mesh_members)"
    );
    describe_gauge!(
        "ratemesh_mesh_members",
        "Live members as this node sees them, itself included (suspected ones count; dead, \
         departed and not yet heard ones do not)"
    );
    describe_gauge!(
        "ratemesh_mesh_suspected",
        "Members silent long enough to be suspected (still members until declared dead)"
    );
    describe_gauge!(
        "process_resident_memory_bytes",
        "The node process's resident memory (Linux)"
    );
    describe_counter!(
        "ratemesh_peer_deaths_total",
        "Times this node declared a peer dead (a peer that comes back and dies again counts again)"
    );
    describe_gauge!(
        "ratemesh_mesh_joining",
        "1 while this node has not joined its cluster (it decides by while_joining)"
    );
    describe_counter!(
        "ratemesh_mesh_joining_decisions_total",
        "Mesh decisions made by while_joining, before the node joined its cluster"
    );
    describe_gauge!(
        "ratemesh_peers_up",
        "Peers connected with a completed handshake, heard from in the last 3 s"
    );
    describe_gauge!("ratemesh_mesh_keys", "Keys the mesh node holds state for");
    describe_counter!(
        "ratemesh_mesh_first_credit_total",
        "Requests for a key this node held nothing of, admitted before the key's owner answered (mesh_first_credit)"
    );
    describe_gauge!(
        "ratemesh_majority",
        "1 while this node heard a majority of the live members at its last check (it may take over keys)"
    );
    describe_gauge!(
        "ratemesh_mesh_authorities",
        "Keys whose budget this node keeps (it owns them)"
    );
    describe_counter!("ratemesh_gossip_rounds_total", "Gossip rounds run");
    describe_counter!(
        "ratemesh_mesh_waits_total",
        "Requests that waited for their key's owner (their node's lease was short)"
    );
    describe_counter!(
        "ratemesh_mesh_wait_timeouts_total",
        "Waiting requests denied because the owner did not answer within mesh_max_wait (or the node took them too late)"
    );
    describe_counter!(
        "ratemesh_mesh_grants_total",
        "Leases granted by this node's authorities"
    );
    describe_counter!(
        "ratemesh_mesh_takeovers_total",
        "Keys taken over from a dead owner's backup"
    );
    describe_counter!(
        "ratemesh_mesh_handoffs_total",
        "Keys whose budget moved to or from this node (membership changes)"
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
        "ratemesh_config_reloads_total",
        "Policy file reloads on SIGHUP, by result (applied, refused)"
    );
    describe_gauge!(
        "ratemesh_plan_keys",
        "API keys listed in the plans file in force (`plans_file`)"
    );
    describe_counter!(
        "ratemesh_requests_refused_total",
        "Requests refused before any decision, by reason (identity_too_long, body_too_large, body_timeout, body_invalid)"
    );
    describe_gauge!("ratemesh_http_connections", "HTTP connections open");
    describe_counter!(
        "ratemesh_http_connection_cap_reached_total",
        "Times the accept loop found http.max_connections reached and waited for a connection to close"
    );
    // Shown from the start (alert rules name it): 0 until the cap is first reached.
    metrics::counter!("ratemesh_http_connection_cap_reached_total").increment(0);
    describe_counter!(
        "ratemesh_http_connections_closed_total",
        "HTTP connections the node closed, by reason (header_timeout, idle_timeout, write_timeout)"
    );
    describe_counter!(
        "ratemesh_peer_connections_refused_total",
        "Peer connections refused (certificate from another CA, none, or not a member)"
    );
    describe_counter!(
        "ratemesh_quic_refused_handshakes_total",
        "Handshakes on the peer port refused, by reason (not_quic, tls, timeout, unknown_member, busy)"
    );
    describe_counter!(
        "ratemesh_peer_dial_failures_total",
        "Failed attempts to reach a peer (each is retried with backoff)"
    );
}
