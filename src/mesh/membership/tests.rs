//! Unit tests of the membership view.
use super::*;

const DEAD: Nanos = 200_000_000;

fn header(incarnation: u64, sent_at: u64) -> Header {
    Header {
        incarnation,
        sent_at,
        ..Header::default()
    }
}

#[test]
fn silence_while_this_node_itself_did_not_run_is_not_a_peers() {
    let mut m = Membership::new(1, 7, &[1, 2, 3], DEAD, 0);
    m.heard(10, 2, &header(1, 10));
    m.heard(10, 3, &header(1, 10));
    // This node stalled 250 ms: whatever 2 and 3 sent meanwhile may be lost.
    m.paused(250_000_000, 260_000_000);
    assert!(m.check(260_000_000).is_empty());
    // Silent for `dead_after` of this node's own running time: dead.
    m.heard(400_000_000, 3, &header(1, 400_000_000));
    let changes = m.check(460_000_000);
    assert!(changes.contains(&Change::Down(2)), "{changes:?}");
}

#[test]
fn a_node_whose_rounds_run_late_waits_longer_before_declaring_a_peer_dead() {
    const G: Nanos = 20_000_000;
    let mut m = Membership::new(1, 7, &[1, 2, 3], DEAD, 0);
    // Four rounds 10 ms late (under a round: no pause counted).
    for _ in 0..4 {
        m.round_late(10_000_000, G);
    }
    assert_eq!(m.lag_score(), 4);
    assert_eq!(m.patience_ns(0), 3 * DEAD);
    m.heard(10, 3, &header(1, 10));
    let mut now = 10;
    while now < 3 * DEAD {
        m.heard(now, 3, &header(1, now));
        assert!(
            !m.check(now).contains(&Change::Down(2)),
            "declared at {now} with patience {}",
            m.patience_ns(0)
        );
        now += G;
    }
    m.heard(now, 3, &header(1, now));
    assert!(m.check(now + G).contains(&Change::Down(2)));
    // Rounds on time bring the score back down, one point per eight rounds.
    for _ in 0..16 {
        m.round_late(0, G);
    }
    assert_eq!(m.lag_score(), 2);
    for _ in 0..100 {
        m.round_late(1_000_000, G);
    }
    assert_eq!(m.lag_score(), 0);
    assert_eq!(m.patience_ns(0), DEAD);
    // A peer that said it runs behind gets the patience of its own score.
    assert_eq!(m.patience_ns(2), 2 * DEAD);
    assert_eq!(m.patience_ns(100), 5 * DEAD);
    for _ in 0..100 {
        m.round_late(G, G);
    }
    assert_eq!(m.lag_score(), MAX_LAG_SCORE);
}

#[test]
fn a_peer_that_says_it_runs_late_gets_more_time() {
    let mut m = Membership::new(1, 7, &[1, 2, 3], DEAD, 0);
    let mut slow = header(1, 10);
    slow.lag = 4;
    m.heard(10, 2, &slow);
    m.heard(10, 3, &header(1, 10));
    // Node 3 keeps talking; node 2 goes quiet after saying it runs behind.
    let mut now = 20_000_000;
    while now < 3 * DEAD {
        m.heard(now, 3, &header(1, now));
        assert!(
            !m.check(now).contains(&Change::Down(2)),
            "declared at {now}"
        );
        now += 20_000_000;
    }
    m.heard(now, 3, &header(1, now));
    assert!(m.check(now + 20_000_000).contains(&Change::Down(2)));
}

#[test]
fn an_owner_needs_its_successor_to_rank_it_first() {
    let mut m = Membership::new(1, 7, &[1, 2, 3], DEAD, 0);
    let key = (0..u64::MAX)
        .find(|&k| weight(k, 3) > weight(k, 1) && weight(k, 1) > weight(k, 2))
        .unwrap();
    // Node 2 has told nothing yet: no agreement.
    assert!(!m.agrees_i_own(2, key, None));
    // Node 2 counts node 3 alive: node 3 ranks first, not this node.
    let mut h = header(1, 100);
    h.dead = Some(vec![]);
    m.heard(10, 2, &h);
    assert!(!m.agrees_i_own(2, key, None));
    // Node 2 counts node 3 dead: this node ranks first by its view.
    h.dead = Some(vec![3]);
    m.heard(20, 2, &h);
    assert!(m.agrees_i_own(2, key, None));
    // A view too large to list, or one that counts this node dead, never agrees.
    h.dead = None;
    m.heard(30, 2, &h);
    assert!(!m.agrees_i_own(2, key, None));
    h.dead = Some(vec![1, 3]);
    m.heard(40, 2, &h);
    assert!(!m.agrees_i_own(2, key, None));
}

