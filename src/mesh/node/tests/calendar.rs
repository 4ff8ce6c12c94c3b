//! Calendar windows on the mesh, on a manual clock at their edges: a month in Paris ends at
//! the last midnight of a leap February and the next one at a midnight of summer time, a
//! day of 23 hours is one window, a year ends at New Year; the key's owner crashing in the
//! period hands it on with its calendar; a sliding window weighs the month before.

use super::lockouts::decision;
use super::*;
use crate::Decision;

const S: u64 = 1_000_000_000;
/// The limit of the tests' policies.
const L: u64 = 20;

/// 2028-02-29T23:00:00Z: March 2028 begins in Paris (CET).
const MARCH_2028_PARIS: u64 = 1_835_478_000 * S;
/// 2028-03-31T22:00:00Z: April 2028 begins in Paris (CEST).
const APRIL_2028_PARIS: u64 = 1_838_152_800 * S;
/// 2028-03-26T22:00:00Z: the end of Paris's day of 23 hours (clocks went forward at 02:00).
const MARCH_27_2028_PARIS: u64 = 1_837_720_800 * S;
/// 2028-03-27T22:00:00Z: the end of the day after.
const MARCH_28_2028_PARIS: u64 = 1_837_807_200 * S;
/// 2029-01-01T00:00:00Z and 2030-01-01T00:00:00Z.
const YEAR_2029: u64 = 1_861_920_000 * S;
const YEAR_2030: u64 = 1_893_456_000 * S;

/// A cluster of `n` nodes at `now`, whose one policy counts `period`s of `zone`.
fn calendar_cluster(
    n: usize,
    policy: Policy,
    period: &'static str,
    zone: &'static str,
    now: u64,
) -> Cluster {
    let mut c = Cluster::with(n, policy);
    c.now = now;
    c.calendar = Some((period, zone));
    for i in 0..n {
        let mut config = config(i, n, now, policy);
        config.set_calendar(0, period, zone).unwrap();
        c.nodes[i] = Some(Node::new(config, now).unwrap());
    }
    c.run_ms(100);
    c
}

fn month() -> Policy {
    Policy::global_fixed_window(L, Duration::from_secs(31 * 86_400)).unwrap()
}

/// Admit `L` requests of `key` spread over the nodes, then deny one: return the denial.
fn use_up(c: &mut Cluster, key: u64) -> Decision {
    for r in 0..L {
        let d = decision(c, (r as usize) % c.n, key);
        assert!(d.is_allowed(), "request {r} under the limit at {}", c.now);
        c.run_ms(1);
    }
    let denied = decision(c, 0, key);
    assert!(!denied.is_allowed(), "one more than the limit at {}", c.now);
    denied
}

/// `got` is `want` within a second (the decision's own trip to the owner and rounding).
fn near(got: u64, want: u64, what: &str) {
    assert!(
        got.abs_diff(want) <= S,
        "{what}: {got} ns, expected about {want} ns"
    );
}

/// Run the cluster to `at` (its links and timers every 10 ms of it).
fn run_to(c: &mut Cluster, at: u64) {
    while c.now < at {
        c.run_ms(10);
    }
}

/// The period ending at `end` refuses more than its limit and says when it ends; the next
/// one, ending at `next_end`, grants a whole limit again and says when it ends.
fn edge(c: &mut Cluster, key: u64, end: u64, next_end: u64) {
    let denied = use_up(c, key);
    near(denied.retry_after_ns, end - c.now, "retry before the end");
    near(denied.reset_after_ns, end - c.now, "reset before the end");
    // A second before the end: still the old period, on every node.
    run_to(c, end - S);
    for i in 0..c.n {
        assert!(!decision(c, i, key).is_allowed(), "node {i} before the end");
    }
    run_to(c, end + 200 * MS);
    let denied = use_up(c, key);
    near(
        denied.retry_after_ns,
        next_end - c.now,
        "retry in the next period",
    );
}

#[test]
fn a_month_in_paris_ends_at_the_last_midnight_of_a_leap_february_then_of_summer_time() {
    let mut c = calendar_cluster(
        3,
        month(),
        "month",
        "Europe/Paris",
        MARCH_2028_PARIS - 60 * S,
    );
    let key = c.key_owned_by(1);
    edge(&mut c, key, MARCH_2028_PARIS, APRIL_2028_PARIS);
    assert_eq!(c.total_admitted(), 2 * L);
}

#[test]
fn a_day_of_twenty_three_hours_is_one_window() {
    let day = Policy::global_fixed_window(L, Duration::from_secs(86_400)).unwrap();
    let mut c = calendar_cluster(3, day, "day", "Europe/Paris", MARCH_27_2028_PARIS - 60 * S);
    let key = c.key_owned_by(2);
    edge(&mut c, key, MARCH_27_2028_PARIS, MARCH_28_2028_PARIS);
}

#[test]
fn a_year_ends_at_new_year() {
    let year = Policy::global_fixed_window(L, Duration::from_secs(366 * 86_400)).unwrap();
    let mut c = calendar_cluster(3, year, "year", "UTC", YEAR_2029 - 60 * S);
    let key = c.key_owned_by(0);
    edge(&mut c, key, YEAR_2029, YEAR_2030);
}

#[test]
fn the_owner_crashing_in_the_period_hands_the_key_on_with_its_calendar() {
    let mut c = calendar_cluster(
        3,
        month(),
        "month",
        "Europe/Paris",
        MARCH_2028_PARIS - 30 * S,
    );
    let key = c.key_owned_by(1);
    use_up(&mut c, key);
    // Its successor's backup carries the count: the period's limit is spent there too.
    c.crash(1);
    c.run_ms(1_000);
    for i in [0, 2] {
        let d = decision(&mut c, i, key);
        assert!(!d.is_allowed(), "node {i} after the owner crashed");
        near(
            d.retry_after_ns,
            MARCH_2028_PARIS - c.now,
            "retry after the crash",
        );
    }
    // The new owner rolls to the next period where the calendar puts it.
    run_to(&mut c, MARCH_2028_PARIS + 200 * MS);
    for r in 0..L {
        assert!(
            decision(&mut c, [0, 2][r as usize % 2], key).is_allowed(),
            "request {r}"
        );
        c.run_ms(1);
    }
    let d = decision(&mut c, 2, key);
    assert!(!d.is_allowed());
    near(d.reset_after_ns, APRIL_2028_PARIS - c.now, "reset in April");
}

#[test]
fn a_sliding_window_weighs_the_month_before() {
    let sliding = Policy::global_sliding_window(L, Duration::from_secs(31 * 86_400)).unwrap();
    let mut c = calendar_cluster(3, sliding, "month", "UTC", YEAR_2029 - 30 * S);
    let key = c.key_owned_by(1);
    use_up(&mut c, key);
    // A moment into January, December's count weighs almost all of it: denied, and room
    // comes as December fades over January's 31 days.
    run_to(&mut c, YEAR_2029 + 200 * MS);
    let d = decision(&mut c, 0, key);
    assert!(!d.is_allowed(), "December still counts");
    // One token in 20 is free once a twentieth of January is gone.
    let january = 31 * 86_400 * S;
    near(
        d.retry_after_ns,
        january / L - (c.now - YEAR_2029),
        "retry as December fades",
    );
}
