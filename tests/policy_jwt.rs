//! Policies that count by a verified JWT claim (`by = ["jwt:sub"]`, `[jwt]`), through the
//! tower layer: tokens signed with an HMAC secret, an EC key (PEM) and a JWKS rotated on
//! disk; every kind of bad token is missing, never an identity.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use ratemesh::ManualClock;
use ratemesh::config::GatewayConfig;
use ratemesh::http::RateLimitLayer;
use tower::{Service, ServiceExt};

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef-test";

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn policies(jwt: &str) -> String {
    format!(
        "env = \"test\"\nkey_secret = \"s\"\ndefault_tier = \"api\"\n\n{jwt}\n\n\
         [policies.per_subject]\nalgorithm = \"fixed-window\"\nlimit = 2\nwindow = \"1h\"\n\
         by = [\"jwt:sub\"]\n\n[tiers.api]\npolicies = [\"per_subject\"]\n"
    )
}

fn layer_in(dir: &std::path::Path, text: &str) -> Result<RateLimitLayer, String> {
    let path = dir.join("policies.toml");
    std::fs::write(&path, text).unwrap();
    let config = GatewayConfig::from_file(&path).map_err(|e| e.to_string())?;
    let clock = Arc::new(ManualClock::new(1_700_000_000_000_000_000));
    RateLimitLayer::with_clock(config, clock).map_err(|e| e.to_string())
}

async fn status(layer: &RateLimitLayer, token: Option<&str>) -> (u16, String) {
    let mut service = tower::ServiceBuilder::new()
        .layer(layer.clone())
        .service(tower::service_fn(|_request| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::from("ok")))
        }));
    let mut request = http::Request::get("/");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let request = request.body(axum::body::Body::empty()).unwrap();
    let response = service.ready().await.unwrap().call(request).await.unwrap();
    let code = response.status().as_u16();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (code, String::from_utf8_lossy(&body).into_owned())
}

fn token(
    alg: Algorithm,
    kid: Option<&str>,
    key: &EncodingKey,
    claims: serde_json::Value,
) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_string);
    encode(&header, &claims, key).unwrap()
}

fn claims(sub: serde_json::Value) -> serde_json::Value {
    serde_json::json!({ "sub": sub, "exp": now_s() + 600 })
}

