//! API plans: a client's tier from `tenants` (API keys by hash, as `ratemesh hash-key`
//! prints them), from a verified JWT claim, or from a header set by a trusted proxy, in the
//! order `tier_from` gives; through the tower layer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use ratemesh::ManualClock;
use ratemesh::config::GatewayConfig;
use ratemesh::http::{ClientAddr, RateLimitLayer};
use ratemesh::ids::KeyHasher;
use tower::{Service, ServiceExt};

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef-plans";

/// Free: 1 per hour; pro: 3 per hour (per client).
fn file(head: &str) -> String {
    format!(
        "env = \"test\"\nkey_secret = \"s\"\ndefault_tier = \"free\"\n{head}\n\n\
         [policies.free_hourly]\nalgorithm = \"fixed-window\"\nlimit = 1\nwindow = \"1h\"\n\n\
         [policies.pro_hourly]\nalgorithm = \"fixed-window\"\nlimit = 3\nwindow = \"1h\"\n\n\
         [tiers.free]\npolicies = [\"free_hourly\"]\n\n[tiers.pro]\npolicies = [\"pro_hourly\"]\n"
    )
}

fn layer_in(dir: &std::path::Path, text: &str) -> Result<RateLimitLayer, String> {
    let path = dir.join("policies.toml");
    std::fs::write(&path, text).unwrap();
    let config = GatewayConfig::from_file(&path).map_err(|e| e.to_string())?;
    let clock = Arc::new(ManualClock::new(1_700_000_000_000_000_000));
    RateLimitLayer::with_clock(config, clock).map_err(|e| e.to_string())
}

/// How many of `n` requests with `headers` from `peer` are admitted.
async fn admitted(
    layer: &RateLimitLayer,
    peer: &str,
    headers: &[(&str, String)],
    n: usize,
) -> usize {
    let mut count = 0;
    for _ in 0..n {
        let mut service =
            tower::ServiceBuilder::new()
                .layer(layer.clone())
                .service(tower::service_fn(|_request| async {
                    Ok::<_, std::convert::Infallible>(
                        http::Response::new(axum::body::Body::empty()),
                    )
                }));
        let mut request = http::Request::get("/");
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        let mut request = request.body(axum::body::Body::empty()).unwrap();
        let peer: SocketAddr = format!("{peer}:5000").parse().unwrap();
        request.extensions_mut().insert(ClientAddr(peer));
        let response = service.ready().await.unwrap().call(request).await.unwrap();
        count += usize::from(response.status() == 200);
    }
    count
}

#[tokio::test]
async fn an_api_key_listed_by_its_hash_gets_its_plan() {
    let dir = tempfile::tempdir().unwrap();
    // The hash as the command prints it, from standard input.
    std::fs::write(dir.path().join("policies.toml"), file("")).unwrap();
    let output = {
        use std::io::Write;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ratemesh"))
            .args(["hash-key", "--config"])
            .arg(dir.path().join("policies.toml"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"sk_live_pro_customer\r\n\nsk_other\n")
            .unwrap();
        child.wait_with_output().unwrap()
    };
    assert!(output.status.success());
    let printed = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(lines.len(), 2, "{printed}");
    assert_eq!(
        lines[0],
        KeyHasher::from_secret("s").label("api_key", b"sk_live_pro_customer")
    );
    let layer = layer_in(
        dir.path(),
        &file(&format!("\n[tenants]\n\"{}\" = \"pro\"\n", lines[0])),
    )
    .unwrap();
    let key = |k: &str| vec![("x-api-key", k.to_string())];
    assert_eq!(
        admitted(&layer, "192.0.2.1", &key("sk_live_pro_customer"), 5).await,
        3
    );
    assert_eq!(admitted(&layer, "192.0.2.1", &key("sk_other"), 5).await, 1);
    assert_eq!(
        admitted(&layer, "192.0.2.1", &key("sk_unknown"), 5).await,
        1
    );

    // With no key on standard input, or no key_secret, the command says so.
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_ratemesh"))
        .args(["hash-key", "--config"])
        .arg(dir.path().join("policies.toml"))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!status.status.success());
    assert!(String::from_utf8_lossy(&status.stderr).contains("no API key"));
}

