//! The `ratemesh` command: the node daemon, the cluster demo, the simulator, certificates,
//! and a local tour of the algorithms.

#[path = "cli/cluster.rs"]
mod cluster;
#[path = "cli/demo.rs"]
mod demo;
#[path = "cli/plot.rs"]
mod plot;
#[path = "cli/simulate.rs"]
mod simulate;

use std::time::Duration;

use clap::{Parser, Subcommand};
use ratemesh::{Limiter, ManualClock, Policy, PolicyError, Verdict};

#[derive(Parser)]
#[command(
    name = "ratemesh",
    version,
    about = "A rate limiter for API gateways that needs no central store"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a cluster of nodes on loopback, drive load through it, kill and restart a node,
    /// and show that the cluster holds one global limit (with an SVG plot).
    Demo(demo::DemoArgs),
    /// Send one burst and then a steady stream through each algorithm and show what each admits.
    Algorithms {
        /// Requests per second the policies allow (tokens per second, or limit per 1 s window).
        #[arg(long, default_value_t = 10)]
        rate: u64,
        /// Requests sent at once at t = 0.
        #[arg(long, default_value_t = 25)]
        burst: u64,
        /// Requests per second sent steadily after the burst, for 2 s.
        #[arg(long, default_value_t = 20)]
        steady: u64,
    },
    /// Run one gateway node: the mesh over QUIC and the HTTP gateway (`/metrics`, `/health`).
    Node {
        /// The node file (see `cluster/node-1.toml`).
        #[arg(long)]
        config: std::path::PathBuf,
    },
    /// Simulate a cluster and print the overshoot, utilization and gossip cost to expect.
    Simulate(Box<simulate::SimulateArgs>),
    /// Generate a cluster CA and one certificate per node (for mutual TLS between nodes).
    Certs {
        /// The directory to write `ca.pem`, `ca.key`, `node-<id>.pem` and `node-<id>.key` to.
        #[arg(long)]
        out: std::path::PathBuf,
        /// How many nodes (ids 1..=N).
        #[arg(long, default_value_t = 3)]
        nodes: u64,
        /// Sign a certificate for node ID with the CA already in `--out` (`ca.pem`, `ca.key`)
        /// instead of making a new CA; repeat for several. For a node that joins a running
        /// cluster.
        #[arg(long = "add-node", value_name = "ID")]
        add_node: Vec<u64>,
        /// The cluster's name (in the CA's common name).
        #[arg(long, default_value = "ratemesh")]
        cluster: String,
    },
}

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

fn algorithms(rate: u64, burst: u64, steady: u64) -> Result<(), Box<dyn std::error::Error>> {
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

fn certs(
    out: &std::path::Path,
    nodes: u64,
    add: &[u64],
    cluster: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    if !add.is_empty() {
        if add.contains(&0) {
            return Err("--add-node: node ids start at 1".into());
        }
        for path in ratemesh::net::certs::add_nodes(out, cluster, add)? {
            println!("wrote {}", path.display());
        }
        return Ok(());
    }
    if nodes == 0 || nodes > 1024 {
        return Err("--nodes: between 1 and 1024".into());
    }
    let certs = ratemesh::net::certs::generate(cluster, nodes)?;
    for path in ratemesh::net::certs::write(out, &certs)? {
        println!("wrote {}", path.display());
    }
    println!("keep ca.key offline: it signs new nodes");
    Ok(())
}

fn node(config: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    use std::io::Write;
    use tracing::Instrument;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let file = ratemesh::daemon::config::NodeFile::from_file(config)?;
    let runtime = tokio::runtime::Runtime::new()?;
    let span = tracing::info_span!("node", id = file.id);
    runtime.block_on(
        async move {
            let running = ratemesh::daemon::start(&file).await?;
            // One line on stdout that scripts (and `ratemesh demo`) wait for.
            let mut stdout = std::io::stdout();
            let _ = writeln!(
                stdout,
                "ratemesh node {} ready: http={} quic={}",
                file.id,
                running.http_addr(),
                running.quic_addr()
            );
            let _ = stdout.flush();
            tracing::info!(http = %running.http_addr(), quic = %running.quic_addr(), "listening");
            running.serve().await;
            Ok::<(), Box<dyn std::error::Error>>(())
        }
        .instrument(span),
    )
}

/// Let a printing command end quietly when its reader goes away (`… | head`), as Unix tools
/// do, instead of failing on the next write. Only for commands that open no sockets.
fn quiet_on_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: restores the default disposition of SIGPIPE before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(&args),
        Command::Algorithms {
            rate,
            burst,
            steady,
        } => algorithms(rate, burst, steady),
        Command::Node { config } => node(&config),
        Command::Simulate(args) => {
            quiet_on_closed_pipe();
            simulate::run(&args)
        }
        Command::Certs {
            out,
            nodes,
            add_node,
            cluster,
        } => certs(&out, nodes, &add_node, &cluster),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("ratemesh: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
