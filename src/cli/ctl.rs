//! `ratemesh ctl`: calls to a node's `[admin]` port, with a client certificate (`--ca`,
//! `--cert`, `--key`, when the port has a `client_ca`) or a bearer token from the environment
//! (`RATEMESH_TOKEN`) or a file (`--token-file`), never from the command line:
//! `config` and `members` (what the node runs with), `decide` (the decision API), `keys get`
//! and `keys reset` (a key across the cluster). Tables by default, the node's JSON with
//! `--json`.

use std::time::Duration;

use clap::{Args, Subcommand};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;

/// How long a call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest answer read.
const MAX_ANSWER_BYTES: usize = 4 << 20;

#[derive(Args)]
pub(crate) struct CtlArgs {
    /// The node's `[admin]` address (host:port).
    #[arg(long, default_value = "127.0.0.1:8090")]
    admin: String,
    /// A file holding the bearer token (else `RATEMESH_TOKEN`).
    #[arg(long)]
    token_file: Option<std::path::PathBuf>,
    /// Speak TLS, and check the node's certificate against this CA (the cluster's `ca.pem`).
    #[arg(long)]
    ca: Option<std::path::PathBuf>,
    /// A client certificate to present (with `--ca` and `--key`): the caller's name is its
    /// common name.
    #[arg(long, requires_all = ["ca", "key"])]
    cert: Option<std::path::PathBuf>,
    /// The client certificate's key.
    #[arg(long, requires = "cert")]
    key: Option<std::path::PathBuf>,
    /// Print the node's answer as JSON.
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    call: Call,
}

#[derive(Subcommand)]
enum Call {
    /// The node, its policies and what each counts by.
    Config,
    /// The members the node knows, alive or not, and whether their configuration agrees.
    Members,
    /// Ask for a decision: `decide POLICY NAME=VALUE… [--cost N]` (attributes as in
    /// docs/node.md, e.g. `api_key=…` or `header:x-account=alice`).
    Decide {
        policy: String,
        attributes: Vec<String>,
        #[arg(long, default_value_t = 1)]
        cost: u64,
    },
    /// A key's state across the cluster, or its reset: `keys get|reset POLICY NAME=VALUE…`
    /// (the attributes a request would carry, as for `decide`).
    Keys {
        #[command(subcommand)]
        call: KeyCall,
    },
    /// A policy's heaviest keys over the last 5 to 10 minutes, across the cluster.
    Top {
        /// The policy.
        #[arg(long)]
        policy: String,
        /// `denied` or `admitted`.
        #[arg(long, default_value = "denied")]
        by: String,
        /// How many keys (1 to 100).
        #[arg(long, default_value_t = 20)]
        n: usize,
    },
    /// Limits of their own for keys, until a time, on every node: `overrides set|list|rm`.
    Overrides {
        #[command(subcommand)]
        call: OverrideCall,
    },
}

#[derive(Subcommand)]
enum OverrideCall {
    /// `set POLICY NAME=VALUE… --limit N --for 24h [--reason TEXT]` (or `--until` an RFC
    /// 3339 instant).
    Set {
        policy: String,
        attributes: Vec<String>,
        #[arg(long)]
        limit: u64,
        #[arg(long = "for")]
        for_: Option<String>,
        #[arg(long)]
        until: Option<String>,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// The overrides in force (of one policy with `--policy`).
    List {
        #[arg(long)]
        policy: Option<String>,
    },
    /// `rm POLICY NAME=VALUE…`: the key's policy limit again.
    Rm {
        policy: String,
        attributes: Vec<String>,
    },
}

#[derive(Subcommand)]
enum KeyCall {
    /// The key's limit, what is left, and where (its owner and leases; each node's count).
    Get {
        policy: String,
        attributes: Vec<String>,
    },
    /// Give the key one fresh limit, cluster-wide (its lockout ends too).
    Reset {
        policy: String,
        attributes: Vec<String>,
    },
}

/// `NAME=VALUE` pairs as the decision API's attributes.
fn attributes(pairs: &[String]) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let mut named = serde_json::Map::new();
    for pair in pairs {
        let (name, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("{pair}: write NAME=VALUE"))?;
        named.insert(
            name.to_string(),
            serde_json::Value::String(value.to_string()),
        );
    }
    Ok(named)
}

