//! A mesh policy of calendar days (`calendar = "day"` with `time_zone`) on three `ratemesh
//! node` processes, by this machine's clock: the day's limit holds cluster-wide, a denial's
//! `Retry-After` and `RateLimit` reset say when the day ends in the zone, and a reload that
//! changes the calendar is refused while one of the same file is taken.

mod support;

use std::time::{SystemTime, UNIX_EPOCH};

use support::*;

const DAY: u64 = 86_400;

fn file(zone: &str, period: &str) -> String {
    format!(
        "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"api\"\n\n\
         [policies.daily]\nalgorithm = \"fixed-window\"\nlimit = 10\nbackend = \"mesh\"\n\
         calendar = \"{period}\"\ntime_zone = \"{zone}\"\nby = [\"header:x-account\"]\n\n\
         [tiers.api]\npolicies = [\"daily\"]\n"
    )
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A zone whose day ends at least an hour from now and not at midnight UTC (where windows
/// of a day from the UNIX epoch end too), and the seconds until it does: Asia/Kolkata
/// (UTC+5:30 all year: its midnight is 18:30 UTC), or Asia/Tokyo (UTC+9: 15:00 UTC).
fn zone_with_room() -> (&'static str, u64) {
    let now = unix_now();
    let kolkata = DAY - (now + 5 * 3600 + 1800) % DAY;
    if kolkata >= 3600 {
        ("Asia/Kolkata", kolkata)
    } else {
        ("Asia/Tokyo", DAY - (now + 9 * 3600) % DAY)
    }
}

/// The `t` parameter (seconds until reset) of a `RateLimit` field.
fn reset_of(field: &str) -> u64 {
    field
        .split(';')
        .find_map(|p| p.trim().strip_prefix("t="))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no t= in {field:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mesh_day_in_a_zone_holds_cluster_wide_and_ends_at_its_midnight() {
    let (zone, until_midnight) = zone_with_room();
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 3, &file(zone, "day"));
    let nodes: Vec<NodeProcess> = files.iter().map(|f| start(f)).collect();
    let client = client();
    for node in &nodes {
        wait_healthy(&client, node).await;
    }
    let get = |node: &NodeProcess| {
        client
            .get(format!("http://{}/api/orders", node.http))
            .header("x-account", "alice")
    };

    // 30 requests round-robin: the day's 10, cluster-wide.
    let mut admitted = 0;
    let mut denials = 0;
    for i in 0..30usize {
        let response = get(&nodes[i % 3]).send().await.unwrap();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .unwrap_or_else(|| panic!("no {name}"))
                .to_str()
                .unwrap()
                .to_owned()
        };
        match response.status().as_u16() {
            200 => admitted += 1,
            429 => {
                denials += 1;
                let retry: u64 = header("retry-after").parse().unwrap();
                let reset = reset_of(&header("ratelimit"));
                for (what, got) in [("Retry-After", retry), ("RateLimit t", reset)] {
                    assert!(
                        got.abs_diff(until_midnight) <= 30,
                        "{what} {got} s, the day in {zone} ends in about {until_midnight} s"
                    );
                }
            }
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(
        (admitted, denials),
        (10, 20),
        "the day's 10 across three nodes"
    );

    // The same file again: taken. Another calendar or zone: refused, and the day's count
    // stands.
    let reloads =
        |result: &str, n: u32| format!("ratemesh_config_reloads_total{{result=\"{result}\"}} {n}");
    signal(&nodes[0], libc::SIGHUP);
    wait_metric_line(&client, &nodes[0], &reloads("applied", 1)).await;
    std::fs::write(dir.path().join("policies.toml"), file(zone, "week")).unwrap();
    signal(&nodes[0], libc::SIGHUP);
    wait_metric_line(&client, &nodes[0], &reloads("refused", 1)).await;
    let other = "UTC";
    std::fs::write(dir.path().join("policies.toml"), file(other, "day")).unwrap();
    signal(&nodes[0], libc::SIGHUP);
    wait_metric_line(&client, &nodes[0], &reloads("refused", 2)).await;
    for node in &nodes {
        assert_eq!(get(node).send().await.unwrap().status(), 429);
    }
}
