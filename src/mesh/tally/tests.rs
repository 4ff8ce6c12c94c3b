//! The tally's merge obeys the CRDT laws, and the tallies of a key's holdings, merged
//! record by record, count what `crdts::GCounter` counts when fed the same increments.

use std::collections::BTreeMap;

use crdts::{CmRDT, CvRDT, GCounter};
use proptest::prelude::*;

use super::Tally;

fn tally() -> impl Strategy<Value = Tally> {
    (0u64..1 << 40, 0u64..1 << 40, 0u64..1 << 40).prop_map(|(granted, returned, used)| Tally {
        granted,
        returned,
        used,
    })
}

fn merged(mut a: Tally, b: Tally) -> Tally {
    a.merge(b);
    a
}

/// The records of some holdings (holding id → tally), as one state of an authority knows
/// them, merged with another state's as `Authority::merge` folds records together.
fn merge_records(mine: &mut BTreeMap<u64, Tally>, theirs: &BTreeMap<u64, Tally>) {
    for (id, t) in theirs {
        mine.entry(*id).or_default().merge(*t);
    }
}

proptest! {
    #![proptest_config(crate::testing::proptest_config(512))]

    #[test]
    fn merge_is_commutative_associative_and_idempotent(a in tally(), b in tally(), c in tally()) {
        prop_assert_eq!(merged(a, b), merged(b, a));
        prop_assert_eq!(merged(merged(a, b), c), merged(a, merged(b, c)));
        prop_assert_eq!(merged(a, a), a);
        // No merge lowers a count.
        let m = merged(a, b);
        prop_assert!(m.granted >= a.granted && m.returned >= a.returned && m.used >= a.used);
    }

    /// Two states of an authority see some of the increments of some holdings, each in
    /// any order and some twice (a duplicated report): merged, each count summed over the
    /// holdings is the `crdts::GCounter` of every increment, seen once.
    #[test]
    fn holdings_merged_count_what_a_gcounter_counts(
        ops in proptest::collection::vec((0u64..6, 0usize..3, 1u64..1000, any::<bool>(), any::<bool>()), 0..80),
    ) {
        // Each holding's counts as it reported them, increment by increment.
        let mut reported: BTreeMap<u64, Tally> = BTreeMap::new();
        let (mut here, mut there) = (BTreeMap::new(), BTreeMap::new());
        let mut counters = [GCounter::<u64>::new(), GCounter::new(), GCounter::new()];
        for &(holding, which, by, seen_here, seen_there) in &ops {
            let t = reported.entry(holding).or_default();
            let count = match which {
                0 => &mut t.granted,
                1 => &mut t.returned,
                _ => &mut t.used,
            };
            *count += by;
            let op = counters[which].inc_many(holding, by);
            counters[which].apply(op);
            let snapshot = *t;
            // A state that sees the report keeps the holding's latest counts; one that
            // sees it twice changes nothing more.
            if seen_here {
                merge_records(&mut here, &BTreeMap::from([(holding, snapshot)]));
                merge_records(&mut here, &BTreeMap::from([(holding, snapshot)]));
            }
            if seen_there {
                merge_records(&mut there, &BTreeMap::from([(holding, snapshot)]));
            }
        }
        // Every report reaches one state or the other at the end (the last one of each
        // holding, as a final report does).
        merge_records(&mut there, &reported);
        let mut a = here.clone();
        merge_records(&mut a, &there);
        let mut b = there.clone();
        merge_records(&mut b, &here);
        prop_assert_eq!(&a, &b);
        let sum = |f: fn(&Tally) -> u64| a.values().map(f).sum::<u64>().to_string();
        let read = |c: &GCounter<u64>| c.read().to_string();
        prop_assert_eq!(sum(|t| t.granted), read(&counters[0]));
        prop_assert_eq!(sum(|t| t.returned), read(&counters[1]));
        prop_assert_eq!(sum(|t| t.used), read(&counters[2]));
    }
}