pub(crate) fn run(args: &CtlArgs) -> Result<(), Box<dyn std::error::Error>> {
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
    };
    let token = match &args.token_file {
        Some(path) => Some(String::from_utf8_lossy(&read(path)?).trim().to_string()),
        None => match std::env::var("RATEMESH_TOKEN") {
            Ok(token) => Some(token),
            Err(_) if args.cert.is_some() => None,
            Err(_) => return Err("set RATEMESH_TOKEN, give --token-file, or give --cert".into()),
        },
    };
    let tls = match &args.ca {
        Some(ca) => {
            let identity = match (&args.cert, &args.key) {
                (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
                _ => None,
            };
            let (config, name) = ratemesh::net::admin_client(
                &read(ca)?,
                identity.as_ref().map(|(c, k)| (c.as_slice(), k.as_slice())),
            )?;
            Some((
                tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)),
                name,
            ))
        }
        None => None,
    };
    let token = token.as_deref();
    let (method, path, body) = match &args.call {
        Call::Config | Call::Members => ("GET", "/v1/config", None),
        Call::Decide {
            policy,
            attributes,
            cost,
        } => {
            let named = self::attributes(attributes)?;
            let call = serde_json::json!({"requests": [
                {"policy": policy, "attributes": named, "cost": cost}
            ]});
            ("POST", "/v1/decide", Some(call.to_string()))
        }
        Call::Keys {
            call: KeyCall::Get { policy, attributes },
        } => {
            let call =
                serde_json::json!({"policy": policy, "attributes": self::attributes(attributes)?});
            ("GET", "/v1/keys", Some(call.to_string()))
        }
        Call::Keys {
            call: KeyCall::Reset { policy, attributes },
        } => {
            let call =
                serde_json::json!({"policy": policy, "attributes": self::attributes(attributes)?});
            ("POST", "/v1/keys/reset", Some(call.to_string()))
        }
        Call::Overrides {
            call:
                OverrideCall::Set {
                    policy,
                    attributes,
                    limit,
                    for_,
                    until,
                    reason,
                },
        } => {
            let mut call = serde_json::json!({"policy": policy, "attributes": self::attributes(attributes)?, "limit": limit, "reason": reason});
            if let Some(d) = for_ {
                call["for"] = serde_json::json!(d);
            }
            if let Some(at) = until {
                call["until"] = serde_json::json!(at);
            }
            ("PUT", "/v1/overrides", Some(call.to_string()))
        }
        Call::Top { policy, by, n } => (
            "GET",
            leak(format!(
                "/v1/top?{}",
                form_urlencoded::Serializer::new(String::new())
                    .append_pair("policy", policy)
                    .append_pair("by", by)
                    .append_pair("n", &n.to_string())
                    .finish()
            )),
            None,
        ),
        Call::Overrides {
            call: OverrideCall::List { policy },
        } => match policy {
            Some(p) => (
                "GET",
                leak(format!(
                    "/v1/overrides?{}",
                    form_urlencoded::Serializer::new(String::new())
                        .append_pair("policy", p)
                        .finish()
                )),
                None,
            ),
            None => ("GET", "/v1/overrides", None),
        },
        Call::Overrides {
            call: OverrideCall::Rm { policy, attributes },
        } => {
            let call =
                serde_json::json!({"policy": policy, "attributes": self::attributes(attributes)?});
            ("DELETE", "/v1/overrides", Some(call.to_string()))
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (status, answer) = runtime.block_on(async {
        tokio::time::timeout(
            CALL_TIMEOUT,
            call(&args.admin, tls, method, path, token, body),
        )
        .await
        .map_err(|_| format!("{}: no answer within {CALL_TIMEOUT:?}", args.admin))?
    })?;
    if status != 200 && !(args.json && answer.get("key").is_some()) {
        if answer.get("key").is_some() {
            // A partial answer (a node did not answer): what is known, then the error.
            print_key(&answer);
        }
        let message = answer["message"].as_str().unwrap_or("");
        return Err(format!(
            "{status}: {} {message}",
            answer["error"].as_str().unwrap_or("")
        )
        .into());
    }
    if args.json {
        println!("{answer}");
        return Ok(());
    }
    match &args.call {
        Call::Config => print_config(&answer),
        Call::Members => print_members(&answer),
        Call::Decide { .. } => print_decision(&answer["responses"][0])?,
        Call::Keys { .. } => print_key(&answer),
        Call::Top { .. } => print_top(&answer),
        Call::Overrides {
            call: OverrideCall::List { .. },
        } => print_overrides(answer["overrides"].as_array().map_or(&[][..], |v| v)),
        Call::Overrides { .. } => {
            print_overrides(std::slice::from_ref(&answer));
            let pending = answer["pending"].as_array().map_or(0, Vec::len);
            println!(
                "taken by nodes {}{}",
                answer["nodes"],
                if pending > 0 {
                    format!(
                        "; {} will pull it (no answer): {}",
                        pending, answer["pending"]
                    )
                } else {
                    String::new()
                }
            );
        }
    }
    Ok(())
}

/// One HTTP/1.1 call to `admin`; its status and JSON answer.
async fn call(
    admin: &str,
    tls: Option<(
        tokio_rustls::TlsConnector,
        rustls::pki_types::ServerName<'static>,
    )>,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<String>,
) -> Result<(u16, serde_json::Value), Box<dyn std::error::Error>> {
    let stream = tokio::net::TcpStream::connect(admin)
        .await
        .map_err(|e| format!("{admin}: {e}"))?;
    let mut sender = match tls {
        Some((tls, name)) => {
            let stream = tls
                .connect(name, stream)
                .await
                .map_err(|e| format!("{admin}: TLS: {e}"))?;
            let (sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(connection);
            sender
        }
        None => {
            let (sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(connection);
            sender
        }
    };
    let mut request = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, admin);
    if let Some(token) = token {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.unwrap_or_default(),
        )))?;
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    let limited = http_body_util::Limited::new(response.into_body(), MAX_ANSWER_BYTES);
    let bytes = limited
        .collect()
        .await
        .map_err(|e| format!("reading the answer: {e}"))?
        .to_bytes();
    let answer =
        serde_json::from_slice(&bytes).map_err(|e| format!("the answer is not JSON ({e})"))?;
    Ok((status, answer))
}

