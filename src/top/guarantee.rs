//! Property tests: the summary properties and the top-n guarantee of the module docs, checked
//! against exact counts, for single sketches, merges, merges of merges, truncated parts and
//! the two-generation window.

use super::{Entry, Recent, SpaceSaving, Summary, guaranteed_top, merge};
use proptest::prelude::*;
use std::collections::HashMap;

type Exact = HashMap<u64, u64>;

fn exact(stream: &[(u64, u64)]) -> Exact {
    let mut m = Exact::new();
    for &(k, w) in stream {
        *m.entry(k).or_default() += w;
    }
    m
}

fn sketch(m: usize, stream: &[(u64, u64)]) -> SpaceSaving {
    let mut s = SpaceSaving::new(m);
    for &(k, w) in stream {
        s.record(k, w);
    }
    s
}

/// Properties 1–3, the ranking, and the top-n guarantee for every `n` the summary claims.
fn check(s: &Summary, truth: &Exact) -> Result<(), TestCaseError> {
    let n_total: u64 = truth.values().sum();
    prop_assert_eq!(s.total, n_total);
    let listed: u128 = s.entries.iter().map(|e| u128::from(e.count)).sum();
    prop_assert!(
        listed <= u128::from(n_total),
        "listed {} > total {}",
        listed,
        n_total
    );
    for pair in s.entries.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        prop_assert!(a.count > b.count || (a.count == b.count && a.key < b.key));
    }
    let mut by_key: HashMap<u64, Entry> = HashMap::new();
    for e in &s.entries {
        prop_assert!(
            by_key.insert(e.key, *e).is_none(),
            "key {} listed twice",
            e.key
        );
        let f = truth.get(&e.key).copied().unwrap_or(0);
        prop_assert!(e.lower() <= f && f <= e.count, "{:?} vs true {}", e, f);
        prop_assert!(
            e.error <= s.floor && s.floor <= e.count,
            "{:?} floor {}",
            e,
            s.floor
        );
    }
    for (&k, &f) in truth {
        if !by_key.contains_key(&k) {
            prop_assert!(f <= s.floor, "unlisted {} has {} > floor {}", k, f, s.floor);
        }
    }
    // Key `k` must be within the first `n` for every `n` from the smallest with
    // `f * n > N` up to the bound, i.e. within the first `n_min`.
    let bound = s.guaranteed_top() as u128;
    let rank: HashMap<u64, usize> = s
        .entries
        .iter()
        .enumerate()
        .map(|(i, e)| (e.key, i))
        .collect();
    for (&k, &f) in truth {
        if f == 0 {
            continue;
        }
        let n_min = u128::from(n_total) / u128::from(f) + 1;
        if n_min <= bound {
            let at = rank.get(&k).map(|&i| i as u128);
            prop_assert!(
                at.is_some_and(|i| i < n_min),
                "key {} ({} of {}) at {:?}, not in top {}",
                k,
                f,
                n_total,
                at,
                n_min
            );
        }
    }
    Ok(())
}

