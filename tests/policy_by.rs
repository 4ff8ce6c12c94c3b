//! What a policy counts by (`by`), client addresses by prefix, `on_missing`, and `[access]`,
//! through the tower layer (requests built in memory, each with its client's address).

use std::net::SocketAddr;
use std::sync::Arc;

use ratemesh::ManualClock;
use ratemesh::config::GatewayConfig;
use ratemesh::http::{ClientAddr, RateLimitLayer};
use tower::{Service, ServiceExt};

const T0: u64 = 1_700_000_000_000_000_000;

fn layer(text: &str) -> RateLimitLayer {
    let config = GatewayConfig::from_toml_str(text, "policies.toml").unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    RateLimitLayer::with_clock(config, clock).unwrap()
}

/// Send one request from `addr` (with `headers`) to `path`; return the status and body.
async fn send(
    layer: &RateLimitLayer,
    addr: &str,
    path: &str,
    headers: &[(&str, &[u8])],
) -> (u16, String) {
    let mut service = tower::ServiceBuilder::new()
        .layer(layer.clone())
        .service(tower::service_fn(|_request| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::from("ok")))
        }));
    let mut request = http::Request::get(path);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let mut request = request.body(axum::body::Body::empty()).unwrap();
    let peer: SocketAddr = format!("[{addr}]:4000")
        .parse()
        .or_else(|_| format!("{addr}:4000").parse())
        .unwrap();
    request.extensions_mut().insert(ClientAddr(peer));
    let response = service.ready().await.unwrap().call(request).await.unwrap();
    let status = response.status().as_u16();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

async fn statuses(
    layer: &RateLimitLayer,
    addr: &str,
    path: &str,
    headers: &[(&str, &[u8])],
    n: usize,
) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(send(layer, addr, path, headers).await.0);
    }
    out
}

const HEAD: &str = "env = \"test\"\nkey_secret = \"s\"\ndefault_tier = \"api\"\n";

#[tokio::test]
async fn an_ipv6_client_cannot_leave_its_limit_inside_its_64() {
    let text = format!(
        "{HEAD}[identity]\norder = [\"ip\"]\n\n[policies.per_address]\nalgorithm = \"fixed-window\"\n\
         limit = 3\nwindow = \"1m\"\n\n[tiers.api]\npolicies = [\"per_address\"]\n"
    );
    let layer = layer(&text);
    // Three addresses of one /64 share its three requests.
    let mut seen = Vec::new();
    for addr in [
        "2001:db8:1:2::1",
        "2001:db8:1:2::2",
        "2001:db8:1:2:ffff::9",
        "2001:db8:1:2::3",
    ] {
        seen.push(send(&layer, addr, "/", &[]).await.0);
    }
    assert_eq!(seen, [200, 200, 200, 429]);
    // The next /64 has its own; IPv4 addresses are counted one by one.
    assert_eq!(send(&layer, "2001:db8:1:3::1", "/", &[]).await.0, 200);
    assert_eq!(
        statuses(&layer, "192.0.2.1", "/", &[], 4).await,
        [200, 200, 200, 429]
    );
    assert_eq!(send(&layer, "192.0.2.2", "/", &[]).await.0, 200);

    // `ipv6_prefix = 128` and `ipv4_prefix = 24` group otherwise.
    let text = text.replace(
        "order = [\"ip\"]",
        "order = [\"ip\"]\nipv6_prefix = 128\nipv4_prefix = 24",
    );
    let layer = self::layer(&text);
    assert_eq!(
        statuses(&layer, "2001:db8::1", "/", &[], 4).await,
        [200, 200, 200, 429]
    );
    assert_eq!(send(&layer, "2001:db8::2", "/", &[]).await.0, 200);
    assert_eq!(
        statuses(&layer, "198.51.100.1", "/", &[], 3).await,
        [200; 3]
    );
    assert_eq!(send(&layer, "198.51.100.200", "/", &[]).await.0, 429);
}