fn print_config(answer: &serde_json::Value) {
    let node = &answer["node"];
    println!(
        "node {} (ratemesh {}, wire {}), mesh digest {}",
        node["id"],
        node["version"].as_str().unwrap_or("?"),
        node["wire"],
        answer["mesh_digest"].as_str().unwrap_or("?")
    );
    println!(
        "{:<24} {:<16} {:<7} {:>12} {:>10}  by",
        "policy", "algorithm", "backend", "limit", "window"
    );
    for p in answer["policies"].as_array().into_iter().flatten() {
        let by = match p["by"].as_array() {
            Some(parts) => parts
                .iter()
                .filter_map(|part| part.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            None => "client".to_string(),
        };
        println!(
            "{:<24} {:<16} {:<7} {:>12} {:>9}s  {by}",
            p["name"].as_str().unwrap_or("?"),
            p["algorithm"].as_str().unwrap_or("?"),
            p["backend"].as_str().unwrap_or("?"),
            s(&p["limit"]),
            p["window_ms"].as_u64().unwrap_or(0) as f64 / 1000.0,
        );
    }
}

fn print_members(answer: &serde_json::Value) {
    println!("{:>6}  {:<6} configuration", "member", "alive");
    for m in answer["members"].as_array().into_iter().flatten() {
        println!(
            "{:>6}  {:<6} {}",
            s(&m["id"]),
            if m["alive"] == true { "yes" } else { "no" },
            if m["config_agrees"] == true {
                "agrees"
            } else {
                "differs"
            },
        );
    }
}

fn print_top(answer: &serde_json::Value) {
    println!(
        "{} {} over the last 5-10 min: {} decisions on nodes {}",
        answer["policy"].as_str().unwrap_or("?"),
        answer["by"].as_str().unwrap_or("?"),
        answer["total"],
        answer["nodes"],
    );
    println!(
        "{:>4}  {:<16} {:>10} {:>10}  identity",
        "rank", "key", "count", "at least"
    );
    for (i, k) in answer["keys"].as_array().into_iter().flatten().enumerate() {
        println!(
            "{:>4}  {:<16} {:>10} {:>10}  {}",
            i + 1,
            k["key"].as_str().unwrap_or("?"),
            s(&k["count"]),
            s(&k["at_least"]),
            k["identity"].as_str().unwrap_or("-")
        );
    }
    for n in answer["unreachable"].as_array().into_iter().flatten() {
        println!(
            "node {} did not answer: {}",
            n["node"],
            n["message"].as_str().unwrap_or("")
        );
    }
}

/// A JSON value as a table cell (a string without its quotes).
fn s(v: &serde_json::Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

/// A path made once for the life of the command.
fn leak(path: String) -> &'static str {
    Box::leak(path.into_boxed_str())
}

fn print_overrides(list: &[serde_json::Value]) {
    println!(
        "{:<20} {:<16} {:>10} {:<22} {:<12} reason",
        "policy", "key", "limit", "until (UTC)", "by"
    );
    for o in list {
        let until = o["until_ms"]
            .as_i64()
            .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
            .map_or_else(
                || "(removed)".to_string(),
                |t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            );
        println!(
            "{:<20} {:<16} {:>10} {:<22} {:<12} {}",
            o["policy"].as_str().unwrap_or("?"),
            o["key"].as_str().unwrap_or("?"),
            s(&o["limit"]),
            until,
            o["by"].as_str().unwrap_or(""),
            o["reason"].as_str().unwrap_or(""),
        );
    }
}

fn print_key(answer: &serde_json::Value) {
    let ms = |v: &serde_json::Value| v.as_u64().unwrap_or(0) as f64 / 1000.0;
    println!(
        "{} key {} ({}): {} of {} left, whole again in {:.3}s{}{}",
        answer["policy"].as_str().unwrap_or("?"),
        answer["key"].as_str().unwrap_or("?"),
        answer["backend"].as_str().unwrap_or("?"),
        answer["remaining"],
        answer["limit"],
        ms(&answer["reset_after_ms"]),
        match answer["lockout_ms"].as_u64() {
            Some(ms) if ms > 0 => format!(", locked out for {:.3}s", ms as f64 / 1000.0),
            _ => String::new(),
        },
        if answer["reset"] == true {
            " (reset)"
        } else {
            ""
        },
    );
    if let Some(owner) = answer["owner"].as_u64() {
        println!(
            "owner node {owner}: {} free, {} leased, {} used",
            answer["available"], answer["leased"], answer["used"]
        );
        println!("{:>6} {:>10} {:>10}", "node", "leased", "used");
        for h in answer["holders"].as_array().into_iter().flatten() {
            println!(
                "{:>6} {:>10} {:>10}",
                s(&h["node"]),
                s(&h["leased"]),
                s(&h["used"])
            );
        }
    }
    if let Some(nodes) = answer["nodes"].as_array() {
        println!(
            "{:>6} {:>10} {:>10} {:>10}",
            "node", "left", "reset_s", "lockout_s"
        );
        for n in nodes {
            println!(
                "{:>6} {:>10} {:>10.3} {:>10.3}",
                s(&n["node"]),
                s(&n["remaining"]),
                ms(&n["reset_after_ms"]),
                ms(&n["lockout_ms"])
            );
        }
        for n in answer["unreachable"].as_array().into_iter().flatten() {
            println!(
                "{:>6} no answer: {}",
                s(&n["node"]),
                n["message"].as_str().unwrap_or("")
            );
        }
    }
}

fn print_decision(answer: &serde_json::Value) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(error) = answer["error"].as_str() {
        return Err(format!("{error}: {}", answer["message"].as_str().unwrap_or("")).into());
    }
    if answer["allowed"] == true {
        println!(
            "allowed: {} of {} left, whole again in {} ms",
            answer["remaining"], answer["limit"], answer["reset_after_ms"]
        );
    } else {
        println!("denied: retry in {} ms", answer["retry_after_ms"]);
    }
    Ok(())
}