#[tokio::test]
async fn tier_from_takes_a_verified_claim_then_a_trusted_header_in_its_order() {
    use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hmac.secret"), SECRET).unwrap();
    let layer = layer_in(
        dir.path(),
        &file(
            "tier_from = [\"jwt:plan\", \"header:x-plan\"]\n\n\
             [identity]\norder = [\"api_key\", \"ip\"]\ntrusted_proxies = [\"10.0.0.1\"]\n\n\
             [jwt]\nalgorithms = [\"HS256\"]\nsecret_file = \"hmac.secret\"",
        ),
    )
    .unwrap();
    let exp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    let token = |plan: &str, key: &[u8]| {
        let claims = serde_json::json!({ "sub": "x", "plan": plan, "exp": exp });
        format!(
            "Bearer {}",
            encode(
                &Header::new(Algorithm::HS256),
                &claims,
                &EncodingKey::from_secret(key)
            )
            .unwrap()
        )
    };
    let with = |api_key: &str, auth: Option<String>, plan: Option<&str>| {
        let mut headers = vec![("x-api-key", api_key.to_string())];
        if let Some(auth) = auth {
            headers.push(("authorization", auth));
        }
        if let Some(plan) = plan {
            headers.push(("x-plan", plan.to_string()));
        }
        headers
    };
    // A verified `plan` claim: pro.
    assert_eq!(
        admitted(
            &layer,
            "192.0.2.1",
            &with("k1", Some(token("pro", SECRET)), None),
            5
        )
        .await,
        3
    );
    // A forged token (another secret) is no plan: free.
    let forged = token("pro", b"not the secret, but 32 bytes long...");
    assert_eq!(
        admitted(&layer, "192.0.2.1", &with("k2", Some(forged), None), 5).await,
        1
    );
    // A claim that names no tier falls through to the header, believed from the proxy.
    assert_eq!(
        admitted(
            &layer,
            "10.0.0.1",
            &with("k3", Some(token("gold", SECRET)), Some("pro")),
            5
        )
        .await,
        3
    );
    // The same header from a client directly is not believed.
    assert_eq!(
        admitted(&layer, "192.0.2.9", &with("k4", None, Some("pro")), 5).await,
        1
    );
}

#[test]
fn plans_that_would_leak_or_cannot_work_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let refused = |text: String, field: &str, reason: &str| {
        let error = layer_in(dir.path(), &text).err().unwrap();
        assert!(error.contains(field) && error.contains(reason), "{error}");
    };
    refused(
        file("\n[tenants]\n\"api_key:sk_live_in_clear\" = \"pro\"\n"),
        "tenants.api_key:sk_live_in_clear",
        "never in clear",
    );
    refused(
        file("\n[tenants]\n\"api_key:9F2C41D07AB3E6F1\" = \"pro\"\n"),
        "tenants.api_key",
        "never in clear",
    );
    refused(
        file("\n[tenants]\n\"tenant-7\" = \"pro\"\n"),
        "tenants.tenant-7",
        "name a client",
    );
    refused(
        file("\n[tenants]\n\"api_key:9f2c41d07ab3e6f1\" = \"pro\"\n")
            .replace("key_secret = \"s\"\n", ""),
        "tenants.api_key",
        "set `key_secret`",
    );
    refused(
        file("tier_from = [\"jwt:plan\"]"),
        "tier_from",
        "add a `[jwt]`",
    );
    refused(
        file("tier_from = [\"cookie:plan\"]"),
        "tier_from",
        "not a source of tiers",
    );
    refused(
        file("tier_from = [\"tenants\", \"tenants\"]"),
        "tier_from",
        "twice",
    );
}