#[test]
fn an_owner_needs_its_successor_to_rank_itself_second() {
    let mut m = Membership::new(1, 7, &[1, 2, 3], DEAD, 0);
    let key = (0..u64::MAX)
        .find(|&k| weight(k, 1) > weight(k, 3) && weight(k, 3) > weight(k, 2))
        .unwrap();
    // This node counts node 3 dead, so node 2 is its successor; node 2 counts node 3
    // alive: node 3 ranks between them, so node 2 is not the successor by its own view
    // (the owner node 2 confirmed before may still hold its lease).
    m.peers.get_mut(&3).unwrap().alive = false;
    m.reindex();
    let mut h = header(1, 100);
    h.dead = Some(vec![]);
    m.heard(10, 2, &h);
    assert!(!m.agrees_i_own(2, key, None));
    // Node 2 counts node 3 dead too: it ranks this node first and itself second.
    h.sent_at = 200;
    h.dead = Some(vec![3]);
    m.heard(20, 2, &h);
    assert!(m.agrees_i_own(2, key, None));
    // A frame sent before that one, overtaken on the way, does not bring its view back.
    h.sent_at = 150;
    h.dead = Some(vec![]);
    m.heard(30, 2, &h);
    assert!(m.agrees_i_own(2, key, None));
}

#[test]
fn silence_kills_only_with_a_majority() {
    let mut m = Membership::new(1, 7, &[1, 2, 3], DEAD, 0);
    m.heard(DEAD, 2, &header(1, 100));
    assert!(m.check(DEAD + 50).contains(&Change::Down(3)));
    assert!(!m.is_alive(3));
    // Node 2 goes silent too: 1 of 3 is no majority, so nobody more is declared dead.
    assert!(m.check(10 * DEAD).is_empty());
    assert!(m.is_alive(2));
    // Node 3 is heard again.
    assert_eq!(m.heard(11 * DEAD, 3, &header(1, 5)), vec![Change::Up(3)]);
}

#[test]
fn a_new_incarnation_is_a_restart_and_leaving_drops_at_once() {
    let mut m = Membership::new(1, 7, &[1, 2, 3], DEAD, 0);
    m.heard(10, 2, &header(1, 10));
    assert_eq!(m.heard(20, 2, &header(2, 20)), vec![Change::Restarted(2)]);
    let mut leaving = header(2, 30);
    leaving.leaving = true;
    assert_eq!(m.heard(30, 2, &leaving), vec![Change::Left(2)]);
    assert_eq!(m.alive_count(), 2);
    // A frame it sent before leaving, overtaken by the leaving one, brings it back
    // neither alive nor restarted; a new incarnation does.
    assert!(m.heard(31, 2, &header(2, 25)).is_empty());
    assert_eq!(m.alive_count(), 2);
    assert!(
        m.heard(40, 2, &header(3, 40))
            .contains(&Change::Restarted(2))
    );
    assert_eq!(m.alive_count(), 3);
}

#[test]
fn the_majority_is_counted_over_the_members_that_did_not_leave() {
    let mut m = Membership::new(1, 7, &[1, 2, 3, 4, 5], DEAD, 0);
    for p in 2..=5 {
        m.heard(10, p, &header(1, 10));
    }
    let mut leaving = header(1, 20);
    leaving.leaving = true;
    for p in [3, 4, 5] {
        m.heard(20, p, &leaving);
    }
    // Two of the five configured, both of the two that stayed.
    assert_eq!(m.quorum_of(), 2);
    assert!(m.has_majority());
    assert!(m.check(30).is_empty());
    // A member that dies still counts: one of two is no majority.
    assert!(m.check(10 + DEAD).is_empty());
    assert!(!m.is_majority(1));
}

#[test]
fn owners_are_spread_and_move_only_with_their_member() {
    let m = Membership::new(1, 1, &[1, 2, 3, 4], DEAD, 0);
    let owners: Vec<NodeId> = (0..4000u64).map(|k| m.owner_and_successor(k).0).collect();
    for id in 1..=4 {
        let n = owners.iter().filter(|&&o| o == id).count();
        assert!((800..1200).contains(&n), "node {id} owns {n}");
    }
    let mut smaller = m.clone();
    smaller.peers.get_mut(&4).unwrap().alive = false;
    smaller.reindex();
    for (k, &owner) in owners.iter().enumerate() {
        let (now, _) = smaller.owner_and_successor(k as u64);
        if owner != 4 {
            assert_eq!(now, owner, "key {k} moved");
        } else {
            // The successor takes over.
            assert_eq!(Some(now), m.owner_and_successor(k as u64).1);
        }
    }
}

