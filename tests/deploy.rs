//! The deployment files under `deploy/`. Kubernetes: the node file of the StatefulSet gives
//! every pod of 3 or 7 its own id and certificate, and `ratemesh node --check-config`
//! accepts it for each (and refuses a pod without a certificate); the manifests agree with
//! it: the grace period covers the drain, the headless Service publishes pods before they
//! are ready on the node's peer port, the seeds name that Service, the disruption budget
//! keeps a majority, and the kustomization holds every manifest and both files. The
//! Grafana dashboard and the Prometheus alert rules name only metrics a running node exports
//! (`promtool check rules` checks the rules in `.ci/run`).

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::*;

fn kubernetes(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/kubernetes")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The value after `key:` on the first line of `yaml` that has it (outside comments).
fn yaml_value(yaml: &str, key: &str) -> String {
    yaml.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no `{key}:` in {yaml}"))
        .trim()
        .to_owned()
}

fn node_file() -> toml::Table {
    kubernetes("node.toml").parse().unwrap()
}

fn seconds(value: &toml::Value) -> Duration {
    let text = value.as_str().unwrap();
    Duration::from_secs(text.strip_suffix('s').unwrap().parse().unwrap())
}

#[test]
fn every_pod_of_a_statefulset_of_3_or_7_has_a_node_file_that_check_config_accepts() {
    for replicas in [3u64, 7] {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config");
        std::fs::create_dir(&config).unwrap();
        for file in ["node.toml", "policies.toml"] {
            std::fs::write(config.join(file), kubernetes(file)).unwrap();
        }
        // The Secret's files, as `ratemesh certs --out certs --nodes N` writes them.
        let certs = ratemesh::net::certs::generate("ratemesh", replicas).unwrap();
        ratemesh::net::certs::write(&dir.path().join("certs"), &certs).unwrap();
        let check = |pod: &str| {
            let out = Command::new(BIN)
                .args(["node", "--check-config"])
                .arg(config.join("node.toml"))
                .env("POD_NAME", pod)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr);
            (out.status.code(), text)
        };
        for ordinal in 0..replicas {
            let (code, text) = check(&format!("ratemesh-{ordinal}"));
            assert_eq!(code, Some(0), "{replicas} replicas, pod {ordinal}: {text}");
            assert!(
                text.contains(&format!("node {}, 0 peers", ordinal + 1)),
                "{text}"
            );
        }
        // A name that is not a StatefulSet pod's, or none: refused, naming the setting.
        let line = kubernetes("node.toml")
            .lines()
            .position(|l| l.starts_with("id_from_env"))
            .unwrap()
            + 1;
        let (code, text) = check("gateway");
        assert_eq!(code, Some(1), "{text}");
        assert!(
            text.contains(&format!("node.toml:{line}: `id_from_env`"))
                && text.contains("`gateway`"),
            "{text}"
        );
        // A pod beyond the certificates made: refused, naming the file it lacks.
        let (code, text) = check(&format!("ratemesh-{replicas}"));
        assert_eq!(code, Some(1), "{text}");
        assert!(
            text.contains("`tls.cert`") && text.contains(&format!("node-{}.pem", replicas + 1)),
            "{text}"
        );
    }
}

