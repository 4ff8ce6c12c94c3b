//! The exact backend's throughput and latency against redis-benchmark, side by side.
//!
//! `cargo bench --bench redis` starts its own redis-server on a unix socket, then measures:
//! redis-benchmark running the token-bucket script by EVALSHA with pipelining 16 (the
//! ceiling: no client logic at all), and ratemesh's `RedisLimiter::check` from 1 and from 64
//! concurrent tasks over one multiplexed connection. The two are measured in alternating
//! rounds (5, or `RATEMESH_BENCH_ROUNDS`) and compared round by round, with the CPU time
//! that redis-server and this process spend per decision. Needs redis-server and
//! redis-benchmark.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratemesh::Policy;
use ratemesh::backend::redis::{RedisConnection, RedisLimiter};

const DECISIONS: usize = 200_000;
/// Alternating rounds of redis-benchmark and ratemesh at 64 tasks (`RATEMESH_BENCH_ROUNDS`
/// overrides).
const ROUNDS: usize = 5;

struct Server(Child, std::path::PathBuf);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

/// Return the CPU time (user + system, µs) a process has used so far, from `/proc`.
fn cpu_us(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which is in parentheses): utime is the 12th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let ticks: f64 = fields.get(11..13).map_or(0.0, |t| {
        t.iter().filter_map(|v| v.parse::<f64>().ok()).sum()
    });
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks * 1e6 / per_second
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p) as usize] as f64 / 1000.0
}

async fn ratemesh_run(redis: Arc<RedisLimiter>, tasks: usize) -> (f64, f64, f64) {
    let per_task = DECISIONS / tasks;
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let redis = Arc::clone(&redis);
            tokio::spawn(async move {
                let key = format!("rl:{{bench-{t}}}:k");
                let mut latencies = Vec::with_capacity(per_task);
                for _ in 0..per_task {
                    let begin = Instant::now();
                    redis.check(&key, 1).await.expect("redis answers");
                    latencies.push(begin.elapsed().as_nanos() as u64);
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::with_capacity(DECISIONS);
    for handle in handles {
        all.extend(handle.await.expect("task"));
    }
    let elapsed = start.elapsed();
    all.sort_unstable();
    (
        all.len() as f64 / elapsed.as_secs_f64(),
        percentile(&all, 0.5),
        percentile(&all, 0.99),
    )
}

fn main() {
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with("--") && !"redis".contains(a.as_str()))
    {
        return;
    }
    let available = |tool: &str| Command::new(tool).arg("--version").output().is_ok();
    if !available("redis-server") || !available("redis-benchmark") {
        println!(
            "redis bench skipped: redis-server and redis-benchmark (Debian: redis-server, redis-tools) are needed"
        );
        return;
    }
    let dir = std::env::temp_dir().join(format!("ratemesh-redis-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let socket = dir.join("redis.sock");
    let child = Command::new("redis-server")
        .args(["--port", "0", "--unixsocket"])
        .arg(&socket)
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server starts");
    let server_pid = child.id().to_string();
    let _server = Server(child, dir.clone());
    while !socket.exists() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // 1e6 tokens per second, burst 1e6: every decision is admitted and writes.
    let policy =
        Policy::token_bucket(1_000_000, Duration::from_secs(1), 1_000_000).expect("policy");
    let url = format!("redis+unix://{}", socket.display());
    let _entered = runtime.enter();
    let connection = RedisConnection::single(&url, Duration::from_secs(2)).expect("client");
    let redis = Arc::new(RedisLimiter::new(connection, policy).expect("script"));
    runtime
        .block_on(redis.check("rl:{warm}:k", 1))
        .expect("loads the script");

    let (interval_us, capacity) = redis.script_params();
    let sha = redis.script_sha().to_string();
    let redis_benchmark = || -> f64 {
        let output = Command::new("redis-benchmark")
            .arg("-s")
            .arg(&socket)
            .args([
                "-n",
                &DECISIONS.to_string(),
                "-P",
                "16",
                "-c",
                "50",
                "-q",
                "EVALSHA",
                &sha,
                "1",
                "rl:{bench}:rb",
                "",
            ])
            .args([
                interval_us.to_string(),
                capacity.to_string(),
                "1".to_string(),
            ])
            .output()
            .expect("redis-benchmark runs");
        let text = String::from_utf8_lossy(&output.stdout);
        text.split_whitespace()
            .zip(text.split_whitespace().skip(1))
            .find(|(_, next)| *next == "requests")
            .and_then(|(n, _)| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected redis-benchmark output: {text}"))
    };

    // The VM's speed drifts by tens of percent within a minute, so the two are measured in
    // alternating rounds and compared round by round.
    let one = runtime.block_on(ratemesh_run(Arc::clone(&redis), 1));
    let mut rounds = Vec::new();
    // CPU µs per decision: redis-server under redis-benchmark, redis-server under ratemesh,
    // and ratemesh's own process (the client's cost).
    let mut cpu = Vec::new();
    let per_decision = |before: f64, after: f64| (after - before) / DECISIONS as f64;
    let rounds_wanted = std::env::var("RATEMESH_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(ROUNDS)
        .max(1);
    for _ in 0..rounds_wanted {
        let server_before = cpu_us(&server_pid);
        let baseline = redis_benchmark();
        let (server_between, self_between) = (cpu_us(&server_pid), cpu_us("self"));
        let many = runtime.block_on(ratemesh_run(Arc::clone(&redis), 64));
        let (server_after, self_after) = (cpu_us(&server_pid), cpu_us("self"));
        rounds.push((baseline, many));
        cpu.push((
            per_decision(server_before, server_between),
            per_decision(server_between, server_after),
            per_decision(self_between, self_after),
        ));
    }
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    println!(
        "redis/token_bucket: decisions per second, latency p50 / p99 in µs ({rounds_wanted} alternating rounds, medians)"
    );
    println!(
        "  redis-benchmark EVALSHA, pipelining 16, 50 clients: {:>9.0}/s",
        median(rounds.iter().map(|r| r.0).collect())
    );
    println!(
        "  ratemesh, 1 task:    {:>9.0}/s   p50 {:>7.1}   p99 {:>7.1}",
        one.0, one.1, one.2
    );
    println!(
        "  ratemesh, 64 tasks:  {:>9.0}/s   p50 {:>7.1}   p99 {:>7.1}",
        median(rounds.iter().map(|r| r.1.0).collect()),
        median(rounds.iter().map(|r| r.1.1).collect()),
        median(rounds.iter().map(|r| r.1.2).collect()),
    );
    println!(
        "  CPU µs per decision: redis-server {:.1} under redis-benchmark, {:.1} under ratemesh; ratemesh's process {:.1}",
        median(cpu.iter().map(|c| c.0).collect()),
        median(cpu.iter().map(|c| c.1).collect()),
        median(cpu.iter().map(|c| c.2).collect()),
    );
    let ratios: Vec<f64> = rounds.iter().map(|(b, m)| m.0 / b).collect();
    let shown: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
    println!(
        "  ratio (64 tasks / redis-benchmark), median of rounds: {:.2}  (rounds: {})",
        median(ratios.clone()),
        shown.join(" ")
    );
}
