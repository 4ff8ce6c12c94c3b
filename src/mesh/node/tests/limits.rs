//! Live changes of a mesh policy's limits: a raised limit applies once every node runs it, a lowered one at once; the algorithm and the window stay.

use super::*;

fn reconfigure(c: &mut Cluster, i: usize, limit: u64, digest: u64) {
    let policy = Policy::global_fixed_window(limit, Duration::from_secs(3600)).unwrap();
    c.node(i).reconfigure(vec![policy], digest).unwrap();
    c.deliver();
}

/// Send `count` requests for `key`, spread over the nodes in turn.
fn spread(c: &mut Cluster, key: u64, count: u64) {
    for r in 0..count {
        c.decide(r as usize % c.n, key);
        c.run_ms(1);
    }
    c.run_ms(200);
}

#[test]
fn a_raised_limit_applies_once_every_node_runs_it() {
    let mut c = Cluster::new(3);
    // One key owned by the node that changes first, one by a node that changes last.
    for owner in [0, 2] {
        let mut c2 = Cluster::new(3);
        let key = c2.key_owned_by(owner);
        spread(&mut c2, key, LIMIT + 200);
        assert_eq!(c2.total_admitted(), LIMIT);
        // Node 0 alone runs the new file: the old (lower) limit still holds everywhere.
        reconfigure(&mut c2, 0, 2 * LIMIT, 2);
        c2.run_ms(100);
        assert_eq!(c2.node(0).config_mismatch(), vec![1, 2]);
        assert_eq!(c2.node(1).config_mismatch(), vec![0]);
        assert_eq!(c2.node(0).policies()[0].capacity(), LIMIT);
        spread(&mut c2, key, 300);
        assert_eq!(
            c2.total_admitted(),
            LIMIT,
            "owner {owner}: {:?}",
            c2.admitted
        );
        // Every node runs it: the new limit, counting what the window admitted already.
        reconfigure(&mut c2, 1, 2 * LIMIT, 2);
        reconfigure(&mut c2, 2, 2 * LIMIT, 2);
        c2.run_ms(100);
        for i in 0..3 {
            assert!(c2.node(i).config_mismatch().is_empty());
            assert_eq!(c2.node(i).policies()[0].capacity(), 2 * LIMIT);
        }
        spread(&mut c2, key, LIMIT + 300);
        assert_eq!(
            c2.total_admitted(),
            2 * LIMIT,
            "owner {owner}: {:?}",
            c2.admitted
        );
    }
    // A lowered limit applies on every node as soon as they hear of it.
    let key = c.key_owned_by(0);
    spread(&mut c, key, 100);
    reconfigure(&mut c, 1, LIMIT / 2, 3);
    c.run_ms(100);
    for i in 0..3 {
        assert_eq!(c.node(i).policies()[0].capacity(), LIMIT / 2, "node {i}");
    }
    spread(&mut c, key, LIMIT);
    assert_eq!(c.total_admitted(), LIMIT / 2, "{:?}", c.admitted);
    // A node that runs the lower limit and dies stops counting: the others' apply again.
    c.crash(1);
    c.run_ms(1000);
    assert!(c.node(0).config_mismatch().is_empty());
    assert_eq!(c.node(0).policies()[0].capacity(), LIMIT);
}

#[test]
fn a_live_change_keeps_the_algorithm_and_the_window() {
    let mut c = Cluster::new(2);
    let other_window = Policy::global_fixed_window(LIMIT, Duration::from_secs(60)).unwrap();
    let other_algorithm = Policy::global_sliding_window(LIMIT, Duration::from_secs(3600)).unwrap();
    for (policies, reason) in [
        (vec![other_window], "window"),
        (vec![other_algorithm], "algorithm"),
        (vec![hour_policy(), hour_policy()], "number"),
    ] {
        let error = c.node(0).reconfigure(policies, 9).unwrap_err();
        assert!(error.to_string().contains(reason), "{error}");
    }
    assert_eq!(c.node(0).config().policies, vec![hour_policy()]);
    c.run_ms(100);
    assert!(c.node(1).config_mismatch().is_empty());
}