fn member(id: NodeId, seq: u32, state: MemberState) -> Member {
    Member {
        id,
        incarnation: 0,
        seq,
        state,
        addr: b"127.0.0.1:7009".to_vec(),
    }
}

#[test]
fn a_member_named_by_another_counts_once_heard_and_is_forgotten_when_told_gone() {
    let mut m = Membership::new(1, 7, &[1, 2], DEAD, 0);
    m.heard(10, 2, &header(1, 10));
    let heard = m.hear_members(20, 2, &[member(9, 0, MemberState::Alive)]);
    assert_eq!(heard.changes, vec![Change::Learned(9)]);
    let p = m.peer(9).unwrap();
    assert!(p.pending && !p.alive);
    assert_eq!(p.addr, Some("127.0.0.1:7009".parse().unwrap()));
    // Not counted, no owner, never declared dead by silence.
    assert_eq!((m.quorum_of(), m.alive_count()), (2, 2));
    assert!((0..100).all(|k| m.owner_and_successor(k).0 != 9));
    m.heard(DEAD + 5, 2, &header(1, 30));
    assert!(!m.check(DEAD + 10).contains(&Change::Down(9)));
    // Heard: a member like any other.
    assert_eq!(m.heard(DEAD + 20, 9, &header(3, 5)), vec![Change::Up(9)]);
    assert_eq!(m.quorum_of(), 3);
    // Another pending member, told dead, is forgotten.
    m.hear_members(DEAD + 30, 2, &[member(8, 0, MemberState::Alive)]);
    let heard = m.hear_members(DEAD + 40, 2, &[member(8, 0, MemberState::Dead)]);
    assert_eq!(heard.changes, vec![Change::Forgotten(8)]);
    assert!(m.peer(8).is_none());
}

#[test]
fn a_suspected_node_refutes_and_the_refutation_clears_the_suspicion() {
    let mut suspect = Membership::new(3, 9, &[1, 2, 3], DEAD, 0);
    let mut told = member(3, 0, MemberState::Suspect);
    told.incarnation = 9;
    suspect.hear_members(10, 2, &[told]);
    assert_eq!(suspect.seq(), 1);
    let refutation = suspect.news();
    assert_eq!(refutation.len(), 1);
    assert_eq!(
        (refutation[0].id, refutation[0].seq, refutation[0].state),
        (3, 1, MemberState::Alive)
    );
    // Node 1 no longer hears node 3, suspects it, and tells.
    let mut m = Membership::new(1, 7, &[1, 2, 3], DEAD, 0);
    m.heard(DEAD / 2, 2, &header(1, 10));
    assert!(m.check(DEAD / 2).contains(&Change::Suspected(3)));
    let news = m.news();
    assert!(
        news.iter()
            .any(|n| n.id == 3 && n.state == MemberState::Suspect)
    );
    // Node 2 passes node 3's refutation on: node 3 is alive, vouched for.
    m.hear_members(DEAD / 2 + 10, 2, &refutation);
    assert!(m.peer(3).unwrap().suspect_since.is_none());
    m.heard(DEAD, 2, &header(1, 20));
    // Silent for `dead_after`, but vouched for since: suspected again, not dead.
    assert_eq!(m.check(DEAD + 10), vec![Change::Suspected(3)]);
    assert!(m.is_alive(3));
    // A suspicion of node 3 told by node 2 is passed on to node 3.
    let heard = m.hear_members(DEAD + 20, 2, &[member(3, 1, MemberState::Suspect)]);
    assert_eq!(heard.relay.len(), 1);
    assert_eq!(heard.relay[0].0, 3);
}

#[test]
fn headers_echo_the_newest_frame_and_confirm_ours() {
    let mut m = Membership::new(1, 1, &[1, 2], DEAD, 0);
    let mut from_2 = header(9, 500);
    from_2.echo = 40;
    m.heard(600, 2, &from_2);
    assert_eq!(m.peer(2).unwrap().confirmed, 40);
    let h = m.header(700, 2);
    assert_eq!((h.echo, h.held), (500, 100));
}

