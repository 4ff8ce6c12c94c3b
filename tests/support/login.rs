//! A login service for the tests that count failed logins: 200 for the password "right",
//! else 401; and a login attempt through a node.

/// The service behind the login route.
pub fn login_service() -> axum::Router {
    axum::Router::new().route(
        "/login",
        axum::routing::post(|body: String| async move {
            let login: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            if login["password"] == "right" {
                http::StatusCode::OK
            } else {
                http::StatusCode::UNAUTHORIZED
            }
        }),
    )
}

/// [`login_service`] on a loopback port of its own.
pub async fn password_checker() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = login_service();
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, server)
}

/// A login's JSON body.
pub fn body(user: &str, password: &str) -> String {
    format!(r#"{{"username":"{user}","password":"{password}"}}"#)
}

/// The status and `Retry-After` of a login attempt through `node` from address `from`.
pub async fn attempt(
    client: &reqwest::Client,
    node: &super::NodeProcess,
    from: &str,
    user: &str,
    password: &str,
) -> (u16, Option<u64>) {
    let response = client
        .post(format!("http://{}/login", node.http))
        .header("content-type", "application/json")
        .header("x-forwarded-for", from)
        .body(body(user, password))
        .send()
        .await
        .unwrap();
    let retry = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
    (response.status().as_u16(), retry)
}
