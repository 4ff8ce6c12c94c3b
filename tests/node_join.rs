//! Joining a running cluster on real QUIC nodes: `ratemesh node` processes that list no
//! member join through one seed address or a DNS name, every member learns of them, a shared
//! key's limit holds across the grown cluster, members that drain or die are dropped and a
//! cluster shrunk below half of its size keeps admitting; a node whose seeds do not answer
//! decides by `while_joining` and says it joins; certificates of another CA, or of the
//! cluster CA naming no node, are refused.

mod support;

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ratemesh::Policy;
use ratemesh::mesh::NodeConfig;
use ratemesh::net::Refusal;
use ratemesh::net::certs::{self, ClusterCerts};
use ratemesh::net::node_tls;
use ratemesh::net::{MeshNet, NetConfig, transport_config};
use support::*;

/// Free loopback ports: `n` UDP (QUIC) and `n` TCP (HTTP).
fn ports(n: usize) -> (Vec<SocketAddr>, Vec<SocketAddr>) {
    let udp: Vec<UdpSocket> = (0..n)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    let tcp: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    (
        udp.iter().map(|s| s.local_addr().unwrap()).collect(),
        tcp.iter().map(|s| s.local_addr().unwrap()).collect(),
    )
}

/// Write node `id`'s file into `dir` (certificates in `dir/certs`, `policies.toml` next to
/// it), with `extra` lines (peers, seeds, join settings).
fn node_file(dir: &Path, id: u64, quic: SocketAddr, http: SocketAddr, extra: &str) -> PathBuf {
    let text = format!(
        "id = {id}\nlisten = \"{quic}\"\nhttp = \"{http}\"\ngossip_interval = \"20ms\"\n\
         mesh_max_wait = \"1s\"\npolicy_file = \"policies.toml\"\ndrain = \"1s\"\ndrain_grace = \"100ms\"\n{extra}\n\
         [tls]\nca = \"certs/ca.pem\"\ncert = \"certs/node-{id}.pem\"\nkey = \"certs/node-{id}.key\"\n"
    );
    let path = dir.join(format!("node-{id}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

fn peers(list: &[(u64, SocketAddr)]) -> String {
    list.iter()
        .map(|(id, addr)| format!("\n[[peers]]\nid = {id}\naddr = \"{addr}\"\n"))
        .collect()
}

/// `/health` of `node` as JSON, with its status.
async fn health(client: &reqwest::Client, node: &NodeProcess) -> (u16, serde_json::Value) {
    let response = client
        .get(format!("http://{}/health", node.http))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// Wait (at most 15 s) until every node in `nodes` reports `members` members, `members − 1`
/// peers up and a 200; return how long it took.
async fn wait_members(client: &reqwest::Client, nodes: &[&NodeProcess], members: u64) -> Duration {
    let started = Instant::now();
    loop {
        let mut all = true;
        let mut seen = Vec::new();
        for node in nodes {
            let (status, body) = health(client, node).await;
            let ok = status == 200 && body["members"] == members && body["peers_up"] == members - 1;
            all &= ok;
            seen.push((status, body));
        }
        if all {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "not every node reports {members} members: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Send `count` requests for `api_key` round-robin to `nodes`; return how many were admitted.
async fn admitted(
    client: &reqwest::Client,
    nodes: &[&NodeProcess],
    api_key: &str,
    count: usize,
) -> u64 {
    let mut ok = 0;
    for i in 0..count {
        if status_of(client, nodes[i % nodes.len()], api_key).await == 200 {
            ok += 1;
        }
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_join_through_one_seed_and_a_dns_name_and_the_cluster_shrinks_below_half() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let cluster = certs::generate("test", 5).unwrap();
    certs::write(&dir.path().join("certs"), &cluster).unwrap();
    std::fs::write(dir.path().join("policies.toml"), policies("")).unwrap();
    let (quic, http) = ports(5);
    // Nodes 1-3 know only each other (their files never change).
    let files: Vec<PathBuf> = (0..3)
        .map(|i| {
            let others: Vec<(u64, SocketAddr)> = (0..3)
                .filter(|&j| j != i)
                .map(|j| (j as u64 + 1, quic[j]))
                .collect();
            node_file(dir.path(), i as u64 + 1, quic[i], http[i], &peers(&others))
        })
        .collect();
    let mut nodes: Vec<NodeProcess> = files.iter().map(|f| start(f)).collect();
    let client = client();
    for node in &nodes {
        wait_healthy(&client, node).await;
    }

    // Node 4 knows one seed address, and no id.
    let file = node_file(
        dir.path(),
        4,
        quic[3],
        http[3],
        &format!("seeds = [\"{}\"]\n", quic[0]),
    );
    nodes.push(start(&file));
    let all: Vec<&NodeProcess> = nodes.iter().collect();
    let took = wait_members(&client, &all, 4).await;
    eprintln!("4 members, 3 peers up everywhere {took:?} after node 4 started");
    // The joiner admits, and a shared key's limit (a burst of 300) holds across the four.
    assert_eq!(status_of(&client, &nodes[3], "joiner-own").await, 200);
    let shared = admitted(&client, &all, "shared", 400).await;
    eprintln!("shared key: {shared} of 400 admitted across four nodes (limit 300)");
    assert!(
        (270..=300).contains(&shared),
        "admitted {shared} of a burst of 300"
    );

    // Node 5 finds the cluster through a DNS name (`localhost`, which resolves).
    let file = node_file(
        dir.path(),
        5,
        quic[4],
        http[4],
        &format!("seeds = [\"localhost:{}\"]\n", quic[1].port()),
    );
    nodes.push(start(&file));
    let all: Vec<&NodeProcess> = nodes.iter().collect();
    let took = wait_members(&client, &all, 5).await;
    eprintln!("5 members everywhere {took:?} after node 5 started");
    assert_eq!(status_of(&client, &nodes[4], "joiner-5").await, 200);

    // Nodes 1 and 2 drain (node 1 was node 4's seed): the others drop them at once.
    for gone in 0..2 {
        let mut node = nodes.remove(0);
        signal(&node, libc::SIGTERM);
        assert!(exit_of(&mut node, Duration::from_secs(15)).await.success());
        let rest: Vec<&NodeProcess> = nodes.iter().collect();
        let took = wait_members(&client, &rest, 5 - gone - 1).await;
        eprintln!(
            "node {} drained; the others dropped it in {took:?}",
            gone + 1
        );
    }
    // Node 3 dies (SIGKILL): the two left, a majority of the three, declare it dead.
    let node = nodes.remove(0);
    drop(node);
    let rest: Vec<&NodeProcess> = nodes.iter().collect();
    let took = wait_members(&client, &rest, 2).await;
    eprintln!("node 3 killed; declared dead in {took:?}");
    // Two of the five: a used key keeps its count, a fresh one is served.
    assert_eq!(admitted(&client, &rest, "after-shrink", 40).await, 40);
    let more = admitted(&client, &rest, "shared", 20).await;
    assert!(
        more <= 300 - shared,
        "the shared key got {more} more after the shrink"
    );
    let text = metrics_of(&client, &nodes[0]).await;
    assert_eq!(metric(&text, "ratemesh_mesh_members "), 2.0);
    assert_eq!(metric(&text, "ratemesh_mesh_joining "), 0.0);
    eprintln!("whole scenario: {:?}", started.elapsed());
}

/// Three nodes whose files list the same seeds (all three addresses, their own included)
/// and no peer, started together: one cluster of three, not three of one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_started_together_with_the_same_seeds_form_one_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = certs::generate("test", 3).unwrap();
    certs::write(&dir.path().join("certs"), &cluster).unwrap();
    std::fs::write(dir.path().join("policies.toml"), policies("")).unwrap();
    let (quic, http) = ports(3);
    let seeds = format!(
        "seeds = [{}]\n",
        quic.iter()
            .map(|a| format!("\"{a}\""))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut commands: Vec<std::process::Command> = (0..3)
        .map(|i| {
            node_command(&node_file(
                dir.path(),
                i as u64 + 1,
                quic[i],
                http[i],
                &seeds,
            ))
        })
        .collect();
    let started = Instant::now();
    let nodes: Vec<NodeProcess> = commands.drain(..).map(spawn).collect();
    let all: Vec<&NodeProcess> = nodes.iter().collect();
    let client = client();
    wait_members(&client, &all, 3).await;
    eprintln!(
        "one cluster of three {:?} after the start",
        started.elapsed()
    );
    let shared = admitted(&client, &all, "shared", 400).await;
    assert!(
        (270..=300).contains(&shared),
        "admitted {shared} of a burst of 300"
    );
}

/// `ratemesh certs --add-node` signs a new node's certificate with the CA already made; a
/// node with it joins the cluster (it is admitted by its certificate alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certs_add_node_signs_a_certificate_that_the_cluster_admits() {
    let dir = tempfile::tempdir().unwrap();
    let certs_dir = dir.path().join("certs");
    let run = |args: &[&str]| {
        std::process::Command::new(BIN)
            .arg("certs")
            .arg("--out")
            .arg(&certs_dir)
            .args(args)
            .output()
            .unwrap()
    };
    assert!(run(&["--nodes", "1", "--cluster", "prod"]).status.success());
    let wrong = run(&["--add-node", "2", "--cluster", "staging"]);
    assert!(!wrong.status.success());
    assert!(
        String::from_utf8_lossy(&wrong.stderr).contains("does not chain"),
        "{}",
        String::from_utf8_lossy(&wrong.stderr)
    );
    assert!(
        run(&["--add-node", "2", "--cluster", "prod"])
            .status
            .success()
    );
    std::fs::write(dir.path().join("policies.toml"), policies("")).unwrap();
    let (quic, http) = ports(2);
    let first = start(&node_file(dir.path(), 1, quic[0], http[0], ""));
    let second = start(&node_file(
        dir.path(),
        2,
        quic[1],
        http[1],
        &format!("seeds = [\"{}\"]\n", quic[0]),
    ));
    let client = client();
    wait_members(&client, &[&first, &second], 2).await;
}

/// Three running nodes that list only each other; nodes 4 and 5 start with files that list
/// all five. The three admit them by their certificates, and all five serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_whose_files_list_all_five_join_three_that_list_only_themselves() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = certs::generate("test", 5).unwrap();
    certs::write(&dir.path().join("certs"), &cluster).unwrap();
    std::fs::write(dir.path().join("policies.toml"), policies("")).unwrap();
    let (quic, http) = ports(5);
    let listed = |i: usize, n: usize| {
        let others: Vec<(u64, SocketAddr)> = (0..n)
            .filter(|&j| j != i)
            .map(|j| (j as u64 + 1, quic[j]))
            .collect();
        node_file(dir.path(), i as u64 + 1, quic[i], http[i], &peers(&others))
    };
    let mut nodes: Vec<NodeProcess> = (0..3).map(|i| start(&listed(i, 3))).collect();
    let client = client();
    for node in &nodes {
        wait_healthy(&client, node).await;
    }
    nodes.extend((3..5).map(|i| start(&listed(i, 5))));
    let all: Vec<&NodeProcess> = nodes.iter().collect();
    let took = wait_members(&client, &all, 5).await;
    eprintln!("5 members, 4 peers up everywhere {took:?} after nodes 4 and 5 started");
    for node in &nodes[3..] {
        assert_eq!(status_of(&client, node, "tenant").await, 200);
        let text = metrics_of(&client, node).await;
        assert_eq!(metric(&text, "ratemesh_mesh_joining_decisions_total"), 0.0);
    }
    let shared = admitted(&client, &all, "shared", 400).await;
    assert!(
        (270..=300).contains(&shared),
        "admitted {shared} of a burst of 300"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_seeds_do_not_answer_decides_by_while_joining_and_says_so() {
    let client = client();
    for (mode, expected) in [("local-share", 100), ("deny", 0), ("allow", 150)] {
        let dir = tempfile::tempdir().unwrap();
        let cluster = certs::generate("test", 1).unwrap();
        certs::write(&dir.path().join("certs"), &cluster).unwrap();
        std::fs::write(dir.path().join("policies.toml"), policies("")).unwrap();
        let (quic, http) = ports(2);
        // The seed is a port nobody listens on; a cluster of three is expected.
        let file = node_file(
            dir.path(),
            1,
            quic[0],
            http[0],
            &format!(
                "seeds = [\"{}\"]\njoin_timeout = \"1h\"\ncluster_size = 3\nwhile_joining = \"{mode}\"\n",
                quic[1]
            ),
        );
        let node = start(&file);
        let (status, body) = health(&client, &node).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["state"], "joining", "{body}");
        assert_eq!(body["while_joining"], mode);
        // A third of a burst of 300 for `local-share`, nothing for `deny`, all for `allow`.
        let got = admitted(&client, &[&node], "tenant", 150).await;
        eprintln!("while_joining = {mode}: {got} of 150 admitted");
        assert_eq!(got, expected, "while_joining = {mode}");
        let text = metrics_of(&client, &node).await;
        assert_eq!(metric(&text, "ratemesh_mesh_joining "), 1.0);
        assert_eq!(metric(&text, "ratemesh_mesh_members "), 1.0);
        assert!(metric(&text, "ratemesh_mesh_joining_decisions_total") >= 150.0);
        let (status, body) = health(&client, &node).await;
        assert_eq!((status, &body["state"]), (503, &"joining".into()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_only_seed_is_itself_starts_its_cluster_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = certs::generate("test", 1).unwrap();
    certs::write(&dir.path().join("certs"), &cluster).unwrap();
    std::fs::write(dir.path().join("policies.toml"), policies("")).unwrap();
    let (quic, http) = ports(1);
    let file = node_file(
        dir.path(),
        1,
        quic[0],
        http[0],
        &format!("seeds = [\"{}\"]\njoin_timeout = \"1h\"\n", quic[0]),
    );
    let node = start(&file);
    let client = client();
    let started = Instant::now();
    wait_healthy(&client, &node).await;
    eprintln!("the first node was ready in {:?}", started.elapsed());
    // Not after its hour-long `join_timeout`: at once, however busy the machine.
    assert!(started.elapsed() < Duration::from_secs(60));
    let (_, body) = health(&client, &node).await;
    assert_eq!(body["state"], "running", "{body}");
    assert_eq!(admitted(&client, &[&node], "tenant", 50).await, 50);
}

fn policy() -> Policy {
    Policy::global_fixed_window(1000, window::window_with_room(Duration::from_secs(3600))).unwrap()
}

/// A mesh node with certificate `cert`/`key` of `ca_pem`, knowing `members`; it joins a
/// cluster, or, with `joins` false, is one from the start.
async fn mesh_node(
    ca_pem: &str,
    (cert, key): (&str, &str),
    id: u64,
    members: &[u64],
    joins: bool,
) -> MeshNet {
    let tls = node_tls(
        ca_pem.as_bytes(),
        cert.as_bytes(),
        key.as_bytes(),
        transport_config(),
    )
    .unwrap();
    let mut node = NodeConfig::new(id, members.to_vec(), vec![policy()]);
    node.joins = joins;
    MeshNet::start(NetConfig {
        node,
        listen: "127.0.0.1:0".parse().unwrap(),
        peers: Vec::new(),
        tls,
    })
    .await
    .unwrap()
}

fn node_cert(certs: &ClusterCerts, id: u64) -> (&str, &str) {
    let (_, cert, key) = certs.nodes.iter().find(|(n, _, _)| *n == id).unwrap();
    (cert, key)
}

async fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_of_another_ca_or_naming_no_node_are_refused_and_a_new_node_is_admitted() {
    let cluster = certs::generate("test", 3).unwrap();
    let ca = cluster.ca_cert_pem.as_str();
    let (cert, key) = node_cert(&cluster, 1);
    let one = mesh_node(ca, (cert, key), 1, &[1], false).await;
    let (cert, key) = node_cert(&cluster, 2);
    let two = mesh_node(ca, (cert, key), 2, &[1, 2], true).await;
    two.add_peer(1, one.local_addr());
    wait_until("nodes 1 and 2 to run", || {
        one.is_running() && two.is_running()
    })
    .await;
    let members = |n: &MeshNet| n.with_node(|n| n.alive_count());
    let refused = |reason| one.refusals().count(reason);

    // Another CA's node 3, dialing node 1 as a seed: refused by TLS.
    let rogue = certs::generate("rogue", 3).unwrap();
    let (cert, key) = node_cert(&rogue, 3);
    let other_ca = mesh_node(&rogue.ca_cert_pem, (cert, key), 3, &[3], true).await;
    other_ca.add_seeds(vec![one.local_addr().to_string()], Duration::from_secs(30));
    wait_until("the other CA's node to be refused", || {
        refused(Refusal::Tls) >= 1
    })
    .await;

    // The cluster CA's certificates that name no node, or two nodes: refused as such.
    for names in [
        vec!["gateway.example".to_string()],
        vec![certs::node_name(7), certs::node_name(8)],
    ] {
        let before = refused(Refusal::UnknownMember);
        let (cert, key) = certs::issue(
            "test",
            &cluster.ca_key_pem,
            &names,
            std::time::Duration::from_secs(86_400),
        )
        .unwrap();
        let nameless = mesh_node(ca, (&cert, &key), 9, &[9], true).await;
        nameless.add_peer(1, one.local_addr());
        wait_until("a certificate naming no one node to be refused", || {
            refused(Refusal::UnknownMember) > before
        })
        .await;
        nameless.shutdown().await;
    }
    assert_eq!(members(&one), 2);
    assert_eq!(members(&two), 2);

    // Node 3 of the cluster CA, in nobody's list, joins through node 2 and is told of
    // node 1 by it.
    let (cert, key) = node_cert(&cluster, 3);
    let three = mesh_node(ca, (cert, key), 3, &[3], true).await;
    three.add_seeds(vec![two.local_addr().to_string()], Duration::from_secs(30));
    wait_until("node 3 to join and every node to count three", || {
        three.is_running() && [&one, &two, &three].iter().all(|n| members(n) == 3)
    })
    .await;
    assert!(three.decide(0, 42, 1).await.is_allowed());
    for n in [one, two, three, other_ca] {
        n.shutdown().await;
    }
}

#[test]
fn seeds_and_join_settings_in_a_node_file_are_checked_with_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = certs::generate("test", 1).unwrap();
    certs::write(&dir.path().join("certs"), &cluster).unwrap();
    std::fs::write(dir.path().join("policies.toml"), policies("")).unwrap();
    let (quic, http) = ports(1);
    let parse = |extra: &str| {
        let path = node_file(dir.path(), 1, quic[0], http[0], extra);
        ratemesh::node::NodeFile::from_file(path)
    };
    let refused = |extra: &str, field: &str, reason: &str| {
        let error = parse(extra).unwrap_err();
        assert_eq!(error.field, field, "{error}");
        assert!(error.reason.contains(reason), "{error}");
        assert_eq!(error.line, 9, "{error}");
    };
    refused("seeds = [\"no-port\"]", "seeds[0]", "with a port");
    refused(
        "seeds = [\"10.0.0.1:7000\", \"host:0\"]",
        "seeds[1]",
        "with a port",
    );
    refused("seeds = [\"a b:7000\"]", "seeds[0]", "with a port");
    refused("seed_refresh = \"10ms\"", "seed_refresh", "between");
    refused("join_timeout = \"soon\"", "join_timeout", "not a duration");
    refused("while_joining = \"maybe\"", "while_joining", "local-share");

    // Seeds: the node joins; its share before joining is decided by while_joining.
    let file = parse(
        "seeds = [\"10.0.0.1:7000\", \"ratemesh-headless.ns.svc.cluster.local:7000\", \"[::1]:7000\"]\n\
         while_joining = \"deny\"\njoin_timeout = \"30s\"",
    )
    .unwrap();
    assert_eq!(file.seeds.len(), 3);
    let config = file.node_config();
    assert!(config.joins);
    assert_eq!(config.while_joining, ratemesh::mesh::WhileJoining::Deny);
    assert_eq!(config.join_timeout_ns, 30_000_000_000);
    // Neither peers nor seeds: a cluster of one, joined at once.
    let config = parse("").unwrap().node_config();
    assert!(!config.joins);
    assert_eq!(
        config.while_joining,
        ratemesh::mesh::WhileJoining::LocalShare
    );
}
