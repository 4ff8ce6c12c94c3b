//! Properties of the pure algorithms over random arrivals and costs, with explicit time.

#[path = "support/cases.rs"]
mod cases;

use std::time::Duration;

use proptest::prelude::*;
use ratemesh::algorithm::KeyMachine;
use ratemesh::algorithm::KeyState;
use ratemesh::{Algorithm, Decision, Policy, Verdict};

const SECOND: u64 = 1_000_000_000;

/// Feed `(gap_ns, cost)` arrivals to a fresh machine; return `(time, cost, decision)`.
fn run(policy: Policy, arrivals: &[(u64, u64)]) -> Vec<(u64, u64, Decision)> {
    let mut machine = KeyMachine::new(policy);
    let mut now = SECOND; // not at the epoch, so "fresh" is not confused with "at time 0"
    arrivals
        .iter()
        .map(|&(gap, cost)| {
            now += gap;
            (now, cost, machine.decide(now, cost))
        })
        .collect()
}

fn admitted(trace: &[(u64, u64, Decision)]) -> Vec<(u64, u64)> {
    trace
        .iter()
        .filter(|(_, _, d)| d.is_allowed())
        .map(|&(t, c, _)| (t, c))
        .collect()
}

/// The largest total cost admitted in any half-open interval `[t, t + window)`.
fn max_in_any_window(admitted: &[(u64, u64)], window: u64) -> u64 {
    (0..admitted.len())
        .map(|i| {
            admitted[i..]
                .iter()
                .take_while(|&&(t, _)| t < admitted[i].0 + window)
                .map(|&(_, c)| c)
                .sum()
        })
        .max()
        .unwrap_or(0)
}

/// Arrivals with gaps up to `max_gap_ns` and costs up to `max_cost`. Half the gaps are
/// whole milliseconds, so that arrivals land exactly on refill and window boundaries.
fn arrivals(max_gap_ns: u64, max_cost: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
    let gap = prop_oneof![
        0..max_gap_ns,
        (0..=max_gap_ns / 1_000_000).prop_map(|ms| ms * 1_000_000),
    ];
    prop::collection::vec((gap, 1..=max_cost), 1..250)
}

/// A retry at `retry_after_ns` succeeds and one nanosecond earlier does not, if nothing else
/// arrives: the `Retry-After` the HTTP layer sends is exact.
fn check_retry_after_is_exact(
    policy: Policy,
    arrivals: &[(u64, u64)],
) -> Result<(), TestCaseError> {
    let mut machine = KeyMachine::new(policy);
    let mut now = SECOND;
    for &(gap, cost) in arrivals {
        now += gap;
        let before = machine.clone();
        let decision = machine.decide(now, cost);
        if decision.verdict == Verdict::Denied {
            let retry = decision.retry_after_ns;
            let mut later = before.clone();
            prop_assert!(
                later.decide(now + retry, cost).is_allowed(),
                "{policy:?}: denied at {now} with retry {retry}, still denied then"
            );
            if retry > 1 {
                let mut early = before.clone();
                prop_assert!(
                    !early.decide(now + retry - 1, cost).is_allowed(),
                    "{policy:?}: retry {retry} at {now} is later than needed"
                );
            }
        }
    }
    Ok(())
}

/// In every interval `[t_i, t_j]` between two admissions, the admitted cost is at most
/// `capacity + (t_j − t_i)/T` (T = the policy's interval): `b + r·t` for a bucket.
fn check_capacity_plus_rate_bound(
    policy: Policy,
    arrivals: &[(u64, u64)],
) -> Result<(), TestCaseError> {
    let t = policy.interval_ns();
    let capacity = policy.capacity();
    let admitted = admitted(&run(policy, arrivals));
    for i in 0..admitted.len() {
        let mut sum = 0;
        for j in i..admitted.len() {
            sum += admitted[j].1;
            let span = admitted[j].0 - admitted[i].0;
            prop_assert!(sum * t <= capacity * t + span, "{sum} tokens in {span} ns");
        }
    }
    Ok(())
}

/// A rate per second (often one that divides a second into whole milliseconds) and a burst.
fn rate_policy() -> impl Strategy<Value = (u64, u64)> {
    let rate = prop_oneof![
        1u64..200,
        prop::sample::select(vec![1u64, 2, 4, 5, 8, 10, 20, 25, 40, 50, 100, 125, 200])
    ];
    (rate, 1u64..40)
}