#[test]
fn the_manifests_agree_with_the_node_file() {
    let node = node_file();
    let statefulset = kubernetes("statefulset.yaml");
    let peers = kubernetes("service-peers.yaml");
    // The grace period covers the drain, with room to spare.
    let grace: u64 = yaml_value(&statefulset, "terminationGracePeriodSeconds")
        .parse()
        .unwrap();
    let drain = seconds(&node["drain_grace"]) + seconds(&node["drain"]);
    assert!(
        Duration::from_secs(grace) >= drain + Duration::from_secs(5),
        "terminationGracePeriodSeconds {grace} for a drain of {drain:?}"
    );
    // Each pod's id from its name, given by the downward API.
    assert_eq!(node["id_from_env"].as_str(), Some("POD_NAME"));
    assert!(statefulset.contains("- name: POD_NAME\n              valueFrom:\n                fieldRef:\n                  fieldPath: metadata.name"));
    // The seeds are the headless Service on the peer port, which lists pods not yet ready.
    let service = yaml_value(&peers, "name");
    assert_eq!(yaml_value(&statefulset, "serviceName"), service);
    let port = node["listen"]
        .as_str()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    assert_eq!(
        node["seeds"][0].as_str(),
        Some(format!("{service}:{port}").as_str())
    );
    assert_eq!(yaml_value(&peers, "clusterIP"), "None");
    assert_eq!(yaml_value(&peers, "publishNotReadyAddresses"), "true");
    assert_eq!(yaml_value(&peers, "port"), port);
    assert_eq!(yaml_value(&peers, "protocol"), "UDP");
    // The gateway port is the one the node serves HTTP on, and the probes ask it.
    let http = node["http"]
        .as_str()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    assert!(statefulset.contains(&format!(
        "containerPort: {http}\n              protocol: TCP"
    )));
    assert_eq!(yaml_value(&statefulset, "path"), "/health");
    // One pod away at a time leaves a majority of 3 or of 7.
    let unavailable: u64 = yaml_value(&kubernetes("pdb.yaml"), "maxUnavailable")
        .parse()
        .unwrap();
    for replicas in [3u64, 7] {
        assert!(replicas - unavailable > replicas / 2);
    }
    // The kustomization holds every manifest but the optional ServiceMonitor, and both files.
    let kustomization = kubernetes("kustomization.yaml");
    for file in [
        "statefulset.yaml",
        "service-peers.yaml",
        "service-gateway.yaml",
        "pdb.yaml",
        "node.toml",
        "policies.toml",
    ] {
        assert!(kustomization.contains(&format!("  - {file}\n")), "{file}");
    }
    assert!(kustomization.contains("# With the Prometheus Operator: - servicemonitor.yaml"));
}

/// Every metric name (`ratemesh_…`, `process_…`) in `text`.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for prefix in ["ratemesh_", "process_"] {
        let mut rest = text;
        while let Some(at) = rest.find(prefix) {
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[at + name.len()..];
            names.insert(name);
        }
    }
    names
}

#[tokio::test]
async fn the_dashboard_and_the_alert_rules_name_only_metrics_a_node_exports() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let dashboard =
        std::fs::read_to_string(deploy.join("grafana/ratemesh-dashboard.json")).unwrap();
    let rules = std::fs::read_to_string(deploy.join("prometheus/ratemesh-rules.yaml")).unwrap();
    let named: std::collections::BTreeSet<String> = metric_names(&dashboard)
        .into_iter()
        .chain(metric_names(&rules))
        .collect();
    assert!(named.len() >= 15, "{named:?}");
    // A node whose policies deny (2 per client), and whose Redis policy fails open (nothing
    // listens at its address): what the rules and panels watch then shows.
    let dir = tempfile::tempdir().unwrap();
    let policy = policies("").replace("[tiers.api]\npolicies = [\"global\"]", "")
        + "\n[policies.per_key]\nalgorithm = \"fixed-window\"\nlimit = 2\nwindow = \"1h\"\n\
           \n[policies.exact]\nalgorithm = \"fixed-window\"\nlimit = 100\nwindow = \"1h\"\n\
           backend = \"redis\"\nfail_mode = \"open\"\n\
           \n[tiers.api]\npolicies = [\"global\", \"per_key\", \"exact\"]\n\
           \n[redis]\nurl = \"redis://127.0.0.1:1\"\ntimeout = \"200ms\"\n";
    let files = write_cluster_with(dir.path(), 1, &policy);
    let node = start(&files[0]);
    let client = client();
    wait_healthy(&client, &node).await;
    let statuses: Vec<u16> = four_requests(&client, &node).await;
    assert!(
        statuses.contains(&200) && statuses.contains(&429),
        "{statuses:?}"
    );
    // A policy file that does not parse: refused on SIGHUP.
    std::fs::write(dir.path().join("policies.toml"), "not toml [").unwrap();
    signal(&node, libc::SIGHUP);
    let text = wait_metric_line(
        &client,
        &node,
        "ratemesh_config_reloads_total{result=\"refused\"} 1",
    )
    .await;
    let exported: std::collections::BTreeSet<String> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect();
    let missing: Vec<&String> = named.iter().filter(|n| !exported.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "named but not exported: {missing:?}\n{text}"
    );
}

/// Four requests of one client: two admitted, then denied by `per_key`.
async fn four_requests(client: &reqwest::Client, node: &NodeProcess) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(status_of(client, node, "client-a").await);
    }
    statuses
}
