//! `ratemesh demo`: a real cluster on loopback holding one global limit.
//!
//! It starts `--nodes` `ratemesh node` processes (mutual-TLS QUIC between them), drives HTTP
//! load at three times the limit through their gateway ports (most of it on one node, then
//! on another, then spread), kills one node, restarts it, starts one more node that joins the
//! running cluster through a seed, makes node 1 leave for good, and reports phase by phase
//! what the cluster admitted against the limit, next to what `local_only` nodes (each
//! enforcing the limit alone) would have admitted for the same offered load.
//!
//! Admissions are counted at the client, by the middle of each request's round trip, in the
//! policy's aligned one-second windows.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use clap::Args;
use http_body_util::Empty;
use serde::Serialize;

use super::cluster::{LocalCluster, http_client};

const API_KEY: &str = "demo-tenant";
const TICK: Duration = Duration::from_millis(2);
const MAX_IN_FLIGHT: usize = 512;
/// Skewed, moving, a node killed, restarted, a node joins, one leaves.
const PHASES: u64 = 6;

/// `ratemesh demo` options.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Nodes to start (3 to 9).
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Length of the load, in seconds (six phases of a sixth each, at least 2 s).
    #[arg(long, default_value_t = 24)]
    duration_s: u64,
    /// The global limit: requests per 1 s window, cluster-wide.
    #[arg(long, default_value_t = 500)]
    limit: u64,
    /// Requests per second offered to the whole cluster (default: 3 × the limit).
    #[arg(long)]
    rate: Option<u64>,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Where to write the SVG plot.
    #[arg(long, default_value = "ratemesh-demo.svg")]
    plot: PathBuf,
}

/// One request's fate.
#[derive(Clone, Copy)]
struct Sample {
    node: usize,
    /// Unix ns when the request was sent.
    sent_ns: u64,
    /// Unix ns when the response arrived.
    done_ns: u64,
    outcome: Outcome,
}