/// A cost of 0 is a peek, the same for every algorithm: between any two arrivals it is
/// admitted exactly when a request of one token would be, reports that request's retry time
/// when denied (and its delay when shaped), counts the tokens before it, and changes no
/// later decision.
fn check_a_peek_tells_the_truth(
    policy: Policy,
    arrivals: &[(u64, u64)],
) -> Result<(), TestCaseError> {
    let shaping = matches!(policy.algorithm(), Algorithm::LeakyBucketShape { .. });
    let mut peeked = KeyMachine::new(policy);
    let mut plain = KeyMachine::new(policy);
    let mut now = SECOND;
    for &(gap, cost) in arrivals {
        // Peek halfway through the gap and just before the arrival.
        for at in [now + gap / 2, now + gap] {
            let mut probe = peeked.clone();
            let one = probe.decide(at, 1);
            let peek = peeked.decide(at, 0);
            prop_assert_eq!(peek.verdict, one.verdict, "{:?} at {}", policy, at);
            prop_assert_eq!(peek.limit, one.limit);
            if one.is_allowed() {
                prop_assert_eq!(peek.delay_ns, one.delay_ns);
                if !shaping {
                    prop_assert_eq!(peek.remaining, one.remaining + 1, "{:?} at {}", policy, at);
                }
            } else {
                prop_assert_eq!(
                    peek.retry_after_ns,
                    one.retry_after_ns,
                    "{:?} at {}",
                    policy,
                    at
                );
                prop_assert_eq!(peek.remaining, one.remaining);
            }
        }
        now += gap;
        prop_assert_eq!(
            peeked.decide(now, cost),
            plain.decide(now, cost),
            "a peek changed a decision"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases::cases(256)))]

    #[test]
    fn token_bucket_admits_at_most_burst_plus_rate_times_t(
        (rate, burst) in rate_policy(),
        arrivals in arrivals(SECOND / 8, 6),
    ) {
        let policy = Policy::token_bucket(rate, Duration::from_secs(1), burst).unwrap();
        check_capacity_plus_rate_bound(policy, &arrivals)?;
    }

    #[test]
    fn leaky_bucket_police_admits_at_most_capacity_plus_rate_times_t(
        (rate, capacity) in rate_policy(),
        arrivals in arrivals(SECOND / 8, 6),
    ) {
        let policy = Policy::leaky_bucket_police(rate, Duration::from_secs(1), capacity).unwrap();
        check_capacity_plus_rate_bound(policy, &arrivals)?;
    }

    #[test]
    fn gcra_token_bucket_and_police_bucket_agree_on_every_decision(
        (rate, burst) in rate_policy(),
        arrivals in arrivals(SECOND / 8, 45),
    ) {
        let period = Duration::from_secs(1);
        let tb = run(Policy::token_bucket(rate, period, burst).unwrap(), &arrivals);
        let gcra = run(Policy::gcra(rate, period, burst).unwrap(), &arrivals);
        let police = run(Policy::leaky_bucket_police(rate, period, burst).unwrap(), &arrivals);
        for ((a, b), c) in tb.iter().zip(&gcra).zip(&police) {
            prop_assert_eq!(a.2, b.2, "token bucket vs GCRA at {}", a.0);
            prop_assert_eq!(a.2, c.2, "token bucket vs police bucket at {}", a.0);
        }
    }

    #[test]
    fn gcra_agrees_with_governor(
        (rate, burst) in rate_policy(),
        arrivals in arrivals(SECOND / 8, 45),
    ) {
        use governor::clock::FakeRelativeClock;
        use governor::{Quota, RateLimiter};
        use std::num::NonZeroU32;
        let policy = Policy::gcra(rate, Duration::from_secs(1), burst).unwrap();
        let quota = Quota::with_period(Duration::from_nanos(policy.interval_ns()))
            .unwrap()
            .allow_burst(NonZeroU32::new(burst as u32).unwrap());
        let clock = FakeRelativeClock::default();
        let governor = RateLimiter::direct_with_clock(quota, clock.clone());
        let ours = run(policy, &arrivals);
        for (&(gap, cost), (_, _, decision)) in arrivals.iter().zip(&ours) {
            clock.advance(Duration::from_nanos(gap));
            let theirs = governor.check_n(NonZeroU32::new(cost as u32).unwrap());
            match theirs {
                Err(_) => prop_assert_eq!(decision.verdict, Verdict::CannotFit),
                Ok(Ok(())) => prop_assert_eq!(decision.verdict, Verdict::Allowed),
                Ok(Err(not_until)) => {
                    prop_assert_eq!(decision.verdict, Verdict::Denied);
                    let wait = not_until.wait_time_from(governor::clock::Clock::now(&clock));
                    prop_assert_eq!(decision.retry_after_ns as u128, wait.as_nanos());
                }
            }
        }
    }

    #[test]
    fn sliding_log_is_exact(
        limit in 1u64..30,
        window_ms in 1u64..2000,
        arrivals in arrivals(SECOND / 4, 5),
    ) {
        let window = window_ms * 1_000_000;
        let policy = Policy::sliding_log(limit, Duration::from_millis(window_ms)).unwrap();
        let trace = run(policy, &arrivals);
        // Oracle: admit iff the admitted cost in (now − W, now] plus this cost fits.
        let mut log: Vec<(u64, u64)> = Vec::new();
        for &(now, cost, decision) in &trace {
            let in_window: u64 = log.iter().filter(|&&(t, _)| t + window > now).map(|&(_, c)| c).sum();
            let expect = if cost > limit {
                Verdict::CannotFit
            } else if in_window + cost <= limit {
                log.push((now, cost));
                Verdict::Allowed
            } else {
                Verdict::Denied
            };
            prop_assert_eq!(decision.verdict, expect, "at {}", now);
        }
        prop_assert!(max_in_any_window(&admitted(&trace), window) <= limit);
    }

    #[test]
    fn fixed_window_admits_at_most_limit_per_aligned_window(
        limit in 1u64..30,
        window_ms in 1u64..2000,
        arrivals in arrivals(SECOND / 4, 5),
    ) {
        let window = window_ms * 1_000_000;
        let policy = Policy::fixed_window(limit, Duration::from_millis(window_ms)).unwrap();
        let admitted = admitted(&run(policy, &arrivals));
        let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
        for (t, c) in admitted {
            *per_window.entry(t / window).or_default() += c;
        }
        prop_assert!(per_window.values().all(|&sum| sum <= limit), "{per_window:?}");
    }

    #[test]
    fn sliding_window_admits_at_most_limit_per_aligned_window_and_twice_per_interval(
        limit in 1u64..30,
        window_ms in 1u64..2000,
        arrivals in arrivals(SECOND / 4, 5),
    ) {
        let window = window_ms * 1_000_000;
        let policy = Policy::sliding_window(limit, Duration::from_millis(window_ms)).unwrap();
        let admitted = admitted(&run(policy, &arrivals));
        let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
        for &(t, c) in &admitted {
            *per_window.entry(t / window).or_default() += c;
        }
        prop_assert!(per_window.values().all(|&sum| sum <= limit));
        prop_assert!(max_in_any_window(&admitted, window) <= 2 * limit);
    }

    #[test]
    fn leaky_bucket_shape_releases_no_closer_than_cost_over_rate(
        (rate, _) in rate_policy(),
        max_wait_ms in 0u64..2000,
        arrivals in arrivals(SECOND / 8, 3),
    ) {
        let policy = Policy::leaky_bucket_shape(rate, Duration::from_secs(1), Duration::from_millis(max_wait_ms)).unwrap();
        let t = policy.interval_ns();
        let trace = run(policy, &arrivals);
        let mut last: Option<(u64, u64)> = None; // (release time, cost)
        for (now, cost, decision) in trace {
            if !decision.is_allowed() {
                continue;
            }
            prop_assert!(decision.delay_ns <= max_wait_ms * 1_000_000);
            let release = now + decision.delay_ns;
            if let Some((previous, previous_cost)) = last {
                prop_assert!(release >= previous + previous_cost * t,
                    "released at {release}, {} ns after the previous", release - previous);
            }
            last = Some((release, cost));
        }
    }

    #[test]
    fn retry_after_is_exact_for_every_algorithm(
        (rate, burst) in rate_policy(),
        window_ms in 1u64..2000,
        arrivals in arrivals(SECOND / 8, 4),
    ) {
        let second = Duration::from_secs(1);
        let window = Duration::from_millis(window_ms);
        let limit = burst;
        for policy in [
            Policy::token_bucket(rate, second, burst).unwrap(),
            Policy::gcra(rate, second, burst).unwrap(),
            Policy::leaky_bucket_police(rate, second, burst).unwrap(),
            Policy::leaky_bucket_shape(rate, second, window).unwrap(),
            Policy::fixed_window(limit, window).unwrap(),
            Policy::sliding_log(limit, window).unwrap(),
            Policy::sliding_window(limit, window).unwrap(),
        ] {
            check_retry_after_is_exact(policy, &arrivals)?;
        }
    }

    #[test]
    fn a_zero_cost_is_a_peek_that_tells_the_truth(
        (rate, burst) in rate_policy(),
        arrivals in arrivals(SECOND / 8, 4),
    ) {
        let second = Duration::from_secs(1);
        let limit = burst + 4;
        for policy in [
            Policy::token_bucket(rate, second, burst).unwrap(),
            Policy::gcra(rate, second, burst).unwrap(),
            Policy::leaky_bucket_police(rate, second, burst).unwrap(),
            Policy::leaky_bucket_shape(rate, second, Duration::from_millis(250)).unwrap(),
            Policy::fixed_window(limit, second).unwrap(),
            Policy::sliding_log(limit, second).unwrap(),
            Policy::sliding_window(limit, second).unwrap(),
        ] {
            let arrivals: Vec<(u64, u64)> = arrivals
                .iter()
                .map(|&(gap, cost)| (gap, cost.min(policy.capacity())))
                .collect();
            check_a_peek_tells_the_truth(policy, &arrivals)?;
        }
    }

    #[test]
    fn a_cost_above_capacity_can_never_fit(
        (rate, burst) in rate_policy(),
        extra in 1u64..1000,
    ) {
        let second = Duration::from_secs(1);
        for policy in [
            Policy::token_bucket(rate, second, burst).unwrap(),
            Policy::gcra(rate, second, burst).unwrap(),
            Policy::leaky_bucket_police(rate, second, burst).unwrap(),
            Policy::fixed_window(burst, second).unwrap(),
            Policy::sliding_log(burst, second).unwrap(),
            Policy::sliding_window(burst, second).unwrap(),
        ] {
            let mut machine = KeyMachine::new(policy);
            let decision = machine.decide(SECOND, burst + extra);
            prop_assert_eq!(decision.verdict, Verdict::CannotFit);
            prop_assert!(machine.is_idle(SECOND), "a CannotFit charged something");
            prop_assert!(policy.validate_cost(burst + extra).is_err());
        }
    }
}

