use ratemesh::Policy;
use ratemesh::sim::{self, Crash, SimConfig, Traffic};
use std::time::Duration;
fn main() {
    for window_ms in (200u64..=1000).step_by(7) {
        let rate = (28 * 1000u64).div_ceil(window_ms);
        let p = Policy::token_bucket(rate, Duration::from_secs(1), 28).unwrap();
        let mut c = SimConfig::new(p);
        c.nodes = 3;
        c.gossip_interval_ns = 32_000_000;
        c.latency_ns = 0;
        c.traffic = Traffic::Uniform;
        c.demand = 3.8717;
        c.duration_ns = 3_000_000_000;
        c.seed = 3394853597105523948;
        c.crashes.push(Crash {
            node: 0,
            at_ns: 200_000_000,
            restart_ns: 801_325_041,
        });
        let r = sim::run(&c);
        if r.policy_overshoot > 0.0 {
            println!(
                "window {window_ms} rate {rate}: pol {:.4} util {:.3}",
                r.policy_overshoot, r.utilization
            );
        }
    }
}
