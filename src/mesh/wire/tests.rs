//! The peer frame decoder: arbitrary bytes never panic, never allocate past the limit, and
//! every refusal is typed; frames that list members round-trip, and lists too long or with
//! addresses too long are refused.

use proptest::prelude::*;

use super::check::{FrameError, decode as decode_frame};
use super::{MAX_FRAME_BYTES, WIRE_VERSION, WireError, decode, encode};
use crate::mesh::message::{
    Frame, Header, Item, MAX_ADDR_BYTES, MAX_MEMBERS_PER_ITEM, Member, MemberState,
};
use crate::mesh::tally::Tally;
use crate::testing::{largest_allocation, proptest_config};

/// A message shaped like what the gossip will carry.
#[derive(Debug, Clone, PartialEq, bincode::Encode, bincode::Decode)]
struct Delta {
    from: u64,
    note: String,
    tallies: Vec<(u64, Tally)>,
}

#[test]
fn a_frame_round_trips() {
    let message = Delta {
        from: 9,
        note: "hello".into(),
        tallies: vec![(
            42,
            Tally {
                granted: 7,
                returned: 2,
                used: 3,
            },
        )],
    };
    let frame = encode(&message).unwrap();
    assert_eq!(frame[0], WIRE_VERSION);
    assert_eq!(decode::<Delta>(&frame).unwrap(), message);
}

#[test]
fn bad_frames_are_typed_errors() {
    let frame = encode(&Delta {
        from: 1,
        note: String::new(),
        tallies: vec![],
    })
    .unwrap();
    assert_eq!(decode::<Delta>(&[]), Err(WireError::Empty));
    let mut other_version = frame.clone();
    other_version[0] = WIRE_VERSION + 1;
    assert!(matches!(
        decode::<Delta>(&other_version),
        Err(WireError::UnknownVersion { .. })
    ));
    let mut trailing = frame.clone();
    trailing.extend_from_slice(&[0, 0, 0]);
    assert_eq!(
        decode::<Delta>(&trailing),
        Err(WireError::TrailingBytes {
            consumed: frame.len() - 1,
            extra: 3
        })
    );
    assert!(matches!(
        decode::<Delta>(&frame[..frame.len() - 1]),
        Err(WireError::Malformed { .. })
    ));
    assert!(matches!(
        decode::<Delta>(&vec![WIRE_VERSION; MAX_FRAME_BYTES + 1]),
        Err(WireError::TooLarge { .. })
    ));
}

#[test]
fn a_frame_claiming_a_huge_string_is_refused_without_allocating_it() {
    // from = 1, then a string whose varint length claims 2^44 bytes.
    let frame = [WIRE_VERSION, 1, 0xfd, 0, 0, 0, 0, 0, 0x10, 0];
    let (result, largest) = largest_allocation(|| decode::<Delta>(&frame));
    assert!(
        matches!(result, Err(WireError::Malformed { .. })),
        "{result:?}"
    );
    assert!(largest < 4096, "allocated {largest} bytes");
}

fn members_frame(members: Vec<Member>) -> Frame {
    Frame {
        header: Header {
            incarnation: 1,
            sent_at: 5,
            ..Header::default()
        },
        items: vec![Item::Members(members)],
    }
}

fn member(id: u64, addr_len: usize) -> Member {
    Member {
        id,
        incarnation: id * 3,
        seq: 2,
        state: MemberState::Suspect,
        addr: vec![b'7'; addr_len],
    }
}