#[test]
fn fixed_window_admits_twice_the_limit_across_a_boundary() {
    let limit = 100;
    let policy = Policy::fixed_window(limit, Duration::from_secs(1)).unwrap();
    let boundary = 10 * SECOND;
    // `limit` requests 1 ns before the boundary, `limit` more 1 ns after it.
    let mut arrivals = vec![(boundary - 1 - SECOND, 1)];
    arrivals.extend(std::iter::repeat_n((0, 1), limit as usize - 1));
    arrivals.push((2, 1));
    arrivals.extend(std::iter::repeat_n((0, 1), limit as usize - 1));
    let trace = run(policy, &arrivals);
    let admitted = admitted(&trace);
    assert_eq!(admitted.len() as u64, 2 * limit);
    assert_eq!(
        max_in_any_window(&admitted, 3),
        2 * limit,
        "2x the limit within 3 ns"
    );
    // The sliding log, on the same arrivals, holds the line.
    let log = run(
        Policy::sliding_log(limit, Duration::from_secs(1)).unwrap(),
        &arrivals,
    );
    assert_eq!(max_in_any_window(&admitted_of(&log), SECOND), limit);
}

fn admitted_of(trace: &[(u64, u64, Decision)]) -> Vec<(u64, u64)> {
    admitted(trace)
}

