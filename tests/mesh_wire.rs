//! The peer frame decoder: arbitrary bytes never panic, never allocate past the limit, and
//! every refusal is typed.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use proptest::prelude::*;
use ratemesh::mesh::counter::GCounter;
use ratemesh::mesh::wire::{MAX_FRAME_BYTES, WIRE_VERSION, WireError, decode, encode};

struct Largest;

thread_local! {
    /// The largest allocation made by this thread since the last reset.
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LARGEST.try_with(|largest| largest.set(largest.get().max(layout.size())));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Largest = Largest;

/// A message shaped like what the gossip will carry.
#[derive(Debug, Clone, PartialEq, bincode::Encode, bincode::Decode)]
struct Delta {
    from: u64,
    note: String,
    counters: Vec<(u64, GCounter)>,
}

/// Run `f` and return its result with the largest allocation it made on this thread.
fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|largest| largest.set(0));
    let result = f();
    (result, LARGEST.with(Cell::get))
}

#[test]
fn a_frame_round_trips() {
    let mut counter = GCounter::new();
    counter.increment(3, 7);
    let message = Delta {
        from: 9,
        note: "hello".into(),
        counters: vec![(42, counter)],
    };
    let frame = encode(&message).unwrap();
    assert_eq!(frame[0], WIRE_VERSION);
    assert_eq!(decode::<Delta>(&frame).unwrap(), message);
}

#[test]
fn a_peer_cannot_smuggle_unsorted_or_duplicate_counter_entries() {
    #[derive(bincode::Encode)]
    struct Raw {
        from: u64,
        note: String,
        counters: Vec<(u64, Vec<(u64, u64)>)>,
    }
    let frame = encode(&Raw {
        from: 1,
        note: String::new(),
        counters: vec![(5, vec![(9, 4), (2, 7), (9, 11), (3, 0)])],
    })
    .unwrap();
    let decoded: Delta = decode(&frame).unwrap();
    let counter = &decoded.counters[0].1;
    assert_eq!(counter.entries(), &[(2, 7), (9, 11)]);
    assert_eq!(counter.total(), 18);
}

#[test]
fn bad_frames_are_typed_errors() {
    let frame = encode(&Delta {
        from: 1,
        note: String::new(),
        counters: vec![],
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

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
    }
}