#[test]
fn a_list_of_members_round_trips_and_one_too_long_is_refused() {
    let policies = [];
    let frame = members_frame(
        (1..=MAX_MEMBERS_PER_ITEM as u64)
            .map(|id| member(id, 21))
            .collect(),
    );
    let bytes = encode(&frame).unwrap();
    assert!(bytes.len() < 1150, "{} bytes", bytes.len());
    assert_eq!(decode_frame(&bytes, &policies).unwrap(), frame);
    let too_many = members_frame(
        (0..=MAX_MEMBERS_PER_ITEM as u64)
            .map(|id| member(id, 0))
            .collect(),
    );
    assert!(matches!(
        decode_frame(&encode(&too_many).unwrap(), &policies),
        Err(FrameError::Invalid {
            what: "members",
            ..
        })
    ));
    let long_addr = members_frame(vec![member(1, MAX_ADDR_BYTES + 1)]);
    assert!(matches!(
        decode_frame(&encode(&long_addr).unwrap(), &policies),
        Err(FrameError::Invalid {
            what: "members.addr",
            ..
        })
    ));
    // A state that does not exist.
    let mut bytes = encode(&members_frame(vec![member(1, 0)])).unwrap();
    let state_at = bytes.len() - 2;
    bytes[state_at] = 9;
    assert!(matches!(
        decode_frame(&bytes, &policies),
        Err(FrameError::Wire(WireError::Malformed { .. }))
    ));
}

fn any_member() -> impl Strategy<Value = Member> {
    (
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        0u8..4,
        prop::collection::vec(any::<u8>(), 0..=MAX_ADDR_BYTES),
    )
        .prop_map(|(id, incarnation, seq, state, addr)| Member {
            id,
            incarnation,
            seq,
            state: [
                MemberState::Alive,
                MemberState::Suspect,
                MemberState::Dead,
                MemberState::Left,
            ][state as usize],
            addr,
        })
}

proptest! {
    #![proptest_config(proptest_config(512))]

    /// Any valid list of members survives the wire unchanged.
    #[test]
    fn lists_of_members_round_trip(
        members in prop::collection::vec(any_member(), 0..=MAX_MEMBERS_PER_ITEM),
    ) {
        let frame = members_frame(members);
        let bytes = encode(&frame).unwrap();
        prop_assert_eq!(decode_frame(&bytes, &[]).unwrap(), frame);
    }

    /// Bytes shaped like a frame of members, then mangled: typed refusals, bounded memory.
    #[test]
    fn mangled_member_frames_never_panic_or_allocate_past_the_limit(
        members in prop::collection::vec(any_member(), 0..4),
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..8),
    ) {
        let mut bytes = encode(&members_frame(members)).unwrap();
        for (at, value) in flips {
            let at = at % bytes.len();
            bytes[at] = value;
        }
        let (_, largest) = largest_allocation(|| decode_frame(&bytes, &[]));
        prop_assert!(largest <= MAX_FRAME_BYTES, "allocated {largest} bytes");
    }
}

proptest! {
    #![proptest_config(proptest_config(2048))]

    #[test]
    fn arbitrary_bytes_never_panic_or_allocate_past_the_limit(
        mut bytes in prop::collection::vec(any::<u8>(), 0..512),
        versioned in any::<bool>(),
    ) {
        if versioned && !bytes.is_empty() {
            bytes[0] = WIRE_VERSION;
        }
        let (_, largest) = largest_allocation(|| decode::<Delta>(&bytes));
        prop_assert!(largest <= MAX_FRAME_BYTES, "allocated {largest} bytes");
        let (_, largest) = largest_allocation(|| decode_frame(&bytes, &[]));
        prop_assert!(largest <= MAX_FRAME_BYTES, "allocated {largest} bytes as a frame");
    }
}

/// The previous release's items (wire version 8): every kind but [`Item::Ext`], in order.
#[derive(Debug, bincode::Decode)]
#[allow(dead_code)]
enum ItemV8 {
    Want(crate::mesh::message::Want),
    Grant(crate::mesh::message::Grant),
    Recall {
        key: crate::mesh::message::KeyRef,
        keep: u64,
    },
    Backup(crate::mesh::message::AuthorityState),
    Handoff(crate::mesh::message::AuthorityState),
    Restore(crate::mesh::message::AuthorityState),
    NotOwner(crate::mesh::message::KeyRef),
    SyncDone,
    Retired,
    Members(Vec<Member>),
    Limits(Vec<crate::mesh::message::PolicyLimits>),
}

