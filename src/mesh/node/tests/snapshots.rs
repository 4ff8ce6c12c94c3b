//! Snapshots: what every node saved brings a long window's count back after all of them
//! restart at once; a node that restarts alone takes the live cluster's state instead.

use super::lockouts::decision;
use super::*;
use crate::mesh::SavedKey;

/// Run `c` until every node ran its rounds and collect what each would write to disk.
fn saved_by_each(c: &mut Cluster) -> Vec<Vec<SavedKey>> {
    c.run_ms(50);
    let now = c.now;
    (0..c.n).map(|i| c.node(i).snapshot_changes(now)).collect()
}

/// Requests for `key` round nodes 1 and 2 (node 0 holds no lease of it): how many were
/// admitted.
fn admitted(c: &mut Cluster, key: u64, n: usize) -> usize {
    (0..n)
        .filter(|&t| {
            let ok = decision(c, 1 + t % 2, key).is_allowed();
            c.run_ms(1);
            ok
        })
        .count()
}

#[test]
fn a_days_count_comes_back_after_every_node_restarts() {
    let policy = Policy::global_fixed_window(20, Duration::from_secs(86_400)).unwrap();
    let mut c = Cluster::with(3, policy);
    c.run_ms(100);
    let key = c.key_owned_by(0);
    assert_eq!(admitted(&mut c, key, 12), 12);
    // Idle, the holders give back what they did not spend (what they hold at a crash
    // counts as spent).
    c.run_ms(3_000);
    let saved = saved_by_each(&mut c);
    // The owner's authority and its successor's backup.
    assert_eq!(
        saved.iter().filter(|s| !s.is_empty()).count(),
        2,
        "{saved:?}"
    );
    for i in 0..3 {
        c.crash(i);
    }
    c.run_ms(500);
    for (i, saved) in saved.into_iter().enumerate() {
        c.restart(i);
        let now = c.now;
        c.node(i).restore_saved(saved, now);
    }
    c.run_ms(300);
    // The restarted nodes number their requests afresh.
    c.events.clear();
    // 12 of the day's 20 were used: 8 more, not 20.
    let got = admitted(&mut c, key, 15);
    assert_eq!(got, 8);
    assert_eq!(c.node(0).stats().snapshots_restored, 1);
}

#[test]
fn without_snapshots_or_with_short_windows_nothing_is_saved() {
    let policy = Policy::global_fixed_window(20, Duration::from_secs(60)).unwrap();
    let mut c = Cluster::with(3, policy);
    c.run_ms(100);
    let key = c.key_owned_by(0);
    assert_eq!(admitted(&mut c, key, 5), 5);
    assert!(saved_by_each(&mut c).iter().all(Vec::is_empty));
}

#[test]
fn a_node_restarting_alone_takes_the_live_state_over_its_snapshot() {
    let policy = Policy::global_fixed_window(20, Duration::from_secs(86_400)).unwrap();
    let mut c = Cluster::with(3, policy);
    c.run_ms(100);
    let key = c.key_owned_by(0);
    assert_eq!(admitted(&mut c, key, 4), 4);
    let old = saved_by_each(&mut c);
    // Used on after the snapshot: the live cluster knows 10.
    assert_eq!(admitted(&mut c, key, 6), 6);
    c.run_ms(50);
    c.crash(0);
    c.run_ms(50);
    c.restart(0);
    let now = c.now;
    c.node(0).restore_saved(old[0].clone(), now);
    c.events.retain(|(n, _)| *n != 0);
    c.run_ms(1_500);
    assert_eq!(admitted(&mut c, key, 15), 10);
    assert_eq!(c.node(0).stats().snapshots_restored, 0);
}
