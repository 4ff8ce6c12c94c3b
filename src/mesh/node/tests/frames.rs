//! Frames from peers: bad ones are refused, counted and change nothing; arbitrary bytes
//! never panic; deltas fit a datagram; grants addressed to a node's earlier run and limits
//! out of range are refused.

use proptest::prelude::*;

use super::*;
use crate::mesh::FrameError;
use crate::mesh::message::{Frame, Grant, Header, Item, KeyRef, PolicyLimits, Want};
use crate::mesh::tally::Tally;
use crate::mesh::wire::{self, MAX_FRAME_BYTES, WIRE_VERSION, WireError};
use crate::testing::proptest_config;

fn want(policy: u32, granted: u64, used: u64) -> Want {
    Want {
        key: KeyRef { policy, key: 7 },
        window: 0,
        tally: Tally {
            granted,
            returned: 0,
            used,
        },
        closed: false,
        need: 1,
        smallest: 1,
        seq: 1,
        refill: false,
        demand: 16,
        spent_ago: 0,
        previous_used: None,
        holding: 1,
    }
}

fn frame(now: u64, items: Vec<Item>) -> Frame {
    Frame {
        header: Header {
            incarnation: 1,
            sent_at: now,
            ..Header::default()
        },
        items,
    }
}

#[test]
fn bad_frames_are_dropped_counted_and_change_nothing() {
    let mut c = Cluster::new(3);
    let key = 7;
    c.send(1, key, 50);
    c.send(0, key, 50);
    c.run_ms(60);
    let now = c.now;
    let before = snapshot(c.node(0), key);
    let dropped_before = c.node(0).stats().frames_dropped;
    let good = wire::encode(&frame(now, vec![Item::Want(want(0, 0, 0))])).unwrap();
    let mut wrong_version = good.clone();
    wrong_version[0] = WIRE_VERSION + 1;
    let truncated = good[..good.len() / 2].to_vec();
    let mut trailing = good.clone();
    trailing.push(0);
    let oversized = vec![WIRE_VERSION; MAX_FRAME_BYTES + 1];
    let mut claims_huge_vec = vec![WIRE_VERSION, 1, 0, 0, 0, 0, 0, 0, 0];
    claims_huge_vec.extend([253, 255, 255, 255, 255, 255, 255, 255, 255]);
    let encode = |f: Frame| wire::encode(&f).unwrap();
    let cases: Vec<(&str, Vec<u8>, u64)> = vec![
        ("empty", vec![], 1),
        ("wrong version", wrong_version, 1),
        ("truncated", truncated, 1),
        ("trailing bytes", trailing, 1),
        ("oversized", oversized, 1),
        ("huge length claim", claims_huge_vec, 1),
        (
            "used above granted",
            encode(frame(now, vec![Item::Want(want(0, 5, 6))])),
            1,
        ),
        (
            "unknown policy",
            encode(frame(now, vec![Item::Want(want(9, 0, 0))])),
            1,
        ),
        (
            "incarnation 0",
            encode(Frame {
                header: Header::default(),
                items: vec![],
            }),
            1,
        ),
        ("from a stranger", good, 99),
    ];
    for (i, (name, bytes, from)) in cases.iter().enumerate() {
        let result = c.node(0).handle_frame(now, *from, bytes);
        assert!(result.is_err(), "{name} was accepted");
        assert_eq!(snapshot(c.node(0), key), before, "{name} changed the state");
        assert_eq!(
            c.node(0).stats().frames_dropped,
            dropped_before + i as u64 + 1,
            "{name} was not counted"
        );
    }
    assert!(matches!(
        c.node(0).handle_frame(now, 1, &[]),
        Err(FrameError::Wire(WireError::Empty))
    ));
    // The cluster carries on.
    let admitted = c.total_admitted();
    c.send(1, key, 10);
    assert_eq!(c.total_admitted(), admitted + 10);
}

