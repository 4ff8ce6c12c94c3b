//! Charges given back to the leases they came from, at random moments (before and after the
//! holders reported them, across idle returns and recalls), never let the cluster admit more
//! than the policy: the admissions that stand stay within a fixed window's limit, and within
//! a bucket's burst plus its refill.

use proptest::prelude::*;

use super::*;
use crate::decision::MeshCharge;

/// One step: a request on `node`, kept or given back after `refund_after` steps (`None`:
/// kept), then `advance` ms.
#[derive(Debug, Clone)]
struct Step {
    node: usize,
    refund_after: Option<u8>,
    advance: u8,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (0usize..3, prop::option::weighted(0.6, 0u8..40), 0u8..3).prop_map(
            |(node, refund_after, advance)| Step {
                node,
                refund_after,
                advance,
            },
        ),
        1..1500,
    )
}

/// Run `steps` on a 3-node cluster of `policy` for one key; return the admissions that
/// stand, the charges that went back, and how long it ran (ns).
fn run(policy: Policy, steps: &[Step]) -> (u64, u64, u64) {
    let mut c = Cluster::with(3, policy);
    let key = c.key_owned_by(0);
    let start = c.now;
    let (mut admitted, mut returned) = (0u64, 0u64);
    // (due step, node, charge) of the charges to give back.
    let mut due: Vec<(usize, usize, MeshCharge)> = Vec::new();
    // (node, request id, refund after) of the requests waiting for the owner.
    let mut waiting: Vec<(usize, u64, Option<u8>)> = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let now = c.now;
        match c.node(step.node).decide(0, key, 1, now) {
            Admit::Now(d, charge) if d.is_allowed() => {
                admitted += 1;
                if let (Some(after), Some(charge)) = (step.refund_after, charge) {
                    due.push((i + usize::from(after), step.node, charge));
                }
            }
            Admit::Now(..) => {}
            Admit::Wait(id) => waiting.push((step.node, id, step.refund_after)),
        }
        c.deliver();
        for (node, event) in std::mem::take(&mut c.events) {
            let Event::Decided {
                id,
                decision,
                charge,
            } = event
            else {
                continue;
            };
            let Some(at) = waiting.iter().position(|w| (w.0, w.1) == (node, id)) else {
                continue;
            };
            let (_, _, refund_after) = waiting.swap_remove(at);
            if decision.is_allowed() {
                admitted += 1;
                if let (Some(after), Some(charge)) = (refund_after, charge) {
                    due.push((i + usize::from(after), node, charge));
                }
            }
        }
        due.retain(|&(when, node, charge)| {
            if when > i {
                return true;
            }
            if c.nodes[node].as_ref().unwrap().refund(0, key, 1, charge) {
                returned += 1;
            }
            false
        });
        c.run_ms(u64::from(step.advance));
    }
    c.run_ms(200);
    (admitted - returned, returned, c.now - start)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A window of an hour (nothing refills during a run): what stands stays within the
    /// limit, however the charges come back.
    #[test]
    fn refunds_never_take_a_window_over_its_limit(steps in steps()) {
        let policy = Policy::global_fixed_window(200, Duration::from_secs(3600)).unwrap();
        let (standing, _, _) = run(policy, &steps);
        prop_assert!(standing <= 200, "{standing} admissions stand");
    }

    /// A bucket of 100 refilling 10 a second: what stands stays within the burst plus the
    /// refill over the run, however the charges come back (as given back tokens or spent ones).
    #[test]
    fn refunds_never_take_a_bucket_over_its_burst_and_refill(steps in steps()) {
        let policy = Policy::token_bucket(10, Duration::from_secs(1), 100).unwrap();
        let (standing, _, ran) = run(policy, &steps);
        let refill = ran / 100_000_000 + 1;
        prop_assert!(standing <= 100 + refill, "{standing} admissions stand over {ran} ns");
    }
}

/// Charges given back while the lease they came from lasts go back to it, and the node
/// admits them again: with every request given back at once, the window's limit is never
/// reached.
#[test]
fn charges_given_back_at_once_are_admitted_again() {
    let policy = Policy::global_fixed_window(50, Duration::from_secs(3600)).unwrap();
    let steps: Vec<Step> = (0..600)
        .map(|i| Step {
            node: i % 3,
            refund_after: Some(0),
            advance: 1,
        })
        .collect();
    let (standing, returned, _) = run(policy, &steps);
    assert_eq!(standing, 0);
    assert!(returned >= 550, "{returned} of 600 went back");
}