impl Sample {
    /// Unix ns where the decision is counted: when the response arrived. A request may wait
    /// for its key's owner, so its decision lies near the end of the round trip; the answer
    /// takes well under a millisecond on loopback.
    fn decided_ns(&self) -> u64 {
        self.done_ns
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Admitted,
    Limited,
    Failed,
}

/// A node's fate during a phase, run beside the phase's load.
type SideFuture<'a> = Pin<Box<dyn Future<Output = Result<Side, Box<dyn std::error::Error>>> + 'a>>;

/// How long the nodes took to do what the phases asked of them.
struct Timings {
    restart_ready_ms: Option<u64>,
    join_ready_ms: Option<u64>,
    leave_ms: Option<u64>,
}

/// What befell a node during a phase.
enum Side {
    /// The killed node was started again: how long until it admitted.
    Restarted(Option<Duration>),
    /// The joiner was started: how long until it admitted.
    Joined(Option<Duration>),
    /// Node 1 was sent SIGTERM: how long until it exited, and whether cleanly.
    Left(Option<(Duration, bool)>),
}

/// What happens in one phase.
struct PhasePlan {
    name: String,
    /// Node weights of the offered load over the phase (by fraction of the phase).
    weights: Box<dyn Fn(f64) -> Vec<f64> + Send>,
}

/// One phase's figures.
#[derive(Serialize, Debug)]
struct PhaseReport {
    name: String,
    start_s: u64,
    end_s: u64,
    offered_per_s: f64,
    admitted_per_s_by_node: Vec<f64>,
    admitted_per_s: f64,
    limited: u64,
    failed: u64,
    /// The most admitted cluster-wide in one window of the phase (by response arrival).
    worst_window: u64,
    /// The most admitted in one window of the phase whose round trip lay wholly inside it.
    worst_window_certain: u64,
    overshoot: f64,
    /// What nodes each enforcing the limit alone would have admitted in the worst window.
    local_only_worst_window: u64,
    local_only_overshoot: f64,
}

#[derive(Serialize, Debug)]
struct Report {
    nodes: usize,
    limit: u64,
    window_s: u64,
    offered_per_s: u64,
    phases: Vec<PhaseReport>,
    worst_window: u64,
    worst_window_certain: u64,
    overshoot: f64,
    local_only_overshoot: f64,
    /// How long the killed node took to admit again after it was started.
    restart_ready_ms: Option<u64>,
    /// How long the joining node took to admit after it was started.
    join_ready_ms: Option<u64>,
    /// How long node 1 took to drain and exit after SIGTERM.
    leave_ms: Option<u64>,
    plot: String,
    /// Per second: admitted per node, and what `local_only` would have admitted.
    per_second: Vec<SecondReport>,
}

#[derive(Serialize, Debug)]
struct SecondReport {
    t_s: u64,
    admitted_by_node: Vec<u64>,
    admitted: u64,
    local_only: u64,
}

fn policies(limit: u64) -> String {
    format!(
        "env = \"demo\"\nkey_secret = \"demo-cluster-secret\"\ndefault_tier = \"api\"\n\n\
         [policies.global]\nalgorithm = \"fixed-window\"\nlimit = {limit}\nwindow = \"1s\"\n\
         backend = \"mesh\"\n\n[tiers.api]\npolicies = [\"global\"]\n"
    )
}

fn hot(nodes: usize, hot: usize, share: f64) -> Vec<f64> {
    let rest = (1.0 - share) / (nodes - 1) as f64;
    (0..nodes)
        .map(|i| if i == hot { share } else { rest })
        .collect()
}

/// The plans of the phases for `nodes` members and one joiner (weights by process: the
/// members, then the joiner).
fn phases(nodes: usize) -> Vec<PhasePlan> {
    let last = nodes - 1;
    let total = nodes + 1;
    // The members' weights with the joiner's (0) after them.
    let members = move |w: Vec<f64>| w.into_iter().chain([0.0]).collect::<Vec<f64>>();
    vec![
        PhasePlan {
            name: "skewed: 80% on node 1".into(),
            weights: Box::new(move |_| members(hot(nodes, 0, 0.8))),
        },
        PhasePlan {
            name: format!("moving: 80% on node 2 → node {nodes}"),
            weights: Box::new(move |f| {
                let hot_node = 1 + ((f * (nodes - 1) as f64) as usize).min(nodes - 2);
                members(hot(nodes, hot_node, 0.8))
            }),
        },
        PhasePlan {
            name: format!("node {nodes} killed"),
            weights: Box::new(move |_| {
                members(
                    (0..nodes)
                        .map(|i| if i == last { 0.0 } else { 1.0 / last as f64 })
                        .collect(),
                )
            }),
        },
        PhasePlan {
            name: format!("node {nodes} restarted"),
            weights: Box::new(move |_| members(vec![1.0 / nodes as f64; nodes])),
        },
        PhasePlan {
            name: format!("node {total} joins (seed: node 1)"),
            weights: Box::new(move |_| vec![1.0 / total as f64; total]),
        },
        PhasePlan {
            name: "node 1 leaves for good".into(),
            weights: Box::new(move |_| {
                (0..total)
                    .map(|i| if i == 0 { 0.0 } else { 1.0 / nodes as f64 })
                    .collect()
            }),
        },
    ]
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Run the demo.
pub fn run(args: &DemoArgs) -> Result<(), Box<dyn std::error::Error>> {
    if !(3..=9).contains(&args.nodes) {
        return Err(
            "--nodes: between 3 and 9 (one node is killed; the rest must be a majority)".into(),
        );
    }
    if args.duration_s < 2 * PHASES {
        return Err(format!(
            "--duration-s: at least {} (six phases of at least 2 s)",
            2 * PHASES
        )
        .into());
    }
    if args.limit == 0 || args.limit > ratemesh::policy::MAX_GLOBAL_WINDOW_LIMIT {
        return Err(format!(
            "--limit: between 1 and {}",
            ratemesh::policy::MAX_GLOBAL_WINDOW_LIMIT
        )
        .into());
    }
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        tokio::select! {
            result = demo(args) => result,
            _ = tokio::signal::ctrl_c() => Err("interrupted; every node process was stopped".into()),
        }
    })
}

async fn demo(args: &DemoArgs) -> Result<(), Box<dyn std::error::Error>> {
    let mut cluster = LocalCluster::prepare(args.nodes, 1, &policies(args.limit))?;
    let result = drive(args, &mut cluster).await;
    if result.is_err() {
        // Keep the node logs that the error points to.
        eprintln!(
            "kept the files and node logs in {}",
            cluster.keep_files().display()
        );
    }
    result
}