#[tokio::test]
async fn a_route_wide_cap_holds_beside_each_clients_own_limit() {
    let text = format!(
        "{HEAD}[policies.per_client]\nalgorithm = \"fixed-window\"\nlimit = 2\nwindow = \"1m\"\n\n\
         [policies.search_for_everyone]\nalgorithm = \"fixed-window\"\nlimit = 5\nwindow = \"1m\"\nby = []\n\n\
         [tiers.api]\npolicies = [\"per_client\"]\n\n\
         [[routes]]\nname = \"search\"\npath_prefix = \"/search\"\npolicies = [\"search_for_everyone\"]\n"
    );
    let layer = layer(&text);
    let key = |k: &'static str| [("x-api-key", k.as_bytes())];
    // Each client has 2; the route has 5 for all of them together.
    let mut admitted = 0;
    for client in ["a", "b", "c", "d"] {
        for status in statuses(&layer, "192.0.2.1", "/search", &key(client), 2).await {
            admitted += usize::from(status == 200);
        }
    }
    assert_eq!(admitted, 5, "the route's cap for everybody");
    // Another path is not under the route's cap: a fresh client gets its own 2 there.
    assert_eq!(
        statuses(&layer, "192.0.2.1", "/other", &key("e"), 3).await,
        [200, 200, 429]
    );
    // A denial by the route's cap leaves the client's own count as it was.
    assert_eq!(send(&layer, "192.0.2.1", "/search", &key("f")).await.0, 429);
    assert_eq!(
        statuses(&layer, "192.0.2.1", "/other", &key("f"), 3).await,
        [200, 200, 429]
    );
}

#[tokio::test]
async fn a_policy_counts_by_header_cookie_query_or_combinations_and_says_what_is_missing() {
    let text = format!(
        "{HEAD}[policies.per_account]\nalgorithm = \"fixed-window\"\nlimit = 2\nwindow = \"1m\"\n\
         by = [\"header:x-account\", \"method\"]\n\n\
         [policies.per_sid]\nalgorithm = \"fixed-window\"\nlimit = 3\nwindow = \"1m\"\n\
         by = [\"cookie:sid\"]\non_missing = \"skip\"\n\n\
         [policies.per_user_param]\nalgorithm = \"fixed-window\"\nlimit = 4\nwindow = \"1m\"\n\
         by = [\"query:user\", \"ip\"]\non_missing = \"skip\"\n\n\
         [tiers.api]\npolicies = [\"per_account\", \"per_sid\", \"per_user_param\"]\n"
    );
    let layer = layer(&text);
    // No account header: refused with 400 and a body that names the part, nothing counted.
    let (status, body) = send(&layer, "192.0.2.1", "/", &[]).await;
    assert_eq!(status, 400);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"], "missing_part");
    assert_eq!(body["part"], "header:x-account");
    assert_eq!(body["policy"], "per_account");
    // Two per account, whatever the address; the cookie and query policies are skipped.
    let alice = [("x-account", &b"alice"[..])];
    assert_eq!(statuses(&layer, "192.0.2.1", "/", &alice, 1).await, [200]);
    assert_eq!(
        statuses(&layer, "192.0.2.9", "/", &alice, 2).await,
        [200, 429]
    );
    // A header of any bytes (not UTF-8) is a key like any other.
    let odd = [("x-account", &b"\xff\xfe-\x80"[..])];
    assert_eq!(
        statuses(&layer, "192.0.2.1", "/", &odd, 3).await,
        [200, 200, 429]
    );
    // Three per `sid` cookie, found in a 64 KiB cookie header.
    let mut cookie = "x=".to_string() + &"y".repeat(64 * 1024) + "; sid=s1";
    let jar = |c: &String, account: &'static str| -> Vec<(&'static str, Vec<u8>)> {
        vec![
            ("x-account", account.as_bytes().to_vec()),
            ("cookie", c.as_bytes().to_vec()),
        ]
    };
    let mut seen = Vec::new();
    for account in ["b1", "b2", "b3", "b4"] {
        let headers = jar(&cookie, account);
        let headers: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, &v[..])).collect();
        seen.push(send(&layer, "192.0.2.1", "/", &headers).await.0);
    }
    assert_eq!(seen, [200, 200, 200, 429], "three per sid cookie");
    cookie = cookie.replace("sid=s1", "sid=s2");
    let headers = jar(&cookie, "b5");
    let headers: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, &v[..])).collect();
    assert_eq!(send(&layer, "192.0.2.1", "/", &headers).await.0, 200);
    // Four per (user parameter, address).
    let mut seen = Vec::new();
    for account in ["c1", "c2", "c3", "c4", "c5"] {
        let headers = [("x-account", account.as_bytes())];
        seen.push(
            send(&layer, "192.0.2.1", "/?user=zed&page=2", &headers)
                .await
                .0,
        );
    }
    assert_eq!(seen, [200, 200, 200, 200, 429]);
    let headers = [("x-account", &b"c6"[..])];
    assert_eq!(
        send(&layer, "192.0.2.2", "/?user=zed", &headers).await.0,
        200
    );
}

