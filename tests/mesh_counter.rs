//! The mesh's G-Counter obeys the CRDT laws and agrees with `crdts::GCounter`.

#[path = "support/cases.rs"]
mod cases;

use crdts::{CmRDT, CvRDT};
use proptest::prelude::*;
use ratemesh::mesh::counter::GCounter;

/// Increments `(node, by)` applied to a fresh counter.
fn counter_from(ops: &[(u64, u64)]) -> GCounter {
    let mut counter = GCounter::new();
    for &(node, by) in ops {
        counter.increment(node, by);
    }
    counter
}

fn ops() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0u64..6, 0u64..1000), 0..40)
}

fn merged(mut a: GCounter, b: GCounter) -> GCounter {
    a.merge(b);
    a
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases::cases(256)))]

    #[test]
    fn merge_is_commutative_associative_and_idempotent(a in ops(), b in ops(), c in ops()) {
        let (a, b, c) = (counter_from(&a), counter_from(&b), counter_from(&c));
        prop_assert_eq!(merged(a.clone(), b.clone()), merged(b.clone(), a.clone()));
        prop_assert_eq!(
            merged(merged(a.clone(), b.clone()), c.clone()),
            merged(a.clone(), merged(b.clone(), c.clone()))
        );
        prop_assert_eq!(merged(a.clone(), a.clone()), a.clone());
    }

    #[test]
    fn merges_and_ops_never_lower_a_count(a in ops(), b in ops(), stale in prop::collection::vec((0u64..6, 0u64..500), 0..20)) {
        let mut counter = merged(counter_from(&a), counter_from(&b));
        let before: Vec<(u64, u64)> = counter.entries().to_vec();
        let total = counter.total();
        for (node, count) in stale {
            counter.apply(crdts::Dot::new(node, count));
        }
        for (node, count) in before {
            prop_assert!(counter.get(node) >= count);
        }
        prop_assert!(counter.total() >= total);
    }

    /// The same increments, replicated and merged in any grouping, read the same total as
    /// `crdts::GCounter` fed the same ops, also when ops are duplicated and reordered.
    #[test]
    fn agrees_with_crdts_gcounter(ops in ops(), split in 0usize..40, seed in any::<u64>()) {
        let split = split.min(ops.len());
        let mut reference = crdts::GCounter::<u64>::new();
        let mut dots = Vec::new();
        let mut ours = GCounter::new();
        for &(node, by) in &ops {
            let op = reference.inc_many(node, by);
            reference.apply(op);
            dots.push(ours.increment(node, by));
        }
        // A replica that got the ops in another order, some twice.
        let mut replica = GCounter::new();
        let mut order: Vec<usize> = (0..dots.len()).chain(0..split).collect();
        let mut x = seed | 1;
        for i in (1..order.len()).rev() {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            order.swap(i, (x % (i as u64 + 1)) as usize);
        }
        for i in order {
            replica.apply(dots[i]);
        }
        prop_assert_eq!(&replica, &ours);
        prop_assert_eq!(ours.total().to_string(), reference.read().to_string());
        // State merge of two halves equals the whole.
        let (left, right) = ops.split_at(split);
        let mut half = GCounter::new();
        let mut other = GCounter::new();
        for &(node, by) in left { half.increment(node, by); }
        for &(node, by) in right { other.increment(node, by); }
        let mut reference_left = crdts::GCounter::<u64>::new();
        let mut reference_right = crdts::GCounter::<u64>::new();
        for &(node, by) in left { let op = reference_left.inc_many(node, by); reference_left.apply(op); }
        for &(node, by) in right { let op = reference_right.inc_many(node, by); reference_right.apply(op); }
        half.merge(other);
        reference_left.merge(reference_right);
        prop_assert_eq!(half.total().to_string(), reference_left.read().to_string());
    }
}