async fn drive(
    args: &DemoArgs,
    cluster: &mut LocalCluster,
) -> Result<(), Box<dyn std::error::Error>> {
    let nodes = args.nodes;
    let rate = args.rate.unwrap_or(3 * args.limit);
    let phase_s = (args.duration_s / PHASES).max(2);
    let total = nodes + 1;
    let say = |text: String| {
        if !args.json {
            println!("{text}");
        }
    };
    say(format!(
        "ratemesh demo: {nodes} nodes on loopback (QUIC with mutual TLS between them), one \
         global limit of {} requests per 1 s window for one API key, enforced by all of them \
         together; offered load {rate} req/s.\nfiles and node logs: {}",
        args.limit,
        cluster.dir().display()
    ));
    // The last node joins later, through its seed.
    for i in 0..nodes {
        cluster.start(i).await?;
    }
    for i in 0..nodes {
        if cluster
            .wait_healthy(i, Duration::from_secs(10))
            .await
            .is_none()
        {
            return Err(format!("node {} never became healthy", i + 1).into());
        }
    }
    say(format!(
        "all {nodes} nodes admitting; load for {} s in six phases…",
        PHASES * phase_s
    ));

    // Start on a window boundary so every window lies in one phase.
    let now = unix_ns();
    let start_ns = (now / 1_000_000_000 + 2) * 1_000_000_000;
    tokio::time::sleep(Duration::from_nanos(start_ns - now)).await;

    let samples: Arc<Mutex<Vec<Sample>>> = Arc::new(Mutex::new(Vec::new()));
    let offered: Arc<Mutex<Vec<(usize, u64)>>> = Arc::new(Mutex::new(Vec::new()));
    let plans = phases(nodes);
    // The load generator's client: keep-alive, room for every request in flight.
    let client = http_client(MAX_IN_FLIGHT);
    let uris: Vec<http::Uri> = cluster
        .nodes
        .iter()
        .map(|n| format!("http://{}/api/orders", n.http).parse())
        .collect::<Result<_, _>>()?;
    let in_flight = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let mut restart_ready_ms = None;
    let mut join_ready_ms = None;
    let mut leave_ms = None;
    // The joiner takes load once it admits.
    let joiner_up = std::sync::atomic::AtomicBool::new(false);
    let mut skipped = 0u64;
    for (p, plan) in plans.iter().enumerate() {
        let phase_start = start_ns + p as u64 * phase_s * 1_000_000_000;
        let phase_end = phase_start + phase_s * 1_000_000_000;
        let killed = nodes - 1;
        if p == 2 {
            cluster.kill(killed).await;
            say(format!(
                "  node {nodes} killed (SIGKILL); once the others declare it dead (10 gossip rounds), \
                 the successor of each key it owned carries on from its backup; only what it had \
                 leased and not spent is lost until the window ends"
            ));
        }
        // What happens to a node while the phase's load runs.
        let cluster_ref = &mut *cluster;
        let joiner_up = &joiner_up;
        let side: Option<SideFuture<'_>> = match p {
            // Restart while the load runs; time it from the spawn to the first 200 on
            // /health.
            3 => Some(Box::pin(async move {
                let started = Instant::now();
                cluster_ref.start(killed).await?;
                let ready = cluster_ref
                    .wait_healthy(killed, Duration::from_secs(phase_s))
                    .await
                    .map(|_| started.elapsed());
                Ok(Side::Restarted(ready))
            })),
            // A node no member lists joins through its seed; it takes load once it admits.
            4 => Some(Box::pin(async move {
                let started = Instant::now();
                cluster_ref.start(total - 1).await?;
                let ready = cluster_ref
                    .wait_healthy(total - 1, Duration::from_secs(phase_s))
                    .await
                    .map(|_| started.elapsed());
                joiner_up.store(ready.is_some(), std::sync::atomic::Ordering::Relaxed);
                Ok(Side::Joined(ready))
            })),
            // Node 1 drains and leaves for good.
            5 => Some(Box::pin(async move {
                Ok(Side::Left(
                    cluster_ref.leave(0, Duration::from_secs(phase_s + 5)).await,
                ))
            })),
            _ => None,
        };
        let mut credit = vec![0.0f64; total];
        let mut ticker = tokio::time::interval(TICK);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = unix_ns().max(phase_start);
        let load = async {
            loop {
                ticker.tick().await;
                let now = unix_ns();
                if now >= phase_end {
                    break;
                }
                let fraction =
                    (now.saturating_sub(phase_start)) as f64 / (phase_end - phase_start) as f64;
                let weights = (plan.weights)(fraction);
                let dt = (now - last) as f64 / 1e9;
                last = now;
                for (node, weight) in weights.iter().enumerate() {
                    if node == total - 1 && !joiner_up.load(std::sync::atomic::Ordering::Relaxed) {
                        continue;
                    }
                    credit[node] += rate as f64 * weight * dt;
                    while credit[node] >= 1.0 {
                        credit[node] -= 1.0;
                        let Ok(permit) = Arc::clone(&in_flight).try_acquire_owned() else {
                            skipped += 1;
                            continue;
                        };
                        offered.lock().expect("offered").push((node, now));
                        let client = client.clone();
                        let uri = uris[node].clone();
                        let samples = Arc::clone(&samples);
                        tokio::spawn(async move {
                            let sent = unix_ns();
                            let request = http::Request::get(uri)
                                .header("x-api-key", API_KEY)
                                .body(Empty::<Bytes>::new())
                                .expect("a valid request");
                            let result = tokio::time::timeout(
                                Duration::from_secs(2),
                                client.request(request),
                            )
                            .await;
                            let done = unix_ns();
                            let outcome = match result {
                                Ok(Ok(response)) if response.status() == http::StatusCode::OK => {
                                    Outcome::Admitted
                                }
                                Ok(Ok(response))
                                    if response.status() == http::StatusCode::TOO_MANY_REQUESTS =>
                                {
                                    Outcome::Limited
                                }
                                _ => Outcome::Failed,
                            };
                            samples.lock().expect("samples").push(Sample {
                                node,
                                sent_ns: sent,
                                done_ns: done,
                                outcome,
                            });
                            drop(permit);
                        });
                    }
                }
            }
        };
        match side {
            Some(side) => {
                let (side, ()) = tokio::join!(side, load);
                let text = match side? {
                    Side::Restarted(ready) => {
                        restart_ready_ms = ready.map(|d| d.as_millis() as u64);
                        match restart_ready_ms {
                            Some(ms) => format!(
                                "  node {nodes} restarted: recovered its counts from the others and admits again {ms} ms after it was started"
                            ),
                            None => format!(
                                "  node {nodes} restarted but did not recover within the phase"
                            ),
                        }
                    }
                    Side::Joined(ready) => {
                        join_ready_ms = ready.map(|d| d.as_millis() as u64);
                        match join_ready_ms {
                            Some(ms) => format!(
                                "  node {total} (listed by no member) joined the running cluster through its seed, node 1, and admits {ms} ms after it was started"
                            ),
                            None => format!("  node {total} did not join within the phase"),
                        }
                    }
                    Side::Left(left) => {
                        leave_ms = left.map(|(d, _)| d.as_millis() as u64);
                        match left {
                            Some((d, clean)) => format!(
                                "  node 1 left for good (SIGTERM): it handed its keys to their next owners, told the others, and exited {} after {} ms",
                                if clean { "cleanly" } else { "with an error" },
                                d.as_millis()
                            ),
                            None => "  node 1 did not exit after SIGTERM; it was killed".into(),
                        }
                    }
                };
                say(text);
            }
            None => load.await,
        }
    }
    // Let the last requests finish.
    let _ = tokio::time::timeout(
        Duration::from_secs(3),
        in_flight.acquire_many(MAX_IN_FLIGHT as u32),
    )
    .await;
    cluster.stop().await;

    let samples = samples.lock().expect("samples").clone();
    let offered = offered.lock().expect("offered").clone();
    let timings = Timings {
        restart_ready_ms,
        join_ready_ms,
        leave_ms,
    };
    let report = measure(
        args, total, rate, start_ns, phase_s, &plans, &samples, &offered, timings,
    );
    let seconds = PHASES * phase_s;
    super::plot::write_svg(
        &args.plot,
        &super::plot::Series {
            seconds,
            limit: args.limit,
            nodes: total,
            admitted: per_second(&samples, start_ns, seconds, total, Outcome::Admitted),
            local_only: local_only_per_second(&offered, start_ns, seconds, total, args.limit),
            phases: plans.iter().map(|p| p.name.clone()).collect(),
        },
    )?;
    if skipped > 0 {
        say(format!(
            "note: {skipped} requests were not sent (more than {MAX_IN_FLIGHT} in flight)"
        ));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    let admitted: u64 = samples
        .iter()
        .filter(|s| s.outcome == Outcome::Admitted)
        .count() as u64;
    if admitted == 0 {
        return Err("the cluster admitted nothing; see the node logs".into());
    }
    Ok(())
}

