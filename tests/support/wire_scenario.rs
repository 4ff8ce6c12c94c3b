// The fixed scenario of `src/mesh/wire/compat.rs` (kept apart so that the previous
// release's build can run the very same code to record its frames).

/// The scenario's mesh policies: a sliding window, a token bucket, a fixed window.
fn scenario_policies() -> Vec<ratemesh::Policy> {
    use std::time::Duration;
    vec![
        ratemesh::Policy::global_sliding_window(100, Duration::from_secs(1)).unwrap(),
        ratemesh::Policy::token_bucket(50, Duration::from_secs(1), 50).unwrap(),
        ratemesh::Policy::global_fixed_window(30, Duration::from_secs(1)).unwrap(),
    ]
}

/// A fixed three-node scenario on instant links, stepped a millisecond at a time for 0.4 s:
/// three mesh policies (a sliding window, a token bucket, a fixed window), requests on 24
/// keys spread over the nodes, some over their limit, and node 3 drained at 0.34 s (its
/// leases given back, its authorities handed over). Returns every frame sent, in order:
/// `(from, to, reliable, bytes)`.
fn wire_scenario() -> Vec<(u64, u64, bool, Vec<u8>)> {
    const MS: u64 = 1_000_000;
    const START: u64 = 1_000_000_000_000;
    let policies = scenario_policies();
    let mut nodes: Vec<ratemesh::mesh::Node> = (1..=3u64)
        .map(|id| {
            let mut c = ratemesh::mesh::NodeConfig::new(id, vec![1, 2, 3], policies.clone());
            c.incarnation = 7 + id;
            ratemesh::mesh::Node::new(c, START).unwrap()
        })
        .collect();
    let mut sent = Vec::new();
    let mut queue: Vec<(u64, u64, bool, Vec<u8>)> = Vec::new();
    let mut now = START;
    for step in 0..400u64 {
        now += MS;
        for (i, n) in nodes.iter_mut().enumerate() {
            if step == 340 && i == 2 {
                n.leave(now);
            }
            if n.poll_timeout() <= now {
                n.handle_timeout(now);
            }
            if step % 3 == i as u64 {
                let key = 1 + (step * 7 + i as u64) % 24;
                let policy = (key % 3) as u32;
                let cost = 1 + key % 2;
                let _ = n.decide(policy, key, cost, now);
            }
        }
        // Deliver everything sent, and what that sends, at this instant.
        for _ in 0..16 {
            for (i, n) in nodes.iter_mut().enumerate() {
                while let Some(t) = n.poll_transmit() {
                    queue.push((i as u64 + 1, t.to, t.reliable, t.bytes));
                }
            }
            if queue.is_empty() {
                break;
            }
            for (from, to, reliable, bytes) in std::mem::take(&mut queue) {
                if let Some(n) = nodes.get_mut(to as usize - 1) {
                    let _ = n.handle_frame(now, from, &bytes);
                }
                sent.push((from, to, reliable, bytes));
            }
        }
    }
    sent
}