#[tokio::test]
async fn exempt_api_keys_and_jwt_subjects_are_never_limited() {
    use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hmac.secret"), SECRET).unwrap();
    let monitor = KeyHasher::from_secret("s").label("api_key", b"sk_monitoring");
    let layer = layer_in(
        dir.path(),
        &file(&format!(
            "\n[jwt]\nalgorithms = [\"HS256\"]\nsecret_file = \"hmac.secret\"\n\n\
             [access]\nexempt_api_keys = [\"{monitor}\"]\nexempt_subjects = [\"svc-health\"]\n"
        )),
    )
    .unwrap();
    let key = |k: &str| vec![("x-api-key", k.to_string())];
    assert_eq!(
        admitted(&layer, "192.0.2.1", &key("sk_monitoring"), 5).await,
        5
    );
    assert_eq!(
        admitted(&layer, "192.0.2.1", &key("sk_someone"), 5).await,
        1
    );
    let exp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    let bearer = |sub: &str, secret: &[u8]| {
        let claims = serde_json::json!({ "sub": sub, "exp": exp });
        let token = encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret),
        );
        vec![
            ("x-api-key", format!("k-{sub}")),
            ("authorization", format!("Bearer {}", token.unwrap())),
        ]
    };
    assert_eq!(
        admitted(&layer, "192.0.2.1", &bearer("svc-health", SECRET), 5).await,
        5
    );
    assert_eq!(
        admitted(&layer, "192.0.2.1", &bearer("alice", SECRET), 5).await,
        1
    );
    // A forged token naming the exempt subject is limited like anyone.
    let forged = bearer("svc-health", b"a forged secret of thirty-two bytes!");
    let forged: Vec<(&str, String)> = forged
        .into_iter()
        .map(|(n, v)| {
            if n == "x-api-key" {
                (n, "k-forged".to_string())
            } else {
                (n, v)
            }
        })
        .collect();
    assert_eq!(admitted(&layer, "192.0.2.1", &forged, 5).await, 1);
    // In clear, or without what verifies them: refused.
    let bad = file("\n[access]\nexempt_api_keys = [\"sk_monitoring\"]\n");
    assert!(
        layer_in(dir.path(), &bad)
            .err()
            .unwrap()
            .contains("never in clear")
    );
    let bad = file("\n[access]\nexempt_subjects = [\"svc-health\"]\n");
    assert!(
        layer_in(dir.path(), &bad)
            .err()
            .unwrap()
            .contains("add a `[jwt]`")
    );
}

/// `ratemesh hash-key --plans` over an export of a million `KEY,TIER` lines.
fn plans_file_of(dir: &std::path::Path, lines: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ratemesh"))
        .args(["hash-key", "--plans", "--config"])
        .arg(dir.join("policies.toml"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = lines.to_string();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()).unwrap());
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[tokio::test]
async fn a_plans_file_of_a_million_api_keys_gives_each_its_plan() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("policies.toml"), file("")).unwrap();
    // A million customers, every tenth on the pro plan; keys may hold commas.
    let mut export = String::new();
    for i in 0..1_000_000u32 {
        let tier = if i % 10 == 0 { "pro" } else { "free" };
        export.push_str(&format!("sk_live_{i:07},x,{tier}\n"));
    }
    let plans = plans_file_of(dir.path(), &export);
    assert_eq!(plans.lines().count(), 1_000_000);
    assert_eq!(
        plans.lines().next().unwrap(),
        format!(
            "{},pro",
            KeyHasher::from_secret("s").label("api_key", b"sk_live_0000000,x")
        )
    );
    std::fs::write(dir.path().join("plans.csv"), &plans).unwrap();
    let layer = layer_in(dir.path(), &file("plans_file = \"plans.csv\"")).unwrap();
    let key = |k: &str| vec![("x-api-key", k.to_string())];
    for (customer, limit) in [
        ("sk_live_0000000,x", 3),
        ("sk_live_0999990,x", 3),
        ("sk_live_0000001,x", 1),
        ("sk_live_0999999,x", 1),
        ("sk_not_a_customer", 1),
    ] {
        assert_eq!(
            admitted(&layer, "192.0.2.1", &key(customer), 5).await,
            limit,
            "{customer}"
        );
    }
    // `tenants` and the plans file may not both list a key; a plans file needs `key_secret`.
    let first = plans.lines().next().unwrap().split(',').next().unwrap();
    let error = layer_in(
        dir.path(),
        &file(&format!(
            "plans_file = \"plans.csv\"\n\n[tenants]\n\"{first}\" = \"pro\""
        )),
    )
    .err()
    .unwrap();
    assert!(
        error.contains("plans.csv:1:") && error.contains("`tenants`"),
        "{error}"
    );
    let error = layer_in(
        dir.path(),
        &file("plans_file = \"plans.csv\"").replace("key_secret = \"s\"\n", ""),
    )
    .err()
    .unwrap();
    assert!(error.contains("`plans_file`: API keys"), "{error}");
    // A bad line names the plans file and its line, and never echoes a key in clear.
    std::fs::write(
        dir.path().join("plans.csv"),
        format!("{first},pro\napi_key:sk_live_secret,pro\n"),
    )
    .unwrap();
    let error = layer_in(dir.path(), &file("plans_file = \"plans.csv\""))
        .err()
        .unwrap();
    assert!(error.contains("plans.csv:2: `api_key`"), "{error}");
    assert!(!error.contains("sk_live_secret"), "{error}");
}