/// Admitted (or other outcome) per node per second since `start_ns`.
fn per_second(
    samples: &[Sample],
    start_ns: u64,
    seconds: u64,
    nodes: usize,
    outcome: Outcome,
) -> Vec<Vec<u64>> {
    let mut out = vec![vec![0u64; nodes]; seconds as usize];
    for s in samples.iter().filter(|s| s.outcome == outcome) {
        let Some(second) = s
            .decided_ns()
            .checked_sub(start_ns)
            .map(|d| d / 1_000_000_000)
        else {
            continue;
        };
        if let Some(row) = out.get_mut(second as usize) {
            row[s.node] += 1;
        }
    }
    out
}

/// Admitted per second counting only round trips wholly inside the second (a decision
/// that is certainly in that window, whatever the client's timing).
fn certain_per_second(samples: &[Sample], start_ns: u64, seconds: u64) -> Vec<u64> {
    let mut out = vec![0u64; seconds as usize];
    for s in samples.iter().filter(|s| s.outcome == Outcome::Admitted) {
        let (Some(a), Some(b)) = (
            s.sent_ns.checked_sub(start_ns),
            s.done_ns.checked_sub(start_ns),
        ) else {
            continue;
        };
        if a / 1_000_000_000 == b / 1_000_000_000
            && let Some(count) = out.get_mut((a / 1_000_000_000) as usize)
        {
            *count += 1;
        }
    }
    out
}