/// Poisson arrivals of bursts of 1..=`max_burst` requests (1 = plain Poisson), at `demand`
/// times `limit` per second on average, for `seconds`; deterministic for a seed.
fn poisson_trace(seed: u64, limit: u64, demand: f64, max_burst: u64, seconds: u64) -> Vec<u64> {
    let mut state = seed | 1;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let mean_burst = (1 + max_burst) as f64 / 2.0;
    let bursts_per_ns = demand * limit as f64 / mean_burst / SECOND as f64;
    let mut now = SECOND;
    let mut times = Vec::new();
    while now < (seconds + 1) * SECOND {
        now += (-(1.0 - uniform()).ln() / bursts_per_ns) as u64 + 1;
        let burst = 1 + (uniform() * max_burst as f64) as u64;
        times.extend(std::iter::repeat_n(now, burst.min(max_burst) as usize));
    }
    times
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases::cases(48)))]

    /// The bound stated in `src/algorithm/sliding_window.rs`: on Poisson and bursty traffic,
    /// the sliding-window counter admits at most `3·√(limit·B)` more than `limit` in any
    /// interval of length W (B = the largest burst, at most `limit / 2`; never more than `limit`
    /// extra), and its
    /// total stays within 15% of the exact sliding log's.
    #[test]
    fn sliding_window_error_against_sliding_log_is_bounded(
        seed in any::<u64>(),
        limit in prop::sample::select(vec![10u64, 100, 1000]),
        demand in prop::sample::select(vec![0.5f64, 1.0, 2.0, 3.0, 5.0]),
        max_burst in prop::sample::select(vec![1u64, 5, 20]),
    ) {
        // Bursts are at most half the limit: a single burst above the limit is not traffic
        // that a per-second limit shapes, it is one request too many.
        prop_assume!(2 * max_burst <= limit);
        let window = Duration::from_secs(1);
        let times = poisson_trace(seed, limit, demand, max_burst, 20);
        let arrivals: Vec<(u64, u64)> = std::iter::once((times[0] - SECOND, 1))
            .chain(times.windows(2).map(|w| (w[1] - w[0], 1)))
            .collect();
        let counter = admitted(&run(Policy::sliding_window(limit, window).unwrap(), &arrivals));
        let log = admitted(&run(Policy::sliding_log(limit, window).unwrap(), &arrivals));
        let extra = max_in_any_window(&counter, SECOND).saturating_sub(limit) as f64;
        let bound = (3.0 * ((limit * max_burst) as f64).sqrt()).min(limit as f64);
        prop_assert!(extra <= bound, "{extra} over the limit {limit}, bound {bound:.1}");
        let ratio = counter.len() as f64 / log.len() as f64;
        prop_assert!((0.85..=1.15).contains(&ratio), "admitted {ratio:.3}x the sliding log");
    }
}