/// The ranking as the peer table says it, computed afresh (what the kept lists must agree
/// with).
fn ranked_afresh(m: &Membership, key: u64) -> Vec<NodeId> {
    let mut live: Vec<NodeId> = std::iter::once(m.me)
        .chain(m.peers().iter().filter(|(_, p)| p.alive).map(|(&id, _)| id))
        .collect();
    live.sort_by_key(|&id| std::cmp::Reverse(weight(key, id)));
    live.truncate(2);
    live
}

fn agrees_afresh(m: &Membership, id: NodeId, key: u64) -> bool {
    let Some(dead) = m.peer(id).and_then(|p| p.their_dead.as_ref()) else {
        return false;
    };
    let theirs = weight(key, id);
    !dead.contains(&m.me)
        && theirs < weight(key, m.me)
        && m.peers()
            .iter()
            .filter(|&(&peer, p)| peer != id && !p.left && !dead.contains(&peer))
            .all(|(&peer, _)| weight(key, peer) < theirs)
}

proptest::proptest! {
    #![proptest_config(crate::testing::proptest_config(200))]
    /// Whatever the membership goes through (members added, heard, restarted, leaving, named
    /// by rumor, declared dead, forgotten), ranking by the kept lists agrees with ranking
    /// the peer table afresh.
    #[test]
    fn ranking_follows_every_membership_change(
        ops in proptest::collection::vec((0u8..7, 1u64..10, 0u64..3), 1..80),
    ) {
        let mut m = Membership::new(1, 7, &[1, 2, 3, 4], DEAD, 0);
        // Each key's ranking kept across the changes, as a holding keeps it.
        let memos: Vec<RankMemo> = (0..16).map(|_| RankMemo::default()).collect();
        let mut now: Nanos = 1;
        for (op, id, arg) in ops {
            now += 30_000_000;
            match op {
                0 => { m.add(id, None, now); }
                1 => {
                    let mut h = header(1 + arg, now);
                    h.dead = Some(vec![(id + arg) % 10]);
                    m.heard(now, id, &h);
                }
                2 => {
                    let mut h = header(1, now);
                    h.leaving = true;
                    m.heard(now, id, &h);
                }
                3 => {
                    let state = [MemberState::Alive, MemberState::Dead, MemberState::Left][arg as usize];
                    let mut told = member(id, 5, state);
                    told.incarnation = 1;
                    m.hear_members(now, 2, &[told]);
                }
                4 => now += DEAD * (1 + arg),
                5 => now += FORGET_AFTER_NS,
                _ => {
                    for peer in 2..5 {
                        m.heard(now, peer, &header(1, now));
                    }
                }
            }
            m.check(now);
            // The last lease first: what the previous step cached is asked again.
            for lease in [3 * DEAD, 10_000_000, DEAD, 3 * DEAD] {
                for at in [now, now + lease / 2, now + lease] {
                    let heard = 1 + m
                        .peers()
                        .values()
                        .filter(|p| !p.left && p.frame_at > 0 && p.frame_at + lease > at)
                        .count();
                    proptest::prop_assert_eq!(at < m.majority_heard_until(lease), m.is_majority(heard));
                    proptest::prop_assert_eq!(m.majority_heard_at(at, lease), m.is_majority(heard));
                }
            }
            for (i, memo) in memos.iter().enumerate() {
                let key = mix(i as u64);
                let afresh = ranked_afresh(&m, key);
                proptest::prop_assert_eq!(m.ranked_all(key).into_iter().take(2).collect::<Vec<_>>(), afresh.clone());
                let (owner, successor) = m.owner_and_successor_in(key, memo);
                proptest::prop_assert_eq!(Some(owner), afresh.first().copied());
                proptest::prop_assert_eq!(successor, afresh.get(1).copied());
                for peer in 2..10 {
                    let agrees = agrees_afresh(&m, peer, key);
                    proptest::prop_assert_eq!(m.agrees_i_own(peer, key, None), agrees);
                    proptest::prop_assert_eq!(m.agrees_i_own(peer, key, Some(memo)), agrees);
                }
            }
        }
    }
}

#[test]
fn addresses_travel_as_text_and_anything_else_is_no_address() {
    for text in ["10.0.0.7:7000", "[fd00::7]:7000"] {
        let addr: std::net::SocketAddr = text.parse().unwrap();
        assert_eq!(addr_to_wire(Some(addr)), text.as_bytes());
        assert_eq!(addr_from_wire(text.as_bytes()), Some(addr));
    }
    assert!(addr_to_wire(None).is_empty());
    for bytes in [&b""[..], b"node-7", b"10.0.0.7", &[0xff, 0xfe]] {
        assert_eq!(addr_from_wire(bytes), None);
    }
}
