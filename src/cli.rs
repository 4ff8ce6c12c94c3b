//! The `ratemesh` command: the node daemon, the cluster demo, the simulator, certificates,
//! and a local tour of the algorithms (`algorithms`).

mod algorithms;
mod cluster;
mod ctl;
mod demo;
mod plot;
mod simulate;

use clap::{Parser, Subcommand};

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
        #[arg(long, required_unless_present = "check_config")]
        config: Option<std::path::PathBuf>,
        /// Check a node file, the policy file and plans file it names, and its certificates,
        /// without starting: exit 0 if a node would start with them; else 1, with what is
        /// wrong and where (file, line, field).
        #[arg(long, value_name = "FILE", conflicts_with = "config")]
        check_config: Option<std::path::PathBuf>,
    },
    /// Simulate a cluster and print the overshoot, utilization and gossip cost to expect.
    Simulate(Box<simulate::SimulateArgs>),
    /// Print the hash under which `tenants` lists an API key (`api_key:` and 16 hex digits):
    /// reads API keys from standard input, one per line (never from the command line, which
    /// the shell's history and the process list would keep), and prints one hash per line.
    HashKey {
        /// The policy file whose `key_secret` the hash is made with.
        #[arg(long)]
        config: std::path::PathBuf,
        /// Read `KEY,TIER` lines and print `api_key:HASH,TIER` lines: a plans file
        /// (`plans_file`) from an export of keys and their tiers.
        #[arg(long)]
        plans: bool,
    },
    /// Call a node's `[admin]` port: its configuration, its members, a decision.
    Ctl(ctl::CtlArgs),
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
        /// Sign a client certificate for operator NAME with the CA already in `--out`
        /// (`operator-NAME.pem`, `.key`), for `ratemesh ctl --cert` against an admin port whose
        /// `client_ca` is this CA; repeat for several.
        #[arg(long = "operator", value_name = "NAME")]
        operator: Vec<String>,
        /// The cluster's name (in the CA's common name).
        #[arg(long, default_value = "ratemesh")]
        cluster: String,
        /// How many days each node's certificate is valid (never past its CA's end).
        #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u64).range(1..=36_500))]
        days: u64,
        /// How many days a new CA is valid.
        #[arg(long, default_value_t = 3650, value_parser = clap::value_parser!(u64).range(1..=36_500))]
        ca_days: u64,
    },
}

fn certs(
    out: &std::path::Path,
    nodes: u64,
    add: &[u64],
    operators: &[String],
    cluster: &str,
    validity: ratemesh::net::certs::Validity,
) -> Result<(), Box<dyn std::error::Error>> {
    if !operators.is_empty() {
        let written = ratemesh::net::certs::add_operators(out, cluster, operators, validity.node)?;
        for path in written {
            println!("wrote {}", path.display());
        }
    }
    if !add.is_empty() {
        if add
            .iter()
            .any(|&id| id == 0 || id > ratemesh::ids::MAX_NODE_ID)
        {
            return Err("--add-node: node ids are 1 to 2^63 - 1".into());
        }
        for path in ratemesh::net::certs::add_nodes(out, cluster, add, validity.node)? {
            println!("wrote {}", path.display());
        }
        return Ok(());
    }
    if !operators.is_empty() {
        return Ok(());
    }
    if nodes == 0 || nodes > 1024 {
        return Err("--nodes: between 1 and 1024".into());
    }
    let certs = ratemesh::net::certs::generate_with(cluster, nodes, validity)?;
    for path in ratemesh::net::certs::write(out, &certs)? {
        println!("wrote {}", path.display());
    }
    println!("keep ca.key offline: it signs new nodes");
    Ok(())
}

/// The longest API key `hash-key` reads (as `max_identity_bytes` allows at most).
const MAX_KEY_LINE: usize = 65536;