/// A stream: background keys from a small or a large domain with random weights, plus heavy
/// keys placed at random, at the start or only at the end.
fn stream() -> impl Strategy<Value = Vec<(u64, u64)>> {
    let domain = prop_oneof![Just(6u64), Just(40), Just(100_000)];
    let weights = prop_oneof![Just(1u64), Just(7), Just(1000)];
    let heavy = prop::collection::vec((any::<u64>(), 1u64..400), 0..4);
    (
        domain,
        weights,
        prop::collection::vec(any::<u64>(), 0..600),
        heavy,
        0u8..3,
    )
        .prop_map(|(domain, max_w, raw, heavy, placement)| {
            let mut v: Vec<(u64, u64)> = raw
                .iter()
                .map(|r| ((r >> 20) % domain, 1 + (r & 0xFFFF) % max_w))
                .collect();
            for (h, reps) in heavy {
                let key = h | (1 << 63); // apart from the background keys
                for j in 0..reps {
                    let item = (key, 1 + (h >> 8) % max_w);
                    match placement {
                        0 => {
                            let at = (h.wrapping_add(j.wrapping_mul(0x9E37_79B9)) as usize)
                                % (v.len() + 1);
                            v.insert(at, item)
                        }
                        1 => v.insert(0, item),
                        _ => v.push(item),
                    }
                }
            }
            v
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// One sketch, and a merge of 1–8 sketches each fed a part of the stream.
    #[test]
    fn single_and_merged(
        m in prop_oneof![3 => 1usize..24, 1 => 24usize..300],
        v in stream(),
        parts in 1usize..=8,
        contiguous in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let truth = exact(&v);
        let s = sketch(m, &v);
        check(&s.summary(), &truth)?;
        prop_assert!(s.summary().guaranteed_top() >= guaranteed_top(m));

        let mut split: Vec<Vec<(u64, u64)>> = vec![Vec::new(); parts];
        for (i, &item) in v.iter().enumerate() {
            let p = if contiguous {
                i * parts / v.len().max(1)
            } else {
                (seed.rotate_left(i as u32 % 64) ^ i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    as usize
                    % parts
            };
            split[p].push(item);
        }
        let sums: Vec<Summary> = split
            .iter()
            .map(|part| {
                let s = sketch(m, part);
                check(&s.summary(), &exact(part))?;
                Ok(s.summary())
            })
            .collect::<Result<_, TestCaseError>>()?;
        let merged = merge(&sums, m);
        prop_assert!(merged.entries.len() <= m);
        prop_assert!(merged.guaranteed_top() >= guaranteed_top(m));
        check(&merged, &truth)?;

        // Merges compose: threads into nodes, nodes into one.
        let nodes: Vec<Summary> = sums.chunks(3).map(|c| merge(c, m)).collect();
        let top = merge(&nodes, m);
        prop_assert!(top.guaranteed_top() >= guaranteed_top(m));
        check(&top, &truth)?;

        // Parts cut to their top entries stay valid; the merge's bound follows the cut.
        let cut = 1 + (seed as usize) % m;
        let mut cut_sums = sums.clone();
        for (s, part) in cut_sums.iter_mut().zip(&split) {
            s.truncate(cut);
            prop_assert!(s.entries.len() <= cut);
            check(s, &exact(part))?;
        }
        let merged_cut = merge(&cut_sums, m);
        check(&merged_cut, &truth)?;
        prop_assert!(merged_cut.guaranteed_top() >= cut);
    }

    /// The window: what `summary(now)` reports is bounded by the records of the generations it
    /// keeps (the current period and the one before), with the guarantee over their total.
    #[test]
    fn recent_window(
        m in 1usize..16,
        v in stream(),
        steps in prop::collection::vec(0u64..40, 0..600),
        probe in 0u64..200,
    ) {
        let period = 50;
        let mut r = Recent::new(m, period);
        let mut now = 0;
        let mut timed = Vec::new();
        for (i, &(k, w)) in v.iter().enumerate() {
            now += steps.get(i).copied().unwrap_or(1);
            r.record(k, w, now);
            timed.push((now / period, k, w));
        }
        let at = now + probe;
        let current = at / period;
        let kept: Vec<(u64, u64)> = timed
            .iter()
            .filter(|&&(p, _, _)| p + 1 >= current)
            .map(|&(_, k, w)| (k, w))
            .collect();
        let s = r.summary(at);
        check(&s, &exact(&kept))?;
        prop_assert!(s.guaranteed_top() >= guaranteed_top(m));
    }

    /// Weights near `u64::MAX` never panic and keep every count within the saturated total.
    #[test]
    fn huge_weights_do_not_panic(m in 1usize..8, v in prop::collection::vec((0u64..10, any::<u64>()), 0..64)) {
        let s = sketch(m, &v);
        prop_assert!(s.entries().all(|e| e.count <= s.total() && e.error <= e.count));
        let merged = merge([&s.summary(), &s.summary(), &Summary::default()], m);
        prop_assert!(merged.entries.len() <= m);
        prop_assert!(s.top(m + 1).len() == s.len());
    }
}