#[test]
fn a_peek_at_an_exhausted_key_is_a_denial_with_the_retry_time() {
    let second = Duration::from_secs(1);
    for policy in [
        Policy::token_bucket(10, second, 2).unwrap(),
        Policy::gcra(10, second, 2).unwrap(),
        Policy::leaky_bucket_police(10, second, 2).unwrap(),
        Policy::leaky_bucket_shape(10, second, Duration::from_millis(100)).unwrap(),
        Policy::fixed_window(2, second).unwrap(),
        Policy::sliding_log(2, second).unwrap(),
        Policy::sliding_window(2, second).unwrap(),
    ] {
        let mut machine = KeyMachine::new(policy);
        let now = 10 * SECOND;
        let fresh = machine.decide(now, 0);
        assert!(fresh.is_allowed(), "{policy:?}");
        assert_eq!(fresh.remaining, policy.capacity(), "{policy:?}");
        while machine.decide(now, 1).is_allowed() {}
        let peek = machine.decide(now, 0);
        let one = machine.clone().decide(now, 1);
        assert_eq!(
            peek.verdict,
            Verdict::Denied,
            "{policy:?}: a peek at an exhausted key"
        );
        assert_eq!(peek.remaining, 0, "{policy:?}");
        assert!(peek.retry_after_ns > 0, "{policy:?}");
        assert_eq!(peek.retry_after_ns, one.retry_after_ns, "{policy:?}");
        assert!(
            machine
                .clone()
                .decide(now + peek.retry_after_ns, 1)
                .is_allowed(),
            "{policy:?}: a request at the peek's retry time is admitted"
        );
    }
}

#[test]
fn peeks_add_no_entry_to_a_sliding_log() {
    let policy = Policy::sliding_log(3, Duration::from_secs(1)).unwrap();
    let mut machine = KeyMachine::new(policy);
    assert!(machine.decide(SECOND, 1).is_allowed());
    for i in 1..=1000 {
        machine.decide(SECOND + i, 0);
    }
    let KeyState::SlidingLog(log) = machine.state() else {
        panic!("not a log");
    };
    assert_eq!(log.len(), 1, "peeks were logged");
    assert!(machine.is_idle(2 * SECOND));
}