/// The previous release's frame.
#[derive(Debug, bincode::Decode)]
#[allow(dead_code)]
struct FrameV8 {
    header: Header,
    items: Vec<ItemV8>,
}

fn ext_frame(items: Vec<Item>) -> Vec<u8> {
    encode(&Frame {
        header: Header {
            incarnation: 1,
            ..Header::default()
        },
        items,
    })
    .unwrap()
}

#[test]
fn extension_items_are_checked_and_the_previous_release_refuses_only_their_frames() {
    use crate::mesh::locks::MAX_LOCKOUT_NS;
    use crate::mesh::message::{EXT_LOCKOUT, Ext, KeyRef, Lockout, MAX_EXT_BODY_BYTES};
    let policies =
        [crate::Policy::global_fixed_window(10, std::time::Duration::from_secs(1)).unwrap()];
    let lockout = |policy: u32, left_ns: u64| {
        super::encode_ext(
            EXT_LOCKOUT,
            &Lockout {
                key: KeyRef { policy, key: 7 },
                left_ns,
            },
        )
        .unwrap()
    };
    let good = lockout(0, 900 * 1_000_000_000);
    let frame = decode_frame(&ext_frame(vec![Item::Ext(good.clone())]), &policies).unwrap();
    assert_eq!(frame.items, vec![Item::Ext(good.clone())]);
    let back: Lockout = super::decode_ext(&good).unwrap();
    assert_eq!(back.left_ns, 900 * 1_000_000_000);
    // A kind this build does not know passes (it is skipped when applied).
    let unknown = Ext {
        kind: 99,
        body: vec![1, 2, 3],
    };
    assert!(decode_frame(&ext_frame(vec![Item::Ext(unknown)]), &policies).is_ok());
    for (bad, what) in [
        (lockout(1, 1), "key.policy"),
        (lockout(0, MAX_LOCKOUT_NS + 1), "lockout.left_ns"),
        (
            Ext {
                kind: 99,
                body: vec![0; MAX_EXT_BODY_BYTES + 1],
            },
            "ext.body",
        ),
    ] {
        match decode_frame(&ext_frame(vec![Item::Ext(bad)]), &policies) {
            Err(FrameError::Invalid { what: got, .. }) => assert_eq!(got, what),
            other => panic!("{what}: {other:?}"),
        }
    }
    // The admin API's: a reset of a policy this node has, forgiving no more than its limit.
    let reset = |policy: u32, forgiven: u64| {
        super::encode_ext(
            crate::mesh::message::EXT_RESET,
            &crate::mesh::message::Reset {
                key: KeyRef { policy, key: 7 },
                window: 3,
                forgiven,
            },
        )
        .unwrap()
    };
    assert!(decode_frame(&ext_frame(vec![Item::Ext(reset(0, 10))]), &policies).is_ok());
    for (bad, what) in [
        (reset(1, 1), "key.policy"),
        (reset(0, u64::MAX), "reset.forgiven"),
    ] {
        match decode_frame(&ext_frame(vec![Item::Ext(bad)]), &policies) {
            Err(FrameError::Invalid { what: got, .. }) => assert_eq!(got, what),
            other => panic!("{what}: {other:?}"),
        }
    }
    let ask = Ext {
        kind: crate::mesh::message::EXT_ASK,
        body: vec![0xff; 3],
    };
    assert!(decode_frame(&ext_frame(vec![Item::Ext(ask)]), &policies).is_err());
    let mut trailing = good.clone();
    trailing.body.push(0);
    assert!(matches!(
        decode_frame(&ext_frame(vec![Item::Ext(trailing)]), &policies),
        Err(FrameError::Wire(WireError::TrailingBytes { .. }))
    ));
    // The previous release reads every frame without extension items, and refuses (whole)
    // one that carries one: the reason they travel in frames of their own.
    assert!(decode::<FrameV8>(&ext_frame(vec![Item::SyncDone])).is_ok());
    assert!(matches!(
        decode::<FrameV8>(&ext_frame(vec![Item::Ext(good)])),
        Err(WireError::Malformed { .. })
    ));
}