proptest! {
    #![proptest_config(proptest_config(512))]

    /// Arbitrary bytes (and bytes that start like a frame) never panic and change nothing
    /// unless they decode into a valid frame.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300), versioned in any::<bool>()) {
        let mut node = start(0, 3, START, hour_policy());
        let mut bytes = bytes;
        if versioned && !bytes.is_empty() {
            bytes[0] = WIRE_VERSION;
        }
        let before = (snapshot(&node, 7), node.stats().frames_received);
        if node.handle_frame(START, 1, &bytes).is_err() {
            prop_assert_eq!((snapshot(&node, 7), node.stats().frames_received), before);
            prop_assert_eq!(node.stats().frames_dropped, 1);
        }
    }
}

#[test]
fn frames_fit_a_datagram() {
    let mut c = Cluster::new(2);
    let mut waiting = 0;
    for key in 0..2000 {
        let now = c.now;
        if let Admit::Wait(_) = c.node(1).decide(0, key, 1, now) {
            waiting += 1;
        }
    }
    assert!(waiting > 500, "{waiting} of 2000 keys are owned by node 0");
    let mut sizes = Vec::new();
    for _ in 0..3 {
        c.now += 20 * MS;
        let now = c.now;
        c.node(0).handle_timeout(now);
        c.node(1).handle_timeout(now);
        for from in [0, 1] {
            while let Some(t) = c.node(from).poll_transmit() {
                sizes.push(t.bytes.len());
                let to = t.to as usize;
                c.node(to).handle_frame(now, from as u64, &t.bytes).unwrap();
            }
        }
    }
    c.deliver();
    assert!(sizes.len() > 20, "2000 keys in {} frames", sizes.len());
    assert!(sizes.iter().all(|&s| s <= 1150), "{sizes:?}");
    let decided = c
        .events
        .iter()
        .filter(|(_, e)| matches!(e, Event::Decided { decision, .. } if decision.is_allowed()))
        .count();
    assert_eq!(decided, waiting, "waiting requests admitted");
}

#[test]
fn grants_sent_to_a_nodes_earlier_run_are_dropped() {
    let mut c = Cluster::new(2);
    let key = c.key_owned_by(1);
    c.send(0, key, 3);
    c.run_ms(60);
    let now = c.now;
    let before = snapshot(c.node(0), key);
    let window = c.node(0).lease_state(0, key).unwrap().window;
    let me = c.node(0).incarnation();
    let sender = c.node(1).incarnation();
    // A grant the owner sent before it heard that node 0 restarted (addressed to node 0's
    // earlier run), for a holding number the new run uses too.
    let grant = |to_incarnation: u64| {
        let frame = Frame {
            header: Header {
                incarnation: sender,
                to_incarnation,
                sent_at: now,
                ..Header::default()
            },
            items: vec![Item::Grant(Grant {
                key: KeyRef { policy: 0, key },
                window,
                granted: 90,
                ends_at: now + 10_000_000_000,
                retry_after: 0,
                more_coming: 0,
                answers: 0,
                holding: 1,
            })],
        };
        wire::encode(&frame).unwrap()
    };
    c.node(0).handle_frame(now, 1, &grant(me + 1)).unwrap();
    assert_eq!(c.node(0).stats().to_earlier_run, 1);
    assert_eq!(snapshot(c.node(0), key), before);
    // Addressed to this run, the same grant counts.
    c.node(0).handle_frame(now, 1, &grant(me)).unwrap();
    assert_ne!(snapshot(c.node(0), key), before);
}

/// Reconfigure node `i` to a fixed window of `limit` per hour, announcing `digest`.

#[test]
fn announced_limits_out_of_range_are_refused() {
    let mut c = Cluster::new(2);
    let now = c.now;
    let incarnation = c.node(1).incarnation();
    let frame = Frame {
        header: Header {
            incarnation,
            sent_at: now,
            digest: 5,
            ..Header::default()
        },
        items: vec![Item::Limits(vec![PolicyLimits {
            algorithm: 3,
            capacity: 0,
            interval_ns: 1,
            window_ns: 3_600_000_000_000,
        }])],
    };
    let bytes = wire::encode(&frame).unwrap();
    assert!(c.node(0).handle_frame(now, 1, &bytes).is_err());
    assert_eq!(c.node(0).policies()[0].capacity(), LIMIT);
}
