//! The local limiter on a gateway's hot path: one `Limiter` shared by a few threads, each
//! deciding requests for 10,000 tenants (one of them far over its limit) as fast as it can,
//! for two seconds.
//!
//! ```sh
//! cargo run --release --example hot_loop                  # 2 s
//! cargo run --release --example hot_loop -- --seconds 5
//! ```
//!
//! Needs no feature: `ratemesh = { version = "0.1", default-features = false }`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ratemesh::{Decision, Limiter, Policy, Verdict};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seconds: u64 = match std::env::args().skip_while(|a| a != "--seconds").nth(1) {
        Some(s) => s.parse()?,
        None => 2,
    };

    // Every tenant: 1000 requests per second with bursts of 100, and 20,000 per minute.
    // A request passes only if both policies admit it; a denial by one charges neither.
    let limiter = Arc::new(
        Limiter::builder()
            .policy(Policy::token_bucket(1000, Duration::from_secs(1), 100)?)
            .policy(Policy::fixed_window(20_000, Duration::from_secs(60))?)
            .max_keys(100_000) // memory stays bounded whatever keys clients send
            .build::<String>()?,
    );
    let tenants: Arc<Vec<String>> = Arc::new((0..10_000).map(|i| format!("tenant-{i}")).collect());

    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let limiter = Arc::clone(&limiter);
            let tenants = Arc::clone(&tenants);
            std::thread::spawn(move || {
                let mut counts = Counts::default();
                let mut i = t;
                while Instant::now() < deadline {
                    for _ in 0..4096 {
                        // One request in four is tenant-0's; the rest spread over all of them.
                        let tenant = if i % 4 == 0 {
                            &tenants[0]
                        } else {
                            &tenants[i % tenants.len()]
                        };
                        // A `Limiter<String>` is checked with a `&str`: no allocation.
                        counts.add(&limiter.check(tenant.as_str(), 1));
                        i = i.wrapping_add(7);
                    }
                }
                counts
            })
        })
        .collect();
    let started = Instant::now();
    let mut total = Counts::default();
    for worker in workers {
        total.merge(&worker.join().expect("a worker panicked"));
    }
    let elapsed = started.elapsed().as_secs_f64();

    let decisions = total.allowed + total.denied;
    println!(
        "{threads} threads, {seconds} s: {decisions} decisions ({:.1} M/s, {:.0} ns per decision per thread)",
        decisions as f64 / elapsed / 1e6,
        elapsed * 1e9 * threads as f64 / decisions as f64,
    );
    println!(
        "allowed {}, denied {} (each tenant: at most 100 + 1000/s, and 20,000 a minute)",
        total.allowed, total.denied
    );

    // What a gateway puts in its 429 response, once tenant-0 has spent what refilled since.
    let d = (0..1000)
        .map(|_| limiter.check("tenant-0", 1))
        .find(|d| d.verdict == Verdict::Denied)
        .expect("a bucket of 100 is spent within 1000 requests");
    println!(
        "tenant-0 now: 429, Retry-After: {} s (exactly {} µs), denied by policy {}",
        d.retry_after_ns.div_ceil(1_000_000_000),
        d.retry_after_ns / 1000,
        d.policy_index,
    );
    let d = limiter.check("tenant-9999", 1);
    println!(
        "tenant-9999 now: {:?}, {} of {} left",
        d.verdict, d.remaining, d.limit
    );
    Ok(())
}

#[derive(Default)]
struct Counts {
    allowed: u64,
    denied: u64,
}

impl Counts {
    fn add(&mut self, d: &Decision) {
        match d.verdict {
            Verdict::Allowed => self.allowed += 1,
            Verdict::Denied | Verdict::CannotFit => self.denied += 1,
        }
    }

    fn merge(&mut self, other: &Counts) {
        self.allowed += other.allowed;
        self.denied += other.denied;
    }
}