#[tokio::test]
async fn exempt_addresses_are_never_limited_and_denied_ones_are_refused_first() {
    let text = format!(
        "{HEAD}[access]\nexempt = [\"10.20.0.0/16\"]\ndeny = [\"203.0.113.0/24\", \"10.20.9.9\"]\n\n\
         [policies.tiny]\nalgorithm = \"fixed-window\"\nlimit = 1\nwindow = \"1h\"\n\n\
         [tiers.api]\npolicies = [\"tiny\"]\n"
    );
    let layer = layer(&text);
    assert_eq!(statuses(&layer, "10.20.1.1", "/", &[], 5).await, [200; 5]);
    let (status, body) = send(&layer, "203.0.113.7", "/", &[]).await;
    assert_eq!(status, 403);
    assert!(body.contains("\"forbidden\""), "{body}");
    // In both lists: denied.
    assert_eq!(send(&layer, "10.20.9.9", "/", &[]).await.0, 403);
    // Others are limited as before, and a denied address spent nothing of anyone's.
    assert_eq!(statuses(&layer, "192.0.2.1", "/", &[], 2).await, [200, 429]);
}

#[test]
fn bad_by_lists_and_access_lists_are_refused_with_line_and_field() {
    let policy = |extra: &str| {
        format!(
            "{HEAD}[policies.p]\nalgorithm = \"fixed-window\"\nlimit = 1\nwindow = \"1m\"\n{extra}\n\n\
             [tiers.api]\npolicies = [\"p\"]\n"
        )
    };
    let refused = |text: String, field: &str, reason: &str| {
        let error = GatewayConfig::from_toml_str(&text, "bad.toml").unwrap_err();
        assert_eq!(error.field, field, "{error}");
        assert!(error.reason.contains(reason), "{error}");
        assert!(error.line > 0, "{error}");
    };
    let many: Vec<String> = (0..10_000).map(|i| format!("\"header:x-{i}\"")).collect();
    refused(
        policy(&format!("by = [{}]", many.join(", "))),
        "policies.p.by",
        "at most 8",
    );
    refused(policy("by = [\"ip\", \"ip\"]"), "policies.p.by", "twice");
    refused(policy("by = [\"jwt\"]"), "policies.p.by", "not a part");
    refused(
        policy("by = [\"header:a b\"]"),
        "policies.p.by",
        "not a header name",
    );
    refused(
        policy("on_missing = \"skip\""),
        "policies.p.on_missing",
        "give `by`",
    );
    refused(
        format!("{HEAD}[access]\ndeny = [\"10.0.0.0/33\"]\n") + &policy("")[HEAD.len()..],
        "access.deny",
        "not an IP address",
    );
    refused(
        format!("{HEAD}[identity]\nipv6_prefix = 0\n") + &policy("")[HEAD.len()..],
        "identity.ipv6_prefix",
        "between 1 and 128",
    );
    // The mesh's configuration digest covers `by`: nodes that count by other parts do not
    // share keys unknowingly.
    let mesh = |by: &str| {
        GatewayConfig::from_toml_str(
            &format!(
                "{HEAD}[policies.p]\nalgorithm = \"fixed-window\"\nlimit = 1\nwindow = \"1m\"\n\
                 backend = \"mesh\"\n{by}\n\n[tiers.api]\npolicies = [\"p\"]\n"
            ),
            "mesh.toml",
        )
        .unwrap()
        .mesh_digest()
    };
    assert_ne!(mesh(""), mesh("by = [\"ip\"]"));
    assert_ne!(mesh("by = [\"ip\"]"), mesh("by = [\"api_key\"]"));
    assert_eq!(mesh("by = [\"ip\"]"), mesh("by = [\"ip\"]"));
}

