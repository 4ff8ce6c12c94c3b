//! The admin API's questions on the mesh: a key's state read from its owner, and a reset
//! that gives the key exactly one fresh limit and ends its lockout on every node.

use super::lockouts::{decision, lock, second_policy, with_lockout};
use super::*;
use crate::mesh::{ASK_KEY, ASK_RESET, AdminMessage, KeyView};

const S: u64 = 1_000_000_000;

/// Ask the owner of `key` from node `i` (`kind`), and run the cluster until the answer.
fn ask(c: &mut Cluster, i: usize, key: u64, kind: u32) -> KeyView {
    let now = c.now;
    let (id, _) = c.node(i).ask_owner(now, 0, key, kind).unwrap();
    for _ in 0..200 {
        while let Some(m) = c.node(i).poll_admin() {
            if let AdminMessage::Answered { id: got, body, .. } = m
                && got == id
            {
                return KeyView::decode(&body).expect("a key view");
            }
        }
        c.run_ms(1);
    }
    panic!("no answer from the owner of {key}");
}

/// Admit as many requests for `key` as the cluster gives, spread over `nodes`.
fn admitted(c: &mut Cluster, key: u64, nodes: &[usize], tries: usize) -> usize {
    let mut n = 0;
    for t in 0..tries {
        if decision(c, nodes[t % nodes.len()], key).is_allowed() {
            n += 1;
        }
        c.run_ms(1);
    }
    n
}

#[test]
fn the_owner_tells_a_keys_state_and_a_reset_gives_one_fresh_limit() {
    // Ten a minute: a reset is the only way to more within the window.
    let policy = Policy::global_fixed_window(10, Duration::from_secs(60)).unwrap();
    let mut c = Cluster::with(3, policy);
    c.run_ms(100);
    let key = c.key_owned_by(0);
    assert_eq!(admitted(&mut c, key, &[1, 2], 30), 10);
    let seen = ask(&mut c, 1, key, ASK_KEY);
    assert_eq!(seen.owner, 0);
    assert!(seen.known);
    assert_eq!((seen.limit, seen.available), (10, 0));
    assert_eq!(seen.used + seen.leased, 10, "{seen:?}");
    assert!(seen.holders.iter().all(|h| h.0 == 1 || h.0 == 2));
    // Reset from node 2: exactly one more limit, whichever nodes ask.
    let after = ask(&mut c, 2, key, ASK_RESET);
    assert_eq!(after.used, 0, "{after:?}");
    assert_eq!(after.available + after.leased, 10, "{after:?}");
    assert_eq!(admitted(&mut c, key, &[0, 1, 2], 40), 10);
    // Again: another fresh limit.
    let again = ask(&mut c, 1, key, ASK_RESET);
    assert_eq!(again.available + again.leased, 10, "{again:?}");
    assert_eq!(admitted(&mut c, key, &[1, 2], 40), 10);
    assert_eq!(c.node(0).stats().resets, 2);
    // A key nobody used: fresh.
    let fresh = ask(&mut c, 0, key + 1, ASK_KEY);
    assert!(!fresh.known);
    assert_eq!(fresh.available, 10);
}

#[test]
fn a_reset_ends_a_lockout_on_every_node() {
    let mut c = with_lockout(3, second_policy(), 30 * S);
    let key = c.key_owned_by(0);
    lock(&mut c, key);
    c.run_ms(1_100);
    assert!(!decision(&mut c, 2, key).is_allowed(), "locked out");
    assert!(ask(&mut c, 2, key, ASK_KEY).lockout_ns > 20 * S);
    let after = ask(&mut c, 1, key, ASK_RESET);
    assert_eq!(after.lockout_ns, 0);
    c.run_ms(20);
    for i in 0..3 {
        assert!(
            decision(&mut c, i, key).is_allowed(),
            "node {i} still denied after the reset"
        );
    }
}

#[test]
fn questions_for_the_program_reach_it_and_its_answers_come_back() {
    let mut c = Cluster::with(2, second_policy());
    c.run_ms(100);
    let id = c
        .node(0)
        .ask_peer(1, crate::mesh::ASK_APP + 3, b"top?".to_vec())
        .unwrap();
    c.run_ms(50);
    let asked = c.node(1).poll_admin().expect("asked");
    let AdminMessage::Asked {
        from,
        id: got,
        kind,
        body,
    } = asked
    else {
        panic!("{asked:?}");
    };
    assert_eq!(
        (from, got, kind, body.as_slice()),
        (0, id, crate::mesh::ASK_APP + 3, &b"top?"[..])
    );
    c.node(1).reply(0, got, b"none".to_vec());
    c.run_ms(50);
    assert_eq!(
        c.node(0).poll_admin(),
        Some(AdminMessage::Answered {
            from: 1,
            id,
            body: b"none".to_vec()
        })
    );
    // A mesh kind the node does not know: an empty answer.
    let now = c.now;
    let (id, _) = c.node(1).ask_owner(now, 0, 5, 99).unwrap();
    c.run_ms(50);
    let mut answered = None;
    while let Some(m) = c.node(1).poll_admin() {
        answered = Some(m);
    }
    assert_eq!(
        answered.map(|m| match m {
            AdminMessage::Answered { id: got, body, .. } => (got, body.len()),
            other => panic!("{other:?}"),
        }),
        Some((id, 0))
    );
}

#[test]
fn an_override_gives_one_key_a_limit_of_its_own() {
    let policy = Policy::global_fixed_window(10, Duration::from_secs(60)).unwrap();
    let mut c = Cluster::with(3, policy);
    c.run_ms(100);
    let key = c.key_owned_by(0);
    let other = c.key_owned_by(0) ^ 1;
    let now = c.now;
    for i in 0..3 {
        assert!(c.node(i).set_override(now, 0, key, Some(15)));
    }
    assert!(
        !c.node(0).set_override(now, 7, key, Some(15)),
        "no such policy"
    );
    assert_eq!(admitted(&mut c, key, &[1, 2], 40), 15);
    assert_eq!(ask(&mut c, 1, key, ASK_KEY).limit, 15);
    assert_eq!(
        admitted(&mut c, other, &[1, 2], 20),
        10,
        "other keys keep the policy's"
    );
    // Lowered below what was used: nothing more this window.
    let now = c.now;
    for i in 0..3 {
        c.node(i).set_override(now, 0, key, Some(12));
    }
    assert_eq!(admitted(&mut c, key, &[0, 1, 2], 10), 0);
    // Removed: the policy's 10, which the 15 used exceed.
    let now = c.now;
    for i in 0..3 {
        c.node(i).set_override(now, 0, key, None);
    }
    assert_eq!(ask(&mut c, 2, key, ASK_KEY).limit, 10);
}
