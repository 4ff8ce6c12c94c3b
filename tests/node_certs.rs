//! Certificates on running `ratemesh node` processes: `ratemesh certs` gives a node a year and
//! the CA ten (or what `--days` and `--ca-days` say), each node exports when its certificates
//! end, and the files are read again when they change: a node's renewed certificate, a key
//! that is not the certificate's (refused, the certificates in force stay), and a rotation of
//! the cluster's CA (both CAs in the bundle, every node's certificate from the new CA, the old
//! CA dropped). Through all of it every request is answered 200 and no peer is declared
//! dead; a node of the new CA that trusts both joins while the others still present the old
//! CA's certificates, a node that trusts only the new CA joins once they present the new
//! one's, and a node of the old CA is refused at the end.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::*;

const DAY: f64 = 86_400.0;

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Run `ratemesh certs` with `args`; panic with its output if it fails.
fn certs(args: &[&str]) {
    let out = std::process::Command::new(BIN)
        .arg("certs")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ratemesh certs {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Replace `to` with `contents` at once (written beside it, then renamed over it), as a
/// Kubernetes Secret volume or cert-manager replaces a file.
fn replace(to: &Path, contents: &[u8]) {
    let tmp = to.with_extension("new");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, to).unwrap();
}

/// A series' value in `text` (`name{labels}` as written), or 0 if absent.
fn series(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Poll `node`'s metrics until `ok` holds for them (30 s at most); return them.
async fn wait_metrics(
    client: &reqwest::Client,
    node: &NodeProcess,
    what: &str,
    ok: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = metrics_of(client, node).await;
        if ok(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "never {what}:\n{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const APPLIED: &str = "ratemesh_tls_reloads_total{result=\"applied\"}";
const REFUSED: &str = "ratemesh_tls_reloads_total{result=\"refused\"}";
const NODE_END: &str = "ratemesh_tls_certificate_expiry_timestamp_seconds{certificate=\"node\"}";
const CA_END: &str = "ratemesh_tls_certificate_expiry_timestamp_seconds{certificate=\"ca\"}";

/// Wait until every node has applied `applied[i]` changes of its `[tls]` files.
async fn wait_applied(client: &reqwest::Client, nodes: &[NodeProcess], applied: [f64; 3]) {
    for (node, want) in nodes.iter().zip(applied) {
        wait_metrics(client, node, &format!("{want} reloads applied"), |t| {
            series(t, APPLIED) == want
        })
        .await;
    }
}

/// Wait until every one of `nodes` counts `members` members.
async fn wait_members<'a>(
    client: &reqwest::Client,
    nodes: impl Iterator<Item = &'a NodeProcess>,
    members: u64,
) {
    for node in nodes {
        wait_metrics(client, node, &format!("{members} members"), |t| {
            metric(t, "ratemesh_mesh_members") == members as f64
        })
        .await;
    }
}

/// Days from now to a series' time.
fn days_left(text: &str, name: &str) -> f64 {
    (series(text, name) - unix_now()) / DAY
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_certificate_and_a_rotated_ca_apply_on_running_nodes_and_nothing_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 3, &policies(""));
    let certs_dir = dir.path().join("certs");
    let certs_arg = certs_dir.to_str().unwrap();
    // The cluster's certificates as `ratemesh certs` makes them by default.
    certs(&["--out", certs_arg, "--nodes", "3", "--cluster", "test"]);
    let old_ca = std::fs::read(certs_dir.join("ca.pem")).unwrap();
    let nodes: Vec<NodeProcess> = files.iter().map(|f| start(f)).collect();
    let client = client();
    for node in &nodes {
        wait_healthy(&client, node).await;
    }
    wait_members(&client, nodes.iter(), 3).await;
    // Nodes started one after the other may have declared a later one dead before it came:
    // counted from here.
    let mut deaths = Vec::new();
    for node in &nodes {
        deaths.push(metric(
            &metrics_of(&client, node).await,
            "ratemesh_peer_deaths_total",
        ));
    }
    let text = metrics_of(&client, &nodes[0]).await;
    let (node_days, ca_days) = (days_left(&text, NODE_END), days_left(&text, CA_END));
    assert!(
        (364.0..=365.1).contains(&node_days),
        "{node_days} days\n{text}"
    );
    assert!(
        (3649.0..=3650.1).contains(&ca_days),
        "{ca_days} days\n{text}"
    );
    assert_eq!((series(&text, APPLIED), series(&text, REFUSED)), (0.0, 0.0));

    // Requests all along, each of a fresh client: every one must be answered 200.
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = {
        let stop = Arc::clone(&stop);
        let addrs: Vec<_> = nodes.iter().map(|n| n.http).collect();
        let client = client.clone();
        tokio::spawn(async move {
            let mut answers = Vec::new();
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let url = format!("http://{}/api/orders", addrs[i % addrs.len()]);
                let status = match client
                    .get(url)
                    .header("x-api-key", format!("client-{i}"))
                    .send()
                    .await
                {
                    Ok(response) => response.status().as_u16(),
                    Err(_) => 0,
                };
                answers.push(status);
                i += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            answers
        })
    };

    // Node 1's certificate renewed in place, for 30 days.
    certs(&[
        "--out",
        certs_arg,
        "--add-node",
        "1",
        "--cluster",
        "test",
        "--days",
        "30",
    ]);
    let text = wait_metrics(&client, &nodes[0], "the renewal applied", |t| {
        series(t, APPLIED) == 1.0
    })
    .await;
    let renewed_days = days_left(&text, NODE_END);
    assert!((29.0..=30.1).contains(&renewed_days), "{renewed_days}");

    // A key that is not its certificate's: refused, the certificate in force stays.
    let key_1 = certs_dir.join("node-1.key");
    let renewed_key = std::fs::read(&key_1).unwrap();
    replace(
        &key_1,
        &std::fs::read(certs_dir.join("node-2.key")).unwrap(),
    );
    let text = wait_metrics(&client, &nodes[0], "the wrong key refused", |t| {
        series(t, REFUSED) == 1.0
    })
    .await;
    assert_eq!(series(&text, APPLIED), 1.0);
    assert_eq!(days_left(&text, NODE_END).round(), renewed_days.round());
    replace(&key_1, &renewed_key);
    wait_applied(&client, &nodes, [2.0, 0.0, 0.0]).await;

    // The CA rotated: a new CA (and node certificates from it) made apart...
    let new_dir = dir.path().join("new");
    let new_arg = new_dir.to_str().unwrap();
    certs(&["--out", new_arg, "--nodes", "6", "--cluster", "test"]);
    let new_ca = std::fs::read(new_dir.join("ca.pem")).unwrap();
    // ...first trusted beside the old one on every node,
    let bundle = [old_ca.clone(), new_ca.clone()].concat();
    replace(&certs_dir.join("ca.pem"), &bundle);
    wait_applied(&client, &nodes, [3.0, 1.0, 1.0]).await;
    // (node 4, of the new CA and trusting both, joins the three while they present the old
    // CA's certificates: each side accepts the other's, though the two CAs bear one name)
    let node_file = |id: u64, ca: &Path, dir_of_pair: &Path| {
        let (quic, http) = node_addrs(1);
        let path = dir.path().join(format!("node-{id}.toml"));
        std::fs::write(
            &path,
            format!(
                "id = {id}\nlisten = \"{}\"\nhttp = \"{}\"\ngossip_interval = \"20ms\"\n\
                 policy_file = \"policies.toml\"\nseeds = [\"{}\"]\n\n[tls]\nca = \"{}\"\n\
                 cert = \"{}\"\nkey = \"{}\"\n",
                quic[0],
                http[0],
                read_listen(&files[0]),
                ca.display(),
                dir_of_pair.join(format!("node-{id}.pem")).display(),
                dir_of_pair.join(format!("node-{id}.key")).display(),
            ),
        )
        .unwrap();
        path
    };
    std::fs::write(dir.path().join("bundle.pem"), &bundle).unwrap();
    let fourth = start(&node_file(4, &dir.path().join("bundle.pem"), &new_dir));
    wait_members(&client, nodes.iter().chain([&fourth]), 4).await;
    // then every node's certificate from the new CA,
    for id in 1..=3 {
        for ext in ["pem", "key"] {
            let name = format!("node-{id}.{ext}");
            replace(
                &certs_dir.join(&name),
                &std::fs::read(new_dir.join(&name)).unwrap(),
            );
        }
    }
    wait_applied(&client, &nodes, [4.0, 2.0, 2.0]).await;
    // and the old CA dropped.
    replace(&certs_dir.join("ca.pem"), &new_ca);
    wait_applied(&client, &nodes, [5.0, 3.0, 3.0]).await;
    for node in &nodes {
        let text = metrics_of(&client, node).await;
        let days = days_left(&text, NODE_END);
        assert!((364.0..=365.1).contains(&days), "{days}\n{text}");
    }

    // Node 6, which knows only the new CA, joins through node 1: the three present and
    // accept certificates of the new CA.
    let sixth = start(&node_file(6, &new_dir.join("ca.pem"), &new_dir));
    wait_members(&client, nodes.iter().chain([&fourth, &sixth]), 5).await;
    stop.store(true, Ordering::Relaxed);
    let answers = traffic.await.unwrap();
    let not_ok = answers.iter().filter(|&&s| s != 200).count();
    assert!(answers.len() > 100, "only {} requests sent", answers.len());
    assert_eq!(
        not_ok,
        0,
        "{not_ok} of {} requests not answered 200",
        answers.len()
    );
    for (node, before) in nodes.iter().zip(deaths) {
        let text = metrics_of(&client, node).await;
        assert_eq!(
            metric(&text, "ratemesh_peer_deaths_total"),
            before,
            "{text}"
        );
    }
    let text = metrics_of(&client, &nodes[0]).await;
    assert_eq!(series(&text, REFUSED), 1.0, "{text}");

    // Node 5, whose certificate the old CA signed (and which trusts only that CA), is
    // refused.
    let old_dir = dir.path().join("old");
    std::fs::create_dir_all(&old_dir).unwrap();
    std::fs::write(old_dir.join("ca.pem"), &old_ca).unwrap();
    std::fs::copy(certs_dir.join("ca.key"), old_dir.join("ca.key")).unwrap();
    let old_arg = old_dir.to_str().unwrap();
    certs(&["--out", old_arg, "--add-node", "5", "--cluster", "test"]);
    let refused = |t: &str| {
        series(t, "ratemesh_peer_connections_refused_total")
            + t.lines()
                .filter(|l| l.starts_with("ratemesh_quic_refused_handshakes_total{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
    };
    let before = refused(&metrics_of(&client, &nodes[0]).await);
    let _fifth = start(&node_file(5, &old_dir.join("ca.pem"), &old_dir));
    wait_metrics(&client, &nodes[0], "the old CA's node refused", |t| {
        refused(t) > before
    })
    .await;
    assert_eq!(
        metric(
            &metrics_of(&client, &nodes[0]).await,
            "ratemesh_mesh_members"
        ),
        5.0
    );
}

/// The `listen` address of a node file.
fn read_listen(file: &Path) -> String {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("listen = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .unwrap()
        .to_string()
}
