//! The deployment files under `deploy/`. Kubernetes: the node file of the StatefulSet gives
//! every pod of 3 or 7 its own id and certificate, and `ratemesh node --check-config`
//! accepts it for each (and refuses a pod without a certificate); the manifests agree with
//! it: the grace period covers the drain, the headless Service publishes pods before they
//! are ready on the node's peer port, the seeds name that Service, the disruption budget
//! keeps a majority, and the kustomization holds every manifest and both files.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::BIN;

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
