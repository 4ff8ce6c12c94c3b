//! A bounded soak under hostile input (about 65 s): three `ratemesh node` processes on
//! loopback hold one mesh limit (200 per 1 s window) under load at three times the limit,
//! while one node is killed (SIGKILL) and restarted every few seconds, every node gets
//! SIGHUPs with good and bad policy files, slow clients trickle request heads at every node
//! and a flood of idle connections hits one. Asserted: no node dies but the one the test
//! kills, every restart becomes healthy, every node refuses each bad file and applies each
//! good one, the admissions whose round trip lay inside one 1 s window never exceed the
//! limit (the declared bound: the killed node never owns the key, so the crash term is 0;
//! see docs/overshoot.md), the limit is approached (some window admits half of it), and
//! each node's resident memory stays under [`RSS_BOUND_KIB`]. With `RATEMESH_TIMED_CHECKS=1`
//! (a quiet machine) also: at least twice the limit is answered per second.

mod support;

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::*;

/// The mesh limit: requests per 1 s window, cluster-wide.
const LIMIT: u64 = 200;
/// Offered load: requests per second across the nodes (3x the limit).
const OFFERED_PER_S: u64 = 3 * LIMIT;
/// Kill-and-restart cycles.
const CYCLES: usize = 12;
/// No node's resident set may exceed this (KiB).
const RSS_BOUND_KIB: u64 = 160 * 1024;
/// The API key under load.
const KEY: &str = "soak-client";