fn hash_key(config: &std::path::Path, plans: bool) -> Result<(), Box<dyn std::error::Error>> {
    use std::io::{BufRead, Write};
    let config = ratemesh::config::GatewayConfig::from_file(config)?;
    let Some(secret) = &config.key_secret else {
        return Err("the policy file has no `key_secret`: API keys are hashed under it".into());
    };
    let hasher = ratemesh::ids::KeyHasher::from_secret(secret);
    let stdin = std::io::stdin();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut hashed = 0u64;
    for (n, line) in stdin.lock().split(b'\n').enumerate() {
        let line = line?;
        let key = line.strip_suffix(b"\r").unwrap_or(&line).trim_ascii();
        if key.is_empty() {
            continue;
        }
        if key.len() > MAX_KEY_LINE {
            return Err(format!(
                "line {}: an API key longer than {MAX_KEY_LINE} bytes",
                n + 1
            )
            .into());
        }
        if plans {
            // `KEY,TIER`: the tier after the last comma (a key may hold commas).
            let Some(comma) = key.iter().rposition(|&b| b == b',') else {
                return Err(format!("line {}: write `KEY,TIER`", n + 1).into());
            };
            let tier = std::str::from_utf8(key[comma + 1..].trim_ascii())
                .ok()
                .filter(|t| !t.is_empty() && !t.contains(char::is_whitespace))
                .ok_or_else(|| format!("line {}: no tier after the last comma", n + 1))?;
            let key = key[..comma].trim_ascii();
            writeln!(out, "{},{tier}", hasher.label("api_key", key))?;
        } else {
            writeln!(out, "{}", hasher.label("api_key", key))?;
        }
        hashed += 1;
    }
    if hashed == 0 {
        return Err("no API key on standard input (one per line)".into());
    }
    out.flush()?;
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
    let file = ratemesh::node::NodeFile::from_file(config)?;
    start_purging()?;
    let runtime = tokio::runtime::Runtime::new()?;
    let span = tracing::info_span!("node", id = file.id);
    runtime.block_on(
        async move {
            let running = ratemesh::node::start(&file).await?;
            // One line on stdout that scripts (and `ratemesh demo`) wait for.
            let mut stdout = std::io::stdout();
            let rls = running
                .envoy_rls_addr()
                .map_or_else(String::new, |addr| format!(" envoy_rls={addr}"));
            let _ = writeln!(
                stdout,
                "ratemesh node {} ready: http={} quic={}{rls}",
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

fn check_config(path: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let file = ratemesh::node::NodeFile::from_file(path)?;
    // A `[redis]` deployment's client is made (never connected) on a runtime.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async { ratemesh::node::check(&file) })?;
    println!(
        "{}: node {}, {} peers, policy file {}: a node would start with it",
        path.display(),
        file.id,
        file.peers.len(),
        file.policy_file.display()
    );
    Ok(())
}

/// Give the memory freed in the node back to the OS every second, on a thread of its own.
/// mimalloc gives back freed pages after a delay, but only when a thread next frees a
/// page: a node that a burst of keys has left, and that is idle, may not do so for minutes.
fn start_purging() -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("ratemesh-purge".into())
        .spawn(|| {
            loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
                // SAFETY: mi_collect takes no pointer; `false`: purge what has expired.
                unsafe { libmimalloc_sys::mi_collect(false) };
            }
        })
        .map(drop)
}

/// mimalloc's `mi_option_purge_delay` (its place in `mi_option_e` of the mimalloc v3 header
/// that libmimalloc-sys builds; the crate names no constant for it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keep the memory a simulation frees for its own later use instead of giving it back to
/// the OS a second after (mimalloc's default): a run frees and allocates again all the
/// time, and each page given back costs a fault and a zeroing when it is taken again. The
/// process ends when the run does.
fn keep_freed_memory() {
    // SAFETY: sets an option value; no pointer.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
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

/// Run the command line; the process's exit code.
pub fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(&args),
        Command::Algorithms {
            rate,
            burst,
            steady,
        } => algorithms::run(rate, burst, steady),
        Command::Node {
            check_config: Some(file),
            ..
        } => check_config(&file),
        Command::Node {
            config: Some(config),
            ..
        } => node(&config),
        Command::Node { .. } => Err("give --config FILE (or --check-config FILE)".into()),
        Command::Simulate(args) => {
            quiet_on_closed_pipe();
            keep_freed_memory();
            simulate::run(&args)
        }
        Command::Certs {
            out,
            nodes,
            add_node,
            operator,
            cluster,
            days,
            ca_days,
        } => certs(
            &out,
            nodes,
            &add_node,
            &operator,
            &cluster,
            ratemesh::net::certs::Validity {
                ca: std::time::Duration::from_secs(ca_days * 86_400),
                node: std::time::Duration::from_secs(days * 86_400),
            },
        ),
        Command::HashKey { config, plans } => hash_key(&config, plans),
        Command::Ctl(args) => ctl::run(&args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("ratemesh: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use libmimalloc_sys::{mi_option_get, mi_option_t};

    #[test]
    fn the_purge_delay_option_is_where_it_is_named() {
        // mimalloc's defaults around the place: purge_delay 1000 ms (unless the environment
        // sets it), use_numa_nodes 0, os_tag 100; another numbering would not show these.
        let get = |option: mi_option_t| unsafe { mi_option_get(option) };
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(get(super::MI_OPTION_PURGE_DELAY), 1000);
        }
        assert_eq!(get(super::MI_OPTION_PURGE_DELAY + 3), 100);
        assert_eq!(get(super::MI_OPTION_PURGE_DELAY + 5), 32);
    }
}