fn b64url(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().fold(0u32, |n, &b| (n << 8) | u32::from(b)) << (8 * (3 - chunk.len()));
        for i in 0..=chunk.len() {
            out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

#[tokio::test]
async fn an_hmac_subject_is_counted_across_its_requests_and_bad_tokens_are_never_identities() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hmac.secret"), [SECRET, b"\n"].concat()).unwrap();
    let layer = layer_in(
        dir.path(),
        &policies(
            "[jwt]\nalgorithms = [\"HS256\"]\nsecret_file = \"hmac.secret\"\nissuer = [\"id\"]",
        ),
    )
    .unwrap();
    let key = EncodingKey::from_secret(SECRET);
    let with_iss = |sub: serde_json::Value| serde_json::json!({ "sub": sub, "exp": now_s() + 600, "iss": "id" });
    let alice = token(Algorithm::HS256, None, &key, with_iss("alice".into()));
    let alice_again = token(Algorithm::HS256, None, &key, with_iss("alice".into()));
    assert_eq!(status(&layer, Some(&alice)).await.0, 200);
    assert_eq!(status(&layer, Some(&alice_again)).await.0, 200);
    assert_eq!(status(&layer, Some(&alice)).await.0, 429, "alice's 2 spent");
    let bob = token(Algorithm::HS256, None, &key, with_iss(42.into()));
    assert_eq!(status(&layer, Some(&bob)).await.0, 200, "a numeric subject");

    // Each of these is refused as a missing `jwt:sub` (400), never counted as a subject.
    let expired = token(
        Algorithm::HS256,
        None,
        &key,
        serde_json::json!({ "sub": "alice", "exp": now_s() - 3600, "iss": "id" }),
    );
    let no_exp = token(
        Algorithm::HS256,
        None,
        &key,
        serde_json::json!({ "sub": "carol", "iss": "id" }),
    );
    let wrong_issuer = token(Algorithm::HS256, None, &key, claims("carol".into()));
    let other_key = token(
        Algorithm::HS256,
        None,
        &EncodingKey::from_secret(b"another secret, also 32 bytes long!!"),
        with_iss("carol".into()),
    );
    let hs512 = token(Algorithm::HS512, None, &key, with_iss("carol".into()));
    // `alg: none`: the header and claims of a token, no signature.
    let none = format!(
        "{}.{}.",
        b64url(br#"{"alg":"none","typ":"JWT"}"#),
        b64url(with_iss("carol".into()).to_string().as_bytes())
    );
    let huge = format!("{}.{}.sig", b64url(b"{}"), "a".repeat(1 << 20));
    let mut tampered = alice.clone();
    tampered.insert(tampered.len() - 2, 'x');
    for bad in [
        expired.as_str(),
        &no_exp,
        &wrong_issuer,
        &other_key,
        &hs512,
        &none,
        &huge,
        &tampered,
        "not.a.jwt",
        "%%%.***.!!!",
    ] {
        let (code, body) = status(&layer, Some(bad)).await;
        assert_eq!(code, 400, "{bad}: {body}");
        assert!(body.contains("jwt:sub"), "{body}");
    }
    assert_eq!(status(&layer, None).await.0, 400, "no token at all");
    // Alice's count is still 2 of 2: none of the bad tokens spoke for her.
    assert_eq!(status(&layer, Some(&alice)).await.0, 429);
}

#[tokio::test]
async fn an_ec_public_key_verifies_es256_and_a_jwks_is_read_again_when_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    std::fs::write(dir.path().join("issuer.pem"), pair.public_key_pem()).unwrap();
    let signing = EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap();
    let layer = layer_in(
        dir.path(),
        &policies("[jwt]\nalgorithms = [\"ES256\"]\npublic_key_file = \"issuer.pem\""),
    )
    .unwrap();
    let dana = token(Algorithm::ES256, None, &signing, claims("dana".into()));
    assert_eq!(status(&layer, Some(&dana)).await.0, 200);
    // An HMAC token made with the public key's text as the secret: refused.
    let confused = token(
        Algorithm::HS256,
        None,
        &EncodingKey::from_secret(pair.public_key_pem().as_bytes()),
        claims("dana".into()),
    );
    assert_eq!(status(&layer, Some(&confused)).await.0, 400);

    // A JWKS: keys by kid, rotated on disk.
    let jwk = |kid: &str, pair: &rcgen::KeyPair| {
        let raw = pair.public_key_raw();
        serde_json::json!({
            "kty": "EC", "crv": "P-256", "kid": kid, "alg": "ES256", "use": "sig",
            "x": b64url(&raw[1..33]), "y": b64url(&raw[33..65]),
        })
    };
    let second = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let second_signing = EncodingKey::from_ec_pem(second.serialize_pem().as_bytes()).unwrap();
    let jwks = dir.path().join("jwks.json");
    std::fs::write(
        &jwks,
        serde_json::json!({ "keys": [jwk("a", &pair)] }).to_string(),
    )
    .unwrap();
    let layer = layer_in(
        dir.path(),
        &policies("[jwt]\nalgorithms = [\"ES256\"]\njwks_file = \"jwks.json\""),
    )
    .unwrap();
    let by_a = token(Algorithm::ES256, Some("a"), &signing, claims("erin".into()));
    let by_b = token(
        Algorithm::ES256,
        Some("b"),
        &second_signing,
        claims("erin".into()),
    );
    assert_eq!(status(&layer, Some(&by_a)).await.0, 200);
    assert_eq!(
        status(&layer, Some(&by_b)).await.0,
        400,
        "kid b unknown yet"
    );
    assert!(
        !layer.rules().refresh_keys().unwrap(),
        "the file did not change"
    );
    // The provider adds key b; the file is read again on its change.
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(
        &jwks,
        serde_json::json!({ "keys": [jwk("a", &pair), jwk("b", &second)] }).to_string(),
    )
    .unwrap();
    assert!(layer.rules().refresh_keys().unwrap());
    assert_eq!(
        status(&layer, Some(&by_b)).await.0,
        200,
        "erin's second of 2"
    );
    assert_eq!(
        status(&layer, Some(&by_a)).await.0,
        429,
        "one subject, whichever key"
    );
    // A broken file keeps the keys in force.
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(&jwks, "{ not json").unwrap();
    assert!(layer.rules().refresh_keys().is_err());
    let frank = token(
        Algorithm::ES256,
        Some("b"),
        &second_signing,
        claims("frank".into()),
    );
    assert_eq!(status(&layer, Some(&frank)).await.0, 200);
}

#[test]
fn bad_jwt_sections_are_refused_with_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("short.secret"), b"too short").unwrap();
    std::fs::write(
        dir.path().join("junk.pem"),
        b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
    )
    .unwrap();
    let refused = |jwt: &str, field: &str, reason: &str| {
        let error = layer_in(dir.path(), &policies(jwt)).err().unwrap();
        assert!(error.contains(field), "{error}");
        assert!(error.contains(reason), "{error}");
    };
    refused(
        "[jwt]\nalgorithms = [\"none\"]\nsecret_file = \"short.secret\"",
        "jwt.algorithms",
        "never `none`",
    );
    refused(
        "[jwt]\nalgorithms = [\"HS256\", \"RS256\"]\nsecret_file = \"short.secret\"",
        "jwt.algorithms",
        "one kind",
    );
    refused(
        "[jwt]\nalgorithms = [\"HS256\"]\nsecret_file = \"short.secret\"",
        "jwt.secret_file",
        "at least 32 bytes",
    );
    refused(
        "[jwt]\nalgorithms = [\"RS256\"]\nsecret_file = \"short.secret\"",
        "jwt.secret_file",
        "goes with HS",
    );
    refused(
        "[jwt]\nalgorithms = [\"ES256\"]\npublic_key_file = \"junk.pem\"",
        "jwt.public_key_file",
        "not a PEM public key",
    );
    refused(
        "[jwt]\nalgorithms = [\"ES256\"]\npublic_key_file = \"missing.pem\"",
        "jwt.public_key_file",
        "missing.pem",
    );
    refused(
        "[jwt]\nalgorithms = [\"ES256\"]",
        "jwt.jwks_file",
        "exactly one",
    );
    refused(
        "[jwt]\nalgorithms = [\"ES256\"]\njwks_file = \"j\"\nleeway = \"1h\"",
        "jwt.leeway",
        "at most",
    );
    // A claim to count by needs `[jwt]`.
    refused("", "policies.per_subject.by", "add a `[jwt]` section");
}