fn policy_file(burst: u64) -> String {
    format!(
        "env = \"soak\"\nkey_secret = \"soak-secret\"\ndefault_tier = \"api\"\n\n\
         [policies.global]\nalgorithm = \"fixed-window\"\nlimit = {LIMIT}\nwindow = \"1s\"\n\
         backend = \"mesh\"\n\n\
         [policies.local_cap]\nalgorithm = \"token-bucket\"\nrate = 100000\nperiod = \"1s\"\n\
         burst = {burst}\n\n[tiers.api]\npolicies = [\"local_cap\", \"global\"]\n"
    )
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

fn raise_own_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain calls on structs we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max.min(65_536);
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// One answered request: when it was sent and answered (ns since the epoch), its status.
struct Answer {
    sent: u64,
    received: u64,
    status: u16,
    /// The node asked (0-based).
    node: usize,
}

/// Keep `count` connections to `addr` that send a request head one header line every
/// 300 ms, reopening each when the node closes it, until `stop`.
fn slow_clients(addr: std::net::SocketAddr, count: usize, stop: Arc<AtomicBool>) {
    let mut conns: Vec<Option<std::net::TcpStream>> = (0..count).map(|_| None).collect();
    while !stop.load(Ordering::Relaxed) {
        for slot in &mut conns {
            let alive = match slot {
                Some(stream) => stream.write_all(b"X-Slow: 1\r\n").is_ok(),
                None => false,
            };
            if !alive {
                *slot = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200))
                    .ok()
                    .filter(|mut s| {
                        s.write_all(b"GET /api/slow HTTP/1.1\r\nHost: x\r\n")
                            .is_ok()
                    });
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Each node's configuration reloads so far: (applied, refused).
async fn reloads_of(client: &reqwest::Client, nodes: &[NodeProcess]) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    for node in nodes {
        let text = metrics_of(client, node).await;
        out.push((
            metric(&text, "ratemesh_config_reloads_total{result=\"applied\"}"),
            metric(&text, "ratemesh_config_reloads_total{result=\"refused\"}"),
        ));
    }
    out
}

/// Wait (10 s at most) until every node's reloads, against `before`, satisfy `done`.
async fn wait_reloads(
    client: &reqwest::Client,
    nodes: &[NodeProcess],
    before: &[(f64, f64)],
    done: impl Fn((f64, f64), (f64, f64)) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = reloads_of(client, nodes).await;
        if now.iter().zip(before).all(|(&n, &b)| done(b, n)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "a reload was not taken: {before:?} then {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_under_kills_reloads_slow_clients_and_a_connection_flood_hold_the_limit() {
    raise_own_open_file_limit();
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 3, &policy_file(100_000));
    for file in &files {
        edit_file(file, |text| {
            with_http_table(
                text,
                "header_read_timeout = \"2s\"\nidle_timeout = \"5s\"\n",
            )
        });
    }
    let policy_path = dir.path().join("policies.toml");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let mut nodes: Vec<NodeProcess> = files.iter().map(|f| start(f)).collect();
    for node in &nodes {
        wait_healthy(&client, node).await;
    }
    let addrs: Vec<std::net::SocketAddr> = nodes.iter().map(|n| n.http).collect();

    // The key's owner holds its authority; the node the test kills is another one, so the
    // declared bound for the key is the limit itself (a crash of a non-owner costs nothing).
    for node in &nodes {
        assert_eq!(status_of(&client, node, KEY).await, 200);
    }
    let mut owner = None;
    for (i, node) in nodes.iter().enumerate() {
        if metric(
            &metrics_of(&client, node).await,
            "ratemesh_mesh_authorities",
        ) >= 1.0
        {
            owner = Some(i);
        }
    }
    let owner = owner.expect("one node owns the key");
    let victim = (owner + 1) % 3;
    eprintln!("owner: node {}, killed: node {}", owner + 1, victim + 1);

    let up: Arc<Vec<AtomicBool>> = Arc::new((0..3).map(|_| AtomicBool::new(true)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let answers: Arc<Mutex<Vec<Answer>>> = Arc::new(Mutex::new(Vec::new()));
    let failed = Arc::new(AtomicU64::new(0));
    // Requests sent and not answered yet.
    let in_flight = Arc::new(AtomicU64::new(0));

    // Load: OFFERED_PER_S requests a second, round-robin over the nodes that are up.
    let load = {
        let addrs = addrs.clone();
        let (up, stop, answers, failed, in_flight, client) = (
            Arc::clone(&up),
            Arc::clone(&stop),
            Arc::clone(&answers),
            Arc::clone(&failed),
            Arc::clone(&in_flight),
            client.clone(),
        );
        tokio::spawn(async move {
            let per_tick = OFFERED_PER_S / 100;
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            let mut next = 0usize;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                for _ in 0..per_tick {
                    next = (next + 1) % 3;
                    if !up[next].load(Ordering::Relaxed) {
                        next = (next + 1) % 3;
                    }
                    let url = format!("http://{}/api/orders", addrs[next]);
                    let request = client.get(url).header("x-api-key", KEY);
                    let (answers, failed) = (Arc::clone(&answers), Arc::clone(&failed));
                    let in_flight = Arc::clone(&in_flight);
                    in_flight.fetch_add(1, Ordering::Relaxed);
                    let node = next;
                    tokio::spawn(async move {
                        let sent = now_ns();
                        match request.send().await {
                            Ok(response) => {
                                let status = response.status().as_u16();
                                let received = now_ns();
                                answers.lock().unwrap().push(Answer {
                                    sent,
                                    received,
                                    status,
                                    node,
                                });
                            }
                            Err(_) => {
                                failed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        in_flight.fetch_sub(1, Ordering::Relaxed);
                    });
                }
            }
        })
    };

    // Slow clients at every node, all along.
    let slow: Vec<_> = addrs
        .iter()
        .map(|&addr| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || slow_clients(addr, 50, stop))
        })
        .collect();

    // Resident memory of every node, twice a second.
    let pids: Arc<Vec<AtomicU64>> = Arc::new(
        nodes
            .iter()
            .map(|n| AtomicU64::new(u64::from(n.child.id())))
            .collect(),
    );
    let max_rss: Arc<Vec<AtomicU64>> = Arc::new((0..3).map(|_| AtomicU64::new(0)).collect());
    let sampler = {
        let (pids, max_rss, stop) = (Arc::clone(&pids), Arc::clone(&max_rss), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for (pid, max) in pids.iter().zip(max_rss.iter()) {
                    if let Some(rss) = rss_kib(pid.load(Ordering::Relaxed) as u32) {
                        max.fetch_max(rss, Ordering::Relaxed);
                    }
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };

    let started = Instant::now();
    let mut restart_ms = Vec::new();
    let mut restarted_at = Vec::new();
    let mut flooded = 0usize;
    for cycle in 0..CYCLES {
        // Kill and restart the victim.
        assert!(
            nodes[victim].child.try_wait().unwrap().is_none(),
            "node {} died on its own",
            victim + 1
        );
        up[victim].store(false, Ordering::Relaxed);
        signal(&nodes[victim], libc::SIGKILL);
        let _ = nodes[victim].child.wait();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let spawned = Instant::now();
        restarted_at.push(now_ns());
        nodes[victim] = start(&files[victim]);
        pids[victim].store(u64::from(nodes[victim].child.id()), Ordering::Relaxed);
        wait_healthy(&client, &nodes[victim]).await;
        restart_ms.push(spawned.elapsed().as_millis());
        up[victim].store(true, Ordering::Relaxed);

        // A flood of idle connections at the owner, held a few seconds, in two cycles.
        let flood = if cycle % 6 == 2 {
            let addr = addrs[owner];
            let held: Vec<std::net::TcpStream> = (0..1500)
                .filter_map(|_| std::net::TcpStream::connect(addr).ok())
                .collect();
            flooded += held.len();
            Some(held)
        } else {
            None
        };

        // A bad policy file, then a good one (alternating a local policy), on every node:
        // each refused, then applied, before the next.
        tokio::time::sleep(Duration::from_millis(800)).await;
        std::fs::write(&policy_path, "[policies.broken\nalgorithm = \n").unwrap();
        let before = reloads_of(&client, &nodes).await;
        for node in &nodes {
            signal(node, libc::SIGHUP);
        }
        wait_reloads(&client, &nodes, &before, |b, n| n.1 > b.1).await;
        let burst = if cycle % 2 == 0 { 100_001 } else { 100_000 };
        std::fs::write(&policy_path, policy_file(burst)).unwrap();
        let before = reloads_of(&client, &nodes).await;
        for node in &nodes {
            signal(node, libc::SIGHUP);
        }
        wait_reloads(&client, &nodes, &before, |b, n| n.0 > b.0).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        drop(flood);
        for (i, node) in nodes.iter_mut().enumerate() {
            assert!(
                node.child.try_wait().unwrap().is_none(),
                "node {} died (cycle {cycle})",
                i + 1
            );
        }
    }
    let soak = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    // The last answers (the client gives up on a request after 2 s).
    let deadline = Instant::now() + Duration::from_secs(10);
    while in_flight.load(Ordering::Relaxed) > 0 {
        assert!(Instant::now() < deadline, "requests never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for thread in slow {
        thread.join().unwrap();
    }
    sampler.join().unwrap();

    // Every node is alive and healthy, and reloads were applied and refused.
    for (i, node) in nodes.iter_mut().enumerate() {
        assert!(
            node.child.try_wait().unwrap().is_none(),
            "node {} died",
            i + 1
        );
        wait_healthy(&client, node).await;
        let text = metrics_of(&client, node).await;
        eprintln!(
            "node {}: {} shed, {} wait timeouts, {} overflow",
            i + 1,
            metric(&text, "ratemesh_mesh_shed_decisions_total"),
            metric(&text, "ratemesh_mesh_wait_timeouts_total"),
            metric(&text, "ratemesh_mesh_overflow_decisions_total"),
        );
        assert!(
            metric(&text, "ratemesh_config_reloads_total{result=\"applied\"}") >= 1.0,
            "{text}"
        );
        assert!(
            metric(&text, "ratemesh_config_reloads_total{result=\"refused\"}") >= 1.0,
            "{text}"
        );
    }

    // Windows: admissions whose whole round trip lay inside one 1 s window are certainly
    // in that window of the policy; by response arrival is reported too.
    let answers = answers.lock().unwrap();
    let second = |ns: u64| ns / 1_000_000_000;
    let mut inside = std::collections::BTreeMap::<u64, u64>::new();
    let mut by_arrival = std::collections::BTreeMap::<u64, u64>::new();
    let mut offered = std::collections::BTreeMap::<u64, u64>::new();
    for a in answers.iter() {
        *offered.entry(second(a.sent)).or_default() += 1;
        if a.status == 200 {
            *by_arrival.entry(second(a.received)).or_default() += 1;
            if second(a.sent) == second(a.received) {
                *inside.entry(second(a.sent)).or_default() += 1;
            }
        }
    }
    let admitted = answers.iter().filter(|a| a.status == 200).count();
    let limited = answers.iter().filter(|a| a.status == 429).count();
    let others = answers.len() - admitted - limited;
    let worst_inside = inside.values().copied().max().unwrap_or(0);
    let worst_arrival = by_arrival.values().copied().max().unwrap_or(0);
    let seconds = offered.len().max(1) as u64;
    let answered_per_s = answers.len() as u64 / seconds;
    let rss: Vec<u64> = max_rss.iter().map(|m| m.load(Ordering::Relaxed)).collect();
    eprintln!(
        "soak {soak:?}: {} answered ({answered_per_s}/s), {admitted} admitted ({}/s), \
         {limited} limited, {others} other, {} failed (connection errors, mostly the killed \
         node); worst window {worst_inside}/{LIMIT} (round trip inside), {worst_arrival} by \
         arrival; restarts healthy after {restart_ms:?} ms; {flooded} idle connections; \
         max RSS KiB {rss:?}",
        answers.len(),
        admitted as u64 / seconds,
        failed.load(Ordering::Relaxed)
    );
    assert_eq!(others, 0, "statuses other than 200 and 429");
    if timed_checks() {
        assert!(
            answered_per_s >= 2 * LIMIT,
            "the load reached only {answered_per_s}/s"
        );
    }
    assert!(
        worst_inside >= LIMIT / 2,
        "the limit was never approached: worst window {worst_inside}"
    );
    if worst_inside > LIMIT {
        // What the windows over the limit were made of: each node's admissions (round trip
        // inside), by their answer's offset into the second, and the restarts.
        for (&window, _) in inside.iter().filter(|&(_, &n)| n > LIMIT) {
            for node in 0..3 {
                let mut ms: Vec<u64> = answers
                    .iter()
                    .filter(|a| a.node == node && a.status == 200)
                    .filter(|a| second(a.sent) == window && second(a.received) == window)
                    .map(|a| (a.received % 1_000_000_000) / 1_000_000)
                    .collect();
                ms.sort_unstable();
                eprintln!(
                    "window {window}: node {} admitted {}, answered at {ms:?} ms",
                    node + 1,
                    ms.len()
                );
            }
            let restarts: Vec<i64> = restarted_at
                .iter()
                .filter(|&&t| second(t).abs_diff(window) <= 1)
                .map(|&t| (t as i64 - (window * 1_000_000_000) as i64) / 1_000_000)
                .collect();
            eprintln!("window {window}: restarts at {restarts:?} ms from its start");
        }
    }
    assert!(
        worst_inside <= LIMIT,
        "a window admitted {worst_inside} over the limit of {LIMIT}: {inside:?}"
    );
    assert_eq!(restart_ms.len(), CYCLES);
    for (i, &kib) in rss.iter().enumerate() {
        assert!(
            kib > 0 && kib < RSS_BOUND_KIB,
            "node {}: {kib} KiB resident",
            i + 1
        );
    }
}
