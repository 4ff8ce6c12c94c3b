//! `ratemesh algorithms`: one burst and then a steady stream through each algorithm, on a
//! manual clock, and what each admits.

use std::time::Duration;

use ratemesh::{Limiter, ManualClock, Policy, PolicyError, Verdict};

fn policies(rate: u64) -> Result<Vec<(Policy, &'static str)>, PolicyError> {
    let second = Duration::from_secs(1);
    Ok(vec![
        (
            Policy::token_bucket(rate, second, rate)?,
            "bucket of `rate` tokens, refilled continuously",
        ),
        (
            Policy::gcra(rate, second, rate)?,
            "same decisions as the token bucket, kept as one timestamp",
        ),
        (
            Policy::leaky_bucket_police(rate, second, rate)?,
            "meter: rejects what would overflow",
        ),
        (
            Policy::leaky_bucket_shape(rate, second, Duration::from_millis(500))?,
            "queue: delays each request to its slot, at most 500 ms",
        ),
        (
            Policy::fixed_window(rate, second)?,
            "`rate` per aligned second; resets at each boundary",
        ),
        (
            Policy::sliding_log(rate, second)?,
            "exact: `rate` in every 1 s interval",
        ),
        (
            Policy::sliding_window(rate, second)?,
            "weighted previous + current window",
        ),
    ])
}

/// Print the tour for a policy of `rate` per second, a burst of `burst` requests and then
/// `steady` requests per second.
pub(super) fn run(rate: u64, burst: u64, steady: u64) -> Result<(), Box<dyn std::error::Error>> {
    const MS: u64 = 1_000_000;
    println!(
        "ratemesh algorithms: policy {rate}/s; a burst of {burst} requests at t=0, \
         then {steady} req/s for 2 s; then one request that costs {} tokens.\n",
        rate * 100
    );
    println!(
        "{:<20} {:>12} {:>14} {:>16} {:>14}  why",
        "algorithm", "burst ok", "steady ok", "first retry ms", "max delay ms"
    );
    for (policy, why) in policies(rate)? {
        let clock = ManualClock::new(0);
        let limiter = Limiter::builder()
            .policy(policy)
            .clock(clock.clone())
            .build::<String>()?;
        let mut burst_ok = 0;
        let mut first_retry_ms = None;
        let mut max_delay_ns = 0;
        for _ in 0..burst {
            let d = limiter.check("client-1", 1);
            match d.verdict {
                Verdict::Allowed => {
                    burst_ok += 1;
                    max_delay_ns = max_delay_ns.max(d.delay_ns);
                }
                _ => {
                    first_retry_ms.get_or_insert(d.retry_after_ns as f64 / MS as f64);
                }
            }
        }
        let mut steady_ok = 0;
        let sent = steady * 2;
        if let Some(gap_ns) = (1_000 * MS).checked_div(steady) {
            for _ in 0..sent {
                clock.advance_ns(gap_ns);
                let d = limiter.check("client-1", 1);
                if d.is_allowed() {
                    steady_ok += 1;
                    max_delay_ns = max_delay_ns.max(d.delay_ns);
                }
            }
        }
        let huge = limiter.check("client-1", rate * 100);
        assert_eq!(huge.verdict, Verdict::CannotFit);
        let retry = first_retry_ms.map_or("-".to_string(), |ms| format!("{ms:.1}"));
        println!(
            "{:<20} {:>12} {:>14} {:>16} {:>14.1}  {why}",
            policy.algorithm().name(),
            format!("{burst_ok}/{burst}"),
            format!("{steady_ok}/{sent}"),
            retry,
            max_delay_ns as f64 / MS as f64,
        );
    }
    println!(
        "\nEvery algorithm answered the {}-token request with CannotFit: a cost above the \
         capacity is refused for good, not asked to retry.",
        rate * 100
    );
    Ok(())
}