/// What `local_only` nodes admit per second: each node at most the limit of what it was
/// offered.
fn local_only_per_second(
    offered: &[(usize, u64)],
    start_ns: u64,
    seconds: u64,
    nodes: usize,
    limit: u64,
) -> Vec<u64> {
    let mut per_node = vec![vec![0u64; nodes]; seconds as usize];
    for &(node, at) in offered {
        let second = (at.saturating_sub(start_ns) / 1_000_000_000) as usize;
        if let Some(row) = per_node.get_mut(second) {
            row[node] += 1;
        }
    }
    per_node
        .iter()
        .map(|row| row.iter().map(|&n| n.min(limit)).sum())
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn measure(
    args: &DemoArgs,
    nodes: usize,
    rate: u64,
    start_ns: u64,
    phase_s: u64,
    plans: &[PhasePlan],
    samples: &[Sample],
    offered: &[(usize, u64)],
    timings: Timings,
) -> Report {
    let seconds = PHASES * phase_s;
    let admitted = per_second(samples, start_ns, seconds, nodes, Outcome::Admitted);
    let limited = per_second(samples, start_ns, seconds, nodes, Outcome::Limited);
    let failed = per_second(samples, start_ns, seconds, nodes, Outcome::Failed);
    let local_only = local_only_per_second(offered, start_ns, seconds, nodes, args.limit);
    let certain = certain_per_second(samples, start_ns, seconds);
    let mut offered_per_second = BTreeMap::new();
    for &(_, at) in offered {
        *offered_per_second
            .entry(at.saturating_sub(start_ns) / 1_000_000_000)
            .or_insert(0u64) += 1;
    }
    let over = |count: u64| count.saturating_sub(args.limit) as f64 / args.limit as f64;
    let phases: Vec<PhaseReport> = plans
        .iter()
        .enumerate()
        .map(|(p, plan)| {
            let range = (p as u64 * phase_s) as usize..((p as u64 + 1) * phase_s) as usize;
            let secs = phase_s as f64;
            let by_node: Vec<f64> = (0..nodes)
                .map(|n| admitted[range.clone()].iter().map(|r| r[n]).sum::<u64>() as f64 / secs)
                .collect();
            let totals: Vec<u64> = admitted[range.clone()]
                .iter()
                .map(|r| r.iter().sum())
                .collect();
            let worst = totals.iter().copied().max().unwrap_or(0);
            let local_worst = local_only[range.clone()].iter().copied().max().unwrap_or(0);
            let sum = |rows: &[Vec<u64>]| rows.iter().flatten().sum::<u64>();
            PhaseReport {
                name: plan.name.clone(),
                start_s: range.start as u64,
                end_s: range.end as u64,
                offered_per_s: range
                    .clone()
                    .map(|s| offered_per_second.get(&(s as u64)).copied().unwrap_or(0))
                    .sum::<u64>() as f64
                    / secs,
                admitted_per_s: by_node.iter().sum(),
                admitted_per_s_by_node: by_node,
                limited: sum(&limited[range.clone()]),
                failed: sum(&failed[range.clone()]),
                worst_window: worst,
                worst_window_certain: certain[range.clone()].iter().copied().max().unwrap_or(0),
                overshoot: over(worst),
                local_only_worst_window: local_worst,
                local_only_overshoot: over(local_worst),
            }
        })
        .collect();
    let worst_window = phases.iter().map(|p| p.worst_window).max().unwrap_or(0);
    let worst_window_certain = phases
        .iter()
        .map(|p| p.worst_window_certain)
        .max()
        .unwrap_or(0);
    let local_worst = phases
        .iter()
        .map(|p| p.local_only_worst_window)
        .max()
        .unwrap_or(0);
    Report {
        nodes,
        limit: args.limit,
        window_s: 1,
        offered_per_s: rate,
        phases,
        worst_window,
        worst_window_certain,
        overshoot: over(worst_window),
        local_only_overshoot: over(local_worst),
        restart_ready_ms: timings.restart_ready_ms,
        join_ready_ms: timings.join_ready_ms,
        leave_ms: timings.leave_ms,
        plot: args.plot.display().to_string(),
        per_second: admitted
            .iter()
            .enumerate()
            .map(|(t, row)| SecondReport {
                t_s: t as u64,
                admitted_by_node: row.clone(),
                admitted: row.iter().sum(),
                local_only: local_only[t],
            })
            .collect(),
    }
}

fn print_table(report: &Report) {
    println!();
    let node_header: String = (1..=report.nodes)
        .map(|n| format!("{:>7}", format!("n{n}/s")))
        .collect();
    println!(
        "{:<30} {:>6} {:>9} {node_header} {:>9} {:>13} {:>10} {:>17}",
        "phase", "time", "offered/s", "total/s", "worst window", "overshoot", "local_only worst"
    );
    for p in &report.phases {
        let per_node: String = p
            .admitted_per_s_by_node
            .iter()
            .map(|a| format!("{a:>7.0}"))
            .collect();
        println!(
            "{:<30} {:>6} {:>9.0} {per_node} {:>9.0} {:>13} {:>9.1}% {:>17}",
            p.name,
            format!("{}-{}s", p.start_s, p.end_s),
            p.offered_per_s,
            p.admitted_per_s,
            format!("{}/{}", p.worst_window, report.limit),
            p.overshoot * 100.0,
            format!(
                "{} (+{:.0}%)",
                p.local_only_worst_window,
                p.local_only_overshoot * 100.0
            ),
        );
    }
    println!(
        "\nworst 1 s window cluster-wide: {} admitted against a limit of {} → overshoot {:.1}% \
         (local_only nodes, each enforcing the limit alone: {:.0}%).",
        report.worst_window,
        report.limit,
        report.overshoot * 100.0,
        report.local_only_overshoot * 100.0
    );
    println!(
        "admissions are counted at the client, in the window where the response arrived; \
         counting only round trips wholly inside one window, the worst window held {} \
         (the declared bound for this run, with no partition and one clock, is 0, plus, in a \
         window where a node restarts or joins, what that node admits alone before a member \
         answers it: at most its share of the limit, while_joining = \"local-share\").",
        report.worst_window_certain
    );
    println!("plot: {}", report.plot);
}
