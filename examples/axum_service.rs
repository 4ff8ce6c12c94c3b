//! An axum service rate-limited by a policy file that is reloaded on SIGHUP (Unix).
//!
//! ```sh
//! cargo run --release --example axum_service                        # examples/policies.toml
//! cargo run --release --example axum_service -- my-policies.toml 127.0.0.1:3000
//! curl -i -H 'x-api-key: k1' http://127.0.0.1:3000/                # 200 with RateLimit fields
//! kill -HUP <pid>                                                   # re-read the file
//! cargo run --release --example axum_service -- --self-test         # serve itself, then exit
//! ```
//!
//! `--self-test` writes a policy file in a temporary directory, serves on a free port, sends
//! requests to itself, rewrites the file and sends itself SIGHUP (a valid file, then a broken
//! one), checks what it gets each time and exits.
//!
//! Cargo.toml of a service like this one:
//!
//! ```toml
//! ratemesh = { version = "0.1", default-features = false, features = ["http"] }
//! axum = "0.8"
//! tokio = { version = "1", features = ["rt-multi-thread", "macros", "signal"] }
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use ratemesh::http::RateLimitLayer;

/// The service: the application's routes, with the rate limit in front of all of them.
fn app(limits: RateLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/search", get(|| async { "results\n" }))
        .layer(limits)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--self-test") {
        return self_test().await;
    }
    let path = PathBuf::from(
        args.first()
            .map_or("examples/policies.toml", String::as_str),
    );
    let addr: SocketAddr = args
        .get(1)
        .map_or("127.0.0.1:3000", String::as_str)
        .parse()?;

    // An invalid file stops the service here, with the file, line and field of the error.
    let limits = RateLimitLayer::from_file(&path)?;
    // From now on SIGHUP re-reads the file; a broken file is logged and the rules stay.
    limits.reload_on_sighup(&path)?;

    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!(
        "serving on http://{} with {} (pid {}: `kill -HUP {}` reloads it)",
        listener.local_addr()?,
        path.display(),
        std::process::id(),
        std::process::id(),
    );
    // The connect info gives the layer the client's address (identity `ip`).
    axum::serve(
        listener,
        app(limits).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}

const FIRST: &str = r#"
env = "self-test"
default_tier = "free"

[policies.per_key]
algorithm = "token-bucket"
rate = 3
period = "1m"
burst = 3

[tiers.free]
policies = ["per_key"]
"#;

async fn self_test() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("ratemesh-axum-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("policies.toml");
    let result = run_self_test(&path).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn run_self_test(path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::write(path, FIRST)?;
    let limits = RateLimitLayer::from_file(path)?;
    limits.reload_on_sighup(path)?;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        axum::serve(
            listener,
            app(limits.clone()).into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async {
            let _ = stopped.await;
        })
        .into_future(),
    );
    let client = reqwest::Client::new();
    let get = |key: &'static str| {
        let request = client.get(format!("{base}/")).header("x-api-key", key);
        async move { request.send().await }
    };

    // A burst of 3 per client: the fourth and fifth requests are denied.
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let response = get("k1").await?;
        let status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_string()
        };
        println!(
            "GET / (x-api-key k1): {status}, RateLimit: {}, Retry-After: {}",
            header("ratelimit"),
            header("retry-after"),
        );
        statuses.push(status);
    }
    check(
        statuses == [200, 200, 200, 429, 429],
        "burst of 3, then 429",
    )?;

    // A larger burst: the changed policy starts with fresh counters once SIGHUP applies it.
    std::fs::write(path, FIRST.replace("burst = 3", "burst = 10"))?;
    hang_up();
    let burst = |limits: &RateLimitLayer| {
        limits
            .rules()
            .config()
            .policy("per_key")
            .map(|p| p.policy.capacity())
    };
    let mut waited = 0;
    while burst(&limits) != Some(10) && waited < 50 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += 1;
    }
    check(burst(&limits) == Some(10), "SIGHUP applied the new file")?;
    let status = get("k1").await?.status().as_u16();
    println!("after SIGHUP with burst = 10: GET / (x-api-key k1): {status}");
    check(status == 200, "admitted again under the new file")?;

    // A broken file is refused (logged through `tracing`); the rules in force stay.
    let before = limits.rules();
    std::fs::write(path, FIRST.replace("burst = 3", "burst = 0"))?;
    hang_up();
    tokio::time::sleep(Duration::from_millis(300)).await;
    check(
        std::sync::Arc::ptr_eq(&before, &limits.rules()),
        "a broken file keeps the rules in force",
    )?;
    let status = get("k1").await?.status().as_u16();
    println!("after SIGHUP with a broken file: GET / (x-api-key k1): {status}");
    check(status == 200, "still served under the last valid file")?;

    let _ = stop.send(());
    server.await??;
    println!("self-test passed");
    Ok(())
}

/// Send this process SIGHUP, as `kill -HUP <pid>` would.
fn hang_up() {
    // SAFETY: kill(2) with this process's own id and a signal the runtime handles.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGHUP);
    }
}

fn check(ok: bool, what: &str) -> Result<(), Box<dyn std::error::Error>> {
    if ok {
        Ok(())
    } else {
        Err(format!("self-test failed: {what}").into())
    }
}