#[tokio::test]
async fn routes_match_by_host_methods_path_template_glob_and_headers() {
    let text = format!(
        "{HEAD}[policies.per_client]\nalgorithm = \"fixed-window\"\nlimit = 100\nwindow = \"1m\"\n\n\
         [policies.orders]\nalgorithm = \"fixed-window\"\nlimit = 2\nwindow = \"1m\"\nby = [\"route\"]\n\n\
         [policies.assets]\nalgorithm = \"fixed-window\"\nlimit = 3\nwindow = \"1m\"\nby = [\"route\"]\n\n\
         [policies.beta]\nalgorithm = \"fixed-window\"\nlimit = 1\nwindow = \"1m\"\nby = [\"route\"]\n\n\
         [tiers.api]\npolicies = [\"per_client\"]\n\n\
         [[routes]]\nname = \"orders\"\nhost = \"*.example.com\"\nmethods = [\"POST\", \"PUT\"]\n\
         path = \"/users/{{id}}/orders\"\npolicies = [\"orders\"]\n\n\
         [[routes]]\nname = \"assets\"\npath_glob = \"/static/**/*.css\"\npolicies = [\"assets\"]\n\n\
         [[routes]]\nname = \"beta\"\npath_prefix = \"/\"\nheaders = {{ x-beta = \"1\", x-client = \"*\" }}\n\
         policies = [\"beta\"]\n"
    );
    let layer = layer(&text);
    let call = |method: &'static str,
                host: &'static str,
                path: &'static str,
                headers: Vec<(&'static str, &'static str)>| {
        let layer = layer.clone();
        async move {
            let mut service = tower::ServiceBuilder::new()
                .layer(layer)
                .service(tower::service_fn(|_request| async {
                    Ok::<_, std::convert::Infallible>(
                        http::Response::new(axum::body::Body::empty()),
                    )
                }));
            let mut request = http::Request::builder()
                .method(method)
                .uri(path)
                .header("host", host);
            for (name, value) in headers {
                request = request.header(name, value);
            }
            let mut request = request.body(axum::body::Body::empty()).unwrap();
            request
                .extensions_mut()
                .insert(ClientAddr("192.0.2.1:1000".parse().unwrap()));
            service
                .ready()
                .await
                .unwrap()
                .call(request)
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    // The orders route: a subdomain, POST or PUT, the template: 2 for all of them.
    let mut seen = Vec::new();
    for (method, host, path) in [
        ("POST", "api.example.com", "/users/1/orders"),
        ("PUT", "eu.api.example.com:8443", "/users/2/orders"),
        ("POST", "api.example.com", "/users/3/orders"),
    ] {
        seen.push(call(method, host, path, vec![]).await);
    }
    assert_eq!(seen, [200, 200, 429]);
    // Not the orders route (another host, method or path): only the tier's limit.
    for (method, host, path) in [
        ("POST", "example.org", "/users/1/orders"),
        ("GET", "api.example.com", "/users/1/orders"),
        ("POST", "api.example.com", "/users/1/orders/9"),
        ("POST", "example.com", "/users/1/orders"),
    ] {
        assert_eq!(
            call(method, host, path, vec![]).await,
            200,
            "{method} {host}{path}"
        );
    }
    // The glob: 3 stylesheets under /static, whatever the depth; scripts are not counted.
    let mut seen = Vec::new();
    for path in [
        "/static/a.css",
        "/static/x/b.css",
        "/static/x/y/c.css",
        "/static/d.css",
    ] {
        seen.push(call("GET", "h", path, vec![]).await);
    }
    assert_eq!(seen, [200, 200, 200, 429]);
    assert_eq!(call("GET", "h", "/static/x/app.js", vec![]).await, 200);
    // Headers: both present, x-beta equal to 1.
    assert_eq!(
        call("GET", "h", "/any", vec![("x-beta", "1"), ("x-client", "c")]).await,
        200
    );
    assert_eq!(
        call("GET", "h", "/any", vec![("x-beta", "1"), ("x-client", "d")]).await,
        429
    );
    assert_eq!(
        call("GET", "h", "/any", vec![("x-beta", "2"), ("x-client", "c")]).await,
        200
    );
    assert_eq!(call("GET", "h", "/any", vec![("x-beta", "1")]).await, 200);

    // Bad matchers are refused with their field.
    let route = |spec: &str| {
        format!(
            "{HEAD}[policies.p]\nalgorithm = \"fixed-window\"\nlimit = 1\nwindow = \"1m\"\n\n\
             [tiers.api]\npolicies = [\"p\"]\n\n[[routes]]\nname = \"r\"\n{spec}\n"
        )
    };
    for (spec, field) in [
        ("path = \"/a/{id}x\"", "routes.r.path"),
        ("path_glob = \"/a/b**\"", "routes.r.path_glob"),
        ("path = \"/a\"\npath_prefix = \"/a\"", "routes.r.path"),
        ("host = \"bad host\"", "routes.r.host"),
        ("headers = { \"bad header\" = \"1\" }", "routes.r.headers"),
        ("methods = [\"GET\", \"NOT A METHOD\"]", "routes.r.method"),
    ] {
        let error = GatewayConfig::from_toml_str(&route(spec), "bad.toml").unwrap_err();
        assert_eq!(error.field, field, "{spec}: {error}");
    }
}

#[tokio::test]
async fn failed_logins_are_counted_by_their_status_and_successes_are_given_back() {
    let text = format!(
        "{HEAD}[policies.per_client]\nalgorithm = \"fixed-window\"\nlimit = 100\nwindow = \"1m\"\n\n\
         [policies.failed_logins]\nalgorithm = \"fixed-window\"\nlimit = 3\nwindow = \"15m\"\n\
         by = [\"ip\"]\ncount_when = {{ status = [401, \"403-403\"] }}\n\n\
         [tiers.api]\npolicies = [\"per_client\"]\n\n\
         [[routes]]\nname = \"login\"\nmethod = \"POST\"\npath = \"/login\"\npolicies = [\"failed_logins\"]\n"
    );
    let layer = layer(&text);
    let attempt = |password: &'static str| {
        let layer = layer.clone();
        async move {
            let mut service = tower::ServiceBuilder::new()
                .layer(layer)
                .service(tower::service_fn(
                    |request: http::Request<axum::body::Body>| async move {
                        let ok = request
                            .headers()
                            .get("x-password")
                            .is_some_and(|p| p == "right");
                        let mut response = http::Response::new(axum::body::Body::empty());
                        if !ok {
                            *response.status_mut() = http::StatusCode::UNAUTHORIZED;
                        }
                        Ok::<_, std::convert::Infallible>(response)
                    },
                ));
            let mut request = http::Request::post("/login")
                .header("x-password", password)
                .body(axum::body::Body::empty())
                .unwrap();
            request
                .extensions_mut()
                .insert(ClientAddr("192.0.2.50:1000".parse().unwrap()));
            service
                .ready()
                .await
                .unwrap()
                .call(request)
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    // Successes cost nothing: ten of them leave the three failures.
    for _ in 0..10 {
        assert_eq!(attempt("right").await, 200);
    }
    assert_eq!(attempt("wrong").await, 401);
    assert_eq!(attempt("right").await, 200);
    assert_eq!(attempt("wrong").await, 401);
    assert_eq!(attempt("wrong").await, 401);
    // Three failures: the address is held back, even with the right password.
    assert_eq!(attempt("right").await, 429);
    assert_eq!(attempt("wrong").await, 429);

    // Counting by the response needs a policy that does not shape (a shaping policy
    // reserves a slot it never gives back).
    let bad = text.replace(
        "algorithm = \"fixed-window\"\nlimit = 3\nwindow = \"15m\"\n",
        "algorithm = \"leaky-bucket-shape\"\nrate = 3\nperiod = \"15m\"\nmax_wait = \"1s\"\n",
    );
    assert_ne!(bad, text);
    let error = GatewayConfig::from_toml_str(&bad, "bad.toml").unwrap_err();
    assert_eq!(error.field, "policies.failed_logins.count_when", "{error}");
    for (when, reason) in [
        ("{ status = [99] }", "not an HTTP status"),
        ("{ status = [\"500-400\"] }", "empty"),
        ("{ status = [] }", "at least one"),
        ("{ status = [\"5xx\"] }", "a range is written"),
    ] {
        let bad = text.replace("{ status = [401, \"403-403\"] }", when);
        let error = GatewayConfig::from_toml_str(&bad, "bad.toml").unwrap_err();
        assert_eq!(error.field, "policies.failed_logins.count_when", "{error}");
        assert!(error.reason.contains(reason), "{error}");
    }
}

#[tokio::test]
async fn a_lockout_holds_a_key_denied_for_its_time_with_a_retry_after_that_says_so() {
    let clock = Arc::new(ManualClock::new(T0));
    let text = format!(
        "{HEAD}[policies.failed_logins]\nalgorithm = \"fixed-window\"\nlimit = 2\nwindow = \"1m\"\n\
         by = [\"ip\"]\nblock_for = \"15m\"\n\n[tiers.api]\npolicies = [\"failed_logins\"]\n"
    );
    let config = GatewayConfig::from_toml_str(&text, "policies.toml").unwrap();
    let layer = RateLimitLayer::with_clock(config, clock.clone()).unwrap();
    let retry_after = |layer: RateLimitLayer, addr: &'static str| async move {
        let mut service = tower::ServiceBuilder::new()
            .layer(layer)
            .service(tower::service_fn(|_request| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
            }));
        let mut request = http::Request::get("/")
            .body(axum::body::Body::empty())
            .unwrap();
        request
            .extensions_mut()
            .insert(ClientAddr(format!("{addr}:1").parse().unwrap()));
        let response = service.ready().await.unwrap().call(request).await.unwrap();
        let after = response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
        (response.status().as_u16(), after)
    };
    assert_eq!(retry_after(layer.clone(), "192.0.2.1").await.0, 200);
    assert_eq!(retry_after(layer.clone(), "192.0.2.1").await.0, 200);
    // The third is denied and locks the address out for 15 minutes.
    assert_eq!(
        retry_after(layer.clone(), "192.0.2.1").await,
        (429, Some(900))
    );
    // Two minutes on, the window has turned, but the lockout holds.
    clock.advance(std::time::Duration::from_secs(120));
    assert_eq!(
        retry_after(layer.clone(), "192.0.2.1").await,
        (429, Some(780))
    );
    assert_eq!(
        retry_after(layer.clone(), "192.0.2.2").await.0,
        200,
        "others are not"
    );
    clock.advance(std::time::Duration::from_secs(781));
    assert_eq!(retry_after(layer.clone(), "192.0.2.1").await.0, 200);
    // A lockout needs a policy that can deny, without a token cache.
    let bad = text.replace("block_for", "shadow = true\nblock_for");
    let error = GatewayConfig::from_toml_str(&bad, "bad.toml").unwrap_err();
    assert!(error.reason.contains("never denies"), "{error}");
    let cached = format!(
        "{HEAD}[redis]\nurl = \"redis://127.0.0.1:1\"\n\n[policies.failed_logins]\n\
         algorithm = \"token-bucket\"\nrate = 2\nperiod = \"1m\"\nburst = 20\n\
         backend = \"redis\"\ntoken_cache = {{ batch = 5, ttl = \"1s\" }}\n\
         block_for = \"15m\"\n\n[tiers.api]\npolicies = [\"failed_logins\"]\n"
    );
    let error = GatewayConfig::from_toml_str(&cached, "bad.toml").unwrap_err();
    assert_eq!(error.field, "policies.failed_logins.block_for", "{error}");
    assert!(error.reason.contains("token cache"), "{error}");
    let in_redis = cached.replace("token_cache = { batch = 5, ttl = \"1s\" }\n", "");
    assert_ne!(in_redis, cached);
    GatewayConfig::from_toml_str(&in_redis, "ok.toml").unwrap();
    let bad = text.replace("\"15m\"", "\"30d\"");
    let error = GatewayConfig::from_toml_str(&bad, "bad.toml").unwrap_err();
    assert_eq!(error.field, "policies.failed_logins.block_for");
}
